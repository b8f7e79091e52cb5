# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Kubernetes access for the GPUClass modules, through the official ``kubernetes`` client.

The connection options are kubernetes.core's own (its ``AUTH_ARG_SPEC``, documented in this
collection's ``k8s_auth`` fragment, the ``K8S_AUTH_*`` variables read by its client set-up), so a
play passes the same values to both collections; the collection depends on kubernetes.core
for its roles anyway. The GPUClass work itself (create, replace, delete, each optionally as
a server-side dry run) lives in :class:`GpuClassApi` and :func:`ensure_class`, apart from
AnsibleModule, so the integration tests drive it against a real API server.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ansible_collections.kubernetes.core.plugins.module_utils.args_common import (  # type: ignore[import-untyped]
    AUTH_ARG_SPEC,
)
from ansible_collections.kubernetes.core.plugins.module_utils.k8s.client import (  # type: ignore[import-untyped]
    get_api_client,
)

if TYPE_CHECKING:
    import gpu_class_rules
    import gpu_keys
else:
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_class_rules, gpu_keys

try:
    import kubernetes
    from kubernetes.client.exceptions import ApiException
    from kubernetes.utils import parse_quantity

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
    "advertisement_warnings",
    "advertising_nodes",
    "api_error_message",
    "ensure_class",
    "make_api_client",
    "spec_diff_view",
]


def make_api_client(params: Mapping[str, Any]) -> Any:
    """The ``ApiClient`` kubernetes.core configures from its connection options.

    ``params`` holds the options of ``AUTH_ARG_SPEC`` (unset ones fall back to their
    ``K8S_AUTH_*`` variables, then to the kubeconfig or the in-cluster service account,
    exactly as in kubernetes.core's modules). Its dynamic client is only the carrier: the
    GPUClass calls go through ``CustomObjectsApi`` on the same ``ApiClient``, which holds the
    configuration and the impersonation headers.
    """
    options = {name: params.get(name) for name in AUTH_ARG_SPEC}
    return get_api_client(**options).client.client


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
        self.core: Any = kubernetes.client.CoreV1Api(api_client)
        self.where = (gpu_keys.GROUP, gpu_keys.VERSION, gpu_keys.PLURAL_CLASSES)

    def node_allocatable(self) -> dict[str, dict[str, str]]:
        """Each Node's ``status.allocatable``, by Node name."""
        nodes = self.core.list_node().items
        return {n.metadata.name: dict((n.status and n.status.allocatable) or {}) for n in nodes}

    def device_class_exists(self, name: str) -> bool:
        """Whether the DeviceClass (``resource.k8s.io/v1``) exists."""
        try:
            self.api.get_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses", name)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

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


def advertising_nodes(
    allocatable: Mapping[str, Mapping[str, str]], resource_name: str
) -> list[str]:
    """Nodes whose ``status.allocatable`` offers at least one ``resource_name``, sorted."""
    return sorted(
        node
        for node, offered in allocatable.items()
        if parse_quantity(offered.get(resource_name) or "0") > 0
    )


def advertisement_warnings(api: GpuClassApi, spec: Mapping[str, Any] | None) -> list[str]:
    """A warning when no Node advertises the class's resource name, or when that is unknown.

    A resource name written into a class is a prediction (from ``gpu_facts``, the node
    labels or a README); what kubelet advertises is what claims can be placed on. The
    classic mismatch: the device plugin names passthrough GPUs from the pci.ids in its own
    image, which may name a device differently from the pci.ids the prediction used.
    """
    name = gpu_class_rules.resource_name_of(spec)
    if name is None:
        return _device_class_warnings(api, gpu_class_rules.dra_device_class_of(spec))
    try:
        allocatable = api.node_allocatable()
    except ApiException as exc:
        return [f"could not check whether a Node advertises {name}: {api_error_message(exc)}"]
    if advertising_nodes(allocatable, name):
        return []
    return [
        f"no Node advertises {name} in status.allocatable ({len(allocatable)} Nodes read), so"
        " no claim of this class can be placed yet. Passthrough names come from the pci.ids"
        " in the device plugin's image, which may name the GPU otherwise than the pci.ids"
        " a prediction used (gpu_facts reports its pci_ids_version); compare with"
        " kubectl get node <node> -o jsonpath='{.status.allocatable}'"
    ]


def _device_class_warnings(api: GpuClassApi, device_class: str | None) -> list[str]:
    """A warning when a ``dra`` class's DeviceClass does not exist (its DRA driver installs
    it), or when that is unknown."""
    if device_class is None:
        return []
    try:
        if api.device_class_exists(device_class):
            return []
    except ApiException as exc:
        return [
            f"could not check whether DeviceClass {device_class} exists: {api_error_message(exc)}"
        ]
    return [
        f"DeviceClass {device_class} does not exist, so no claim of this class can be placed "
        "yet: it is installed with the DRA driver that serves the class's GPUs (NVIDIA's "
        "installs vfio.gpu.nvidia.com with its PassthroughSupport feature)"
    ]


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
