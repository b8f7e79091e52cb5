# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Kubernetes access for the GPUClass modules, through the official ``kubernetes`` client.

Connection options mirror kubernetes.core's (same names and ``K8S_AUTH_*`` environment
fallbacks) so a play can pass the same values to both collections. The GPUClass work itself
(create, replace, delete, each optionally as a server-side dry run) lives in
:class:`GpuClassApi` and :func:`ensure_class`, apart from AnsibleModule, so the integration
tests drive it against a real API server.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ansible.module_utils.basic import env_fallback  # type: ignore[import-untyped]

if TYPE_CHECKING:
    import gpu_keys
else:
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_keys

try:
    import kubernetes
    from kubernetes.client.exceptions import ApiException

    HAS_KUBERNETES = True
    KUBERNETES_IMPORT_ERROR: str | None = None
except ImportError:  # reported by the modules through missing_required_lib
    HAS_KUBERNETES = False
    KUBERNETES_IMPORT_ERROR = traceback.format_exc()

    class ApiException(Exception):  # type: ignore[no-redef]
        """Stand-in so ``except ApiException`` stays valid without the client."""

        status = 0
        body: str | None = None
        reason: str | None = None


__all__ = [
    "AUTH_ARG_SPEC",
    "HAS_KUBERNETES",
    "KUBERNETES_IMPORT_ERROR",
    "ApiException",
    "ClassRuleError",
    "GpuClassApi",
    "api_error_message",
    "ensure_class",
    "make_api_client",
    "spec_diff_view",
]


def _env(*names: str) -> tuple[Callable[..., Any], list[str]]:
    return env_fallback, list(names)


AUTH_ARG_SPEC: dict[str, dict[str, Any]] = {
    "kubeconfig": {"type": "path", "fallback": _env("K8S_AUTH_KUBECONFIG")},
    "context": {"type": "str", "fallback": _env("K8S_AUTH_CONTEXT")},
    "host": {"type": "str", "fallback": _env("K8S_AUTH_HOST")},
    "api_key": {"type": "str", "no_log": True, "fallback": _env("K8S_AUTH_API_KEY")},
    "validate_certs": {
        "type": "bool",
        "aliases": ["verify_ssl"],
        "fallback": _env("K8S_AUTH_VERIFY_SSL"),
    },
    "ca_cert": {
        "type": "path",
        "aliases": ["ssl_ca_cert"],
        "fallback": _env("K8S_AUTH_SSL_CA_CERT"),
    },
    "client_cert": {
        "type": "path",
        "aliases": ["cert_file"],
        "fallback": _env("K8S_AUTH_CERT_FILE"),
    },
    "client_key": {
        "type": "path",
        "aliases": ["key_file"],
        "fallback": _env("K8S_AUTH_KEY_FILE"),
    },
}


def make_api_client(params: Mapping[str, Any]) -> Any:
    """An ``ApiClient`` from kubeconfig/context, overridden by host, key and certificates.

    Without a kubeconfig file, host or token the default kubeconfig is tried, then the
    in-cluster service account.
    """
    config = kubernetes.client.Configuration()
    loader: Any = kubernetes.config  # its loaders carry no type hints
    explicit = params.get("kubeconfig") or params.get("context")
    if explicit or not params.get("host"):
        try:
            loader.load_kube_config(
                config_file=params.get("kubeconfig"),
                context=params.get("context"),
                client_configuration=config,
            )
        except (loader.ConfigException, OSError, TypeError):
            if explicit:
                raise
            loader.load_incluster_config(client_configuration=config)
    if params.get("host"):
        config.host = params["host"]
    if params.get("api_key"):
        config.api_key = {"BearerToken": "Bearer " + params["api_key"]}
        # The kubeconfig loader's refresh hook would put the kubeconfig's token back.
        config.refresh_api_key_hook = None
    if params.get("validate_certs") is not None:
        config.verify_ssl = params["validate_certs"]
    if params.get("ca_cert"):
        config.ssl_ca_cert = params["ca_cert"]
    if params.get("client_cert"):
        config.cert_file = params["client_cert"]
    if params.get("client_key"):
        config.key_file = params["client_key"]
    return kubernetes.client.ApiClient(configuration=config)


def api_error_message(exc: Exception) -> str:
    """The API server's own message (a CRD's CEL message included), verbatim."""
    body = getattr(exc, "body", None)
    if body:
        try:
            status = json.loads(body)
        except (TypeError, ValueError):
            return str(body)
        if isinstance(status, dict) and status.get("message"):
            return str(status["message"])
    reason = getattr(exc, "reason", None)
    code = getattr(exc, "status", None)
    return f"{code} {reason}" if reason else str(exc)


