"""The plugin's one door to the API: kubeconfig, impersonation and reads as plain JSON.

A read the user is not allowed (403) answers None, so callers say less instead of failing;
a kind the cluster does not serve (404 on a list: KubeVirt or the Workload CRD absent)
lists as empty. Every other API failure raises ``CliError`` with one line naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3 import HTTPHeaderDict

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj

EVENT = keys.ApiKind("Event", "", "v1", "events", True)


class CliError(Exception):
    """An error the plugin reports in one line and exits 1 for."""


def _server_message(exc: ApiException) -> str:
    try:
        body = json.loads(exc.body or "{}")
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return str(message or exc.reason or exc.status).replace("\n", " ")


class Session:
    """One user's connection: the kubeconfig's context (or ``context``), as ``as_user``
    and ``as_groups`` when given (kubectl's --as and --as-group: the API server judges
    that user's rights)."""

    def __init__(
        self,
        kubeconfig: str | None = None,
        context: str | None = None,
        as_user: str | None = None,
        as_groups: Sequence[str] = (),
    ) -> None:
        configuration = client.Configuration()
        try:
            kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
            contexts, active = kube_config.list_kube_config_contexts(config_file=kubeconfig)
        except (ConfigException, OSError, TypeError) as exc:
            raise CliError(f"kubeconfig: {exc}") from exc
        chosen = (
            next((c for c in contexts if c.get("name") == context), None) if context else active
        )
        self.default_namespace = str(
            ((chosen or {}).get("context") or {}).get("namespace") or "default"
        )
        self.server = configuration.host
        self.api = client.ApiClient(configuration)
        self.api.user_agent = "kubectl-gpu"
        if as_user:
            self.api.set_default_header("Impersonate-User", as_user)
        # kubectl sends one Impersonate-Group header per --as-group, and the API server
        # reads each header value as one group (a comma is part of its name): joined in
        # one header, "a" and "b" would be the single group "a,b".
        self._as_groups = tuple(as_groups)

    def _path(self, kind: keys.ApiKind, namespace: str | None, name: str | None) -> str:
        base = f"/apis/{kind.group}/{kind.version}" if kind.group else f"/api/{kind.version}"
        if kind.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{kind.plural}"
        return base + (f"/{name}" if name else "")

    def _get(self, path: str, query: Sequence[tuple[str, str]] = ()) -> MutableObj:
        method, url, headers, body, post = self.api.param_serialize(
            "GET",
            path,
            query_params=list(query),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        sent = HTTPHeaderDict(headers)
        for group in self._as_groups:
            sent.add("Impersonate-Group", group)
        try:
            response = self.api.call_api(method, url, sent, body, post)
            response.read()
        except ApiException:
            raise
        except Exception as exc:  # urllib3's connection errors, TLS
            raise CliError(f"cannot reach the API server at {self.server}: {exc}") from exc
        if not 200 <= response.status < 300:
            raise ApiException(
                status=response.status, reason=response.reason, body=response.data.decode()
            )
        return dict(json.loads(response.data or b"{}"))

    def get(self, kind: keys.ApiKind, name: str, namespace: str | None = None) -> MutableObj | None:
        """The object, or None when it does not exist or the user may not read it."""
        try:
            return self._get(self._path(kind, namespace, name))
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise CliError(_server_message(exc)) from exc

    def get_required(self, kind: keys.ApiKind, name: str, namespace: str | None) -> MutableObj:
        """The object, or ``CliError`` naming why it cannot be had (not found, forbidden)."""
        try:
            return self._get(self._path(kind, namespace, name))
        except ApiException as exc:
            if exc.status == 404:
                where = f' in namespace "{namespace}"' if namespace else ""
                raise CliError(
                    f'{kind.plural}.{kind.group or "core"} "{name}" not found{where}'
                ) from exc
            raise CliError(_server_message(exc)) from exc

    def list_of(
        self, kind: keys.ApiKind, namespace: str | None = None, field_selector: str = ""
    ) -> list[MutableObj] | None:
        """Every object of the kind (in ``namespace``, or in all); None when forbidden."""
        query = [("fieldSelector", field_selector)] if field_selector else []
        try:
            items = self._get(self._path(kind, namespace, None), query).get("items") or []
        except ApiException as exc:
            if exc.status == 403:
                return None
            if exc.status == 404:
                return []
            raise CliError(_server_message(exc)) from exc
        return [dict(i) for i in items]

    def listing(self, optional: Sequence[keys.ApiKind] = ()) -> dict[str, list[MutableObj]] | None:
        """Everything the binder watches, cluster-wide; None unless the user may list it all
        (a hoster). A kind of ``optional`` the user may not list is left out of it instead,
        so the caller can say what it could not count."""
        out: dict[str, list[MutableObj]] = {}
        for kind in keys.MODEL_KINDS:
            items = self.list_of(kind)
            if items is None:
                if kind in optional:
                    continue
                return None
            out[kind.kind] = items
        # dra classes' devices, where the API serves them (an empty list where it does not)
        # and the user may read them; without them a dra class counts no unit.
        for kind in keys.DRA_WATCHES:
            items = self.list_of(kind)
            if items:
                out[kind.kind] = items
        return out
