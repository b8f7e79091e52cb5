"""The webhooks' reads and writes against the API server itself, never a cache.

A VMI start decides who holds a GPU: it must see the claim as it is now, and write its
attachment with the resourceVersion it read, so two VMIs racing for one claim cannot both
win. Objects stay plain dicts (the API's JSON, ``_preload_content=False``): the client's
typed models are slow to build and drop the fields of custom resources.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj

# (connect, read) seconds of one request; the API server gives a webhook 10 s in all.
REQUEST_TIMEOUT_S = (2.0, 4.0)


def _json(response: Any) -> MutableObj:
    body: MutableObj = json.loads(response.data)
    return body


def meta_of(obj: MutableObj) -> MutableObj:
    return dict(obj.get("metadata") or {})


def _missing(exc: ApiException) -> bool:
    return bool(exc.status == 404)


class ApiAccess:
    """Reads and writes of the admission webhooks."""

    def __init__(self, api: client.ApiClient, settings_namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.settings_namespace = settings_namespace

    # --- reads -----------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> MutableObj | None:
        return self.get(keys.GPU_CLAIM, namespace, name)

    def classes(self, *, latest: bool = False) -> dict[str, MutableObj]:
        """Every GPUClass by name (a hoster offers a handful; one list is one request).

        By default the API server answers from its watch cache (resourceVersion "0"): a
        list "as of now" makes it wait until that cache has seen the latest write to any
        object, which with claims being written costs tens of milliseconds a call (measured:
        84 ms median beside VMI starts, against 2 ms from the cache). Classes change
        rarely, and the cache trails etcd by milliseconds. ``latest`` asks for the list as
        of now (the class webhook, which judges a class against one applied just before).
        """
        listing = _json(
            self.custom.list_cluster_custom_object(
                keys.GROUP,
                keys.VERSION,
                keys.PLURAL_CLASSES,
                resource_version=None if latest else "0",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )
        return {str(obj["metadata"]["name"]): obj for obj in listing.get("items") or []}

    def _config_map(self, name: str) -> MutableObj | None:
        """A ConfigMap of the controller's namespace as it is now, or None."""
        try:
            return _json(
                self.core.read_namespaced_config_map(
                    name,
                    self.settings_namespace,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

    def namespace_labels(self, name: str) -> dict[str, str]:
        try:
            ns = _json(
                self.core.read_namespace(
                    name, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
        except ApiException as exc:
            if _missing(exc):
                return {}
            raise
        return dict((ns.get("metadata") or {}).get("labels") or {})

    def secret(self, namespace: str, name: str) -> MutableObj | None:
        """A Secret as it is now (a licence copy, or the hoster's token Secret it must
        match), or None. Judged and dropped: the webhook keeps no Secret."""
        try:
            return _json(
                self.core.read_namespaced_secret(
                    name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise

    def get(self, kind: keys.ApiKind, namespace: str, name: str) -> MutableObj | None:
        """One custom object as it is now (``namespace`` is ignored for a cluster-scoped
        kind); None when there is none."""
        try:
            if kind.namespaced:
                response = self.custom.get_namespaced_custom_object(
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    name,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            else:
                response = self.custom.get_cluster_custom_object(
                    kind.group,
                    kind.version,
                    kind.plural,
                    name,
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
        except ApiException as exc:
            if _missing(exc):
                return None
            raise
        return _json(response)

    def nad_resource(self, namespace: str, name: str) -> str | None:
        """The resource a NetworkAttachmentDefinition names (``keys.ANNOTATION_NAD_RESOURCE``;
        "" when it names none), or None when it cannot be read (absent, Multus not
        installed, no right, a slow API server): then the gate judges the launcher pod's
        requests, so the start is not refused for a read."""
        try:
            nad = self.get(keys.NAD, namespace, name)
        except (ApiException, HTTPError, OSError):
            return None
        if nad is None:
            return None
        return str((meta_of(nad).get("annotations") or {}).get(keys.ANNOTATION_NAD_RESOURCE, ""))

    def vmi(self, namespace: str, name: str) -> MutableObj | None:
        return self.get(keys.VMI, namespace, name)

    # --- the record of classes admitted ----------------------------------------------

    def class_admissions(self) -> tuple[dict[str, str], str | None]:
        """The data of the class admissions ConfigMap and its resourceVersion (None: there
        is none yet)."""
        cm = self._config_map(keys.CLASS_ADMISSIONS_CONFIGMAP)
        if cm is None:
            return {}, None
        return dict(cm.get("data") or {}), str(cm["metadata"]["resourceVersion"])

    def write_class_admissions(self, data: dict[str, str], version: str | None) -> None:
        """Create the ConfigMap (``version`` None) or replace it as of ``version``: another
        admission written meanwhile answers 409, as a create that lost answers 409."""
        metadata: dict[str, str] = {"name": keys.CLASS_ADMISSIONS_CONFIGMAP}
        body: MutableObj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": data,
        }
        if version is None:
            self.core.create_namespaced_config_map(
                self.settings_namespace, body, _request_timeout=REQUEST_TIMEOUT_S
            )
            return
        metadata["resourceVersion"] = version
        self.core.replace_namespaced_config_map(
            keys.CLASS_ADMISSIONS_CONFIGMAP,
            self.settings_namespace,
            body,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