class GpuClassApi:
    """GPUClass objects (cluster-scoped) as plain dicts."""

    def __init__(self, api_client: Any) -> None:
        self.api: Any = kubernetes.client.CustomObjectsApi(api_client)
        self.where = (gpu_keys.GROUP, gpu_keys.VERSION, gpu_keys.PLURAL_CLASSES)

    @staticmethod
    def _dry(dry_run: bool) -> str | None:
        return "All" if dry_run else None

    def get(self, name: str) -> dict[str, Any] | None:
        try:
            return dict(self.api.get_cluster_custom_object(*self.where, name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        result = self.api.list_cluster_custom_object(*self.where, label_selector=label_selector)
        items: list[dict[str, Any]] = list(result.get("items", []))
        return sorted(items, key=lambda o: str(o["metadata"]["name"]))

    def create(self, body: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        return dict(
            self.api.create_cluster_custom_object(*self.where, body, dry_run=self._dry(dry_run))
        )

    def replace(self, name: str, body: dict[str, Any], dry_run: bool) -> dict[str, Any]:
        return dict(
            self.api.replace_cluster_custom_object(
                *self.where, name, body, dry_run=self._dry(dry_run)
            )
        )

    def delete(self, name: str, dry_run: bool) -> None:
        self.api.delete_cluster_custom_object(*self.where, name, dry_run=self._dry(dry_run))


def spec_diff_view(obj: Mapping[str, Any] | None) -> dict[str, Any]:
    """The parts of a GPUClass a caller manages: name, labels, annotations and spec.

    resourceVersion, generation, managedFields and the rest of the metadata the server
    rewrites on every change are left out, so neither diffs nor idempotence see that churn.
    """
    if not obj:
        return {}
    metadata = obj.get("metadata") or {}
    view: dict[str, Any] = {"name": metadata.get("name")}
    for key in ("labels", "annotations"):
        if metadata.get(key):
            view[key] = dict(metadata[key])
    view["spec"] = obj.get("spec") or {}
    return view


def _desired_body(
    name: str,
    spec: Mapping[str, Any],
    labels: Mapping[str, str] | None,
    annotations: Mapping[str, str] | None,
    existing: Mapping[str, Any] | None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if existing is not None:
        old = existing.get("metadata") or {}
        metadata = {k: v for k, v in old.items() if k not in ("managedFields",)}
        # Labels and annotations given are enforced; others (added by tools) are kept.
        metadata["labels"] = {**(old.get("labels") or {}), **(labels or {})}
        metadata["annotations"] = {**(old.get("annotations") or {}), **(annotations or {})}
    else:
        if labels:
            metadata["labels"] = dict(labels)
        if annotations:
            metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": gpu_keys.API_VERSION,
        "kind": gpu_keys.KIND_CLASS,
        "metadata": metadata,
        "spec": dict(spec),
    }


class ClassRuleError(Exception):
    """The desired class breaks a rule across classes (see gpu_class_rules)."""


def ensure_class(
    api: GpuClassApi,
    name: str,
    state: str,
    spec: Mapping[str, Any] | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    check_mode: bool = False,
    check_conflicts: Callable[[str, Mapping[str, Any], list[dict[str, Any]]], list[str]]
    | None = None,
) -> dict[str, Any]:
    """Bring one GPUClass to ``state``; the Ansible result (changed, result, diff).

    Check mode sends the same request as a server-side dry run, so the CRD's schema and CEL
    rules judge it exactly as they would for real and nothing is stored. An update is first
    sent as a dry run too: the object the server would store, defaults applied, is compared
    with the stored one, so a spec that only omits defaulted fields is not a change.
    ``ApiException`` propagates; :func:`api_error_message` gives its verbatim message.
    """
    existing = api.get(name)
    before = spec_diff_view(existing)
    if state == "absent":
        if existing is None:
            return {"changed": False, "result": {}, "diff": {"before": {}, "after": {}}}
        api.delete(name, dry_run=check_mode)
        return {"changed": True, "result": {}, "diff": {"before": before, "after": {}}}

    if spec is None:
        raise ValueError("state present needs a spec")
    if check_conflicts is not None:
        problems = check_conflicts(name, spec, api.list())
        if problems:
            raise ClassRuleError("; ".join(problems))
    body = _desired_body(name, spec, labels, annotations, existing)
    if existing is None:
        created = api.create(body, dry_run=check_mode)
        return {
            "changed": True,
            "result": created,
            "diff": {"before": {}, "after": spec_diff_view(created)},
        }
    preview = api.replace(name, body, dry_run=True)
    after = spec_diff_view(preview)
    if after == before:
        return {"changed": False, "result": existing, "diff": {"before": before, "after": after}}
    stored = preview if check_mode else api.replace(name, body, dry_run=False)
    return {
        "changed": True,
        "result": stored,
        "diff": {"before": before, "after": spec_diff_view(stored)},
    }
