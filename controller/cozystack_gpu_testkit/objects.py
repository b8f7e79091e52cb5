"""Builders and writers of the API objects tests and benchmarks need, through the real API.

There is no kubelet, scheduler or virt-controller: these helpers write Node, Pod and VMI
status as those would.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.config import Config
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu_testkit import cluster

KUBEVIRT_CRDS = sorted((Path(__file__).parent / "kubevirt-crds").glob("*.yaml"))
WORKLOAD_CRD = cluster.CRD_DIR / "extra" / "workloads.yaml"


def install_extra_crds(api: Any) -> None:
    """Workload (usage records) and minimal KubeVirt VMI/VM CRDs."""
    cluster.install_crds(api, [WORKLOAD_CRD, *KUBEVIRT_CRDS])


@dataclass
class Kube:
    """Thin writers over the admin client."""

    api: Any

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    # --- nodes ---------------------------------------------------------------------------

    def node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, int] | None = None,
        ready: bool = True,
        taints: list[dict[str, str]] | None = None,
        unschedulable: bool = False,
    ) -> None:
        body = {
            "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": {"taints": taints or [], "unschedulable": unschedulable},
        }
        self.core.create_node(body)
        self.node_status(name, allocatable=allocatable or {}, ready=ready)

    def node_status(
        self, name: str, *, allocatable: Mapping[str, int] | None = None, ready: bool | None = None
    ) -> None:
        status: dict[str, Any] = {}
        if allocatable is not None:
            alloc = {"cpu": "64", "memory": "512Gi", "pods": "110"}
            alloc.update({k: str(v) for k, v in allocatable.items()})
            status["allocatable"] = alloc
            status["capacity"] = alloc
        if ready is not None:
            status["conditions"] = [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                    "message": "set by the test as kubelet would",
                    "lastHeartbeatTime": _now(),
                    "lastTransitionTime": _now(),
                }
            ]
        self.core.patch_node_status(name, {"status": status})

    def cordon(self, name: str, cordoned: bool = True) -> None:
        self.core.patch_node(name, {"spec": {"unschedulable": cordoned}})

    def gpunode(self, name: str, devices: list[dict[str, Any]]) -> None:
        """A GPUNode as the node agent would write it: ``devices`` entries need at least
        pciAddress, resourceName and allocatable."""
        node = self.core.read_node(name)
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_NODE,
            "metadata": {
                "name": name,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}
                ],
            },
        }
        try:
            self.custom.create_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        names = sorted({d["resourceName"] for d in devices if d.get("resourceName")})
        self.custom.patch_cluster_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            keys.PLURAL_NODES,
            name,
            {"status": {"devices": devices, "resourceNames": names, "updatedAt": _now()}},
        )

    def gpu_node(
        self,
        name: str,
        resource: str,
        gpus: int,
        *,
        labels: Mapping[str, str] | None = None,
        ready: bool = True,
        taints: list[dict[str, str]] | None = None,
    ) -> None:
        """A Ready Node with ``gpus`` functions of one resource name and its GPUNode."""
        self.node(name, labels=labels, allocatable={resource: gpus}, ready=ready, taints=taints)
        self.gpunode(
            name,
            [
                {
                    "pciAddress": f"0000:{0x10 + i:02x}:00.0",
                    "resourceName": resource,
                    "allocatable": 1,
                }
                for i in range(gpus)
            ],
        )

    # --- classes and claims --------------------------------------------------------------

    def gpu_class(
        self,
        name: str,
        resource: str,
        *,
        mode: str = "passthrough",
        selector: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        body_spec: dict[str, Any] = {
            "vendor": "nvidia",
            "model": spec.pop("model", "H100"),
            "mode": mode,
            "source": {"devicePlugin": {"resourceName": resource}},
            "nodeSelector": dict(selector or {}),
        }
        if mode == "vgpu":
            body_spec["profile"] = spec.pop("profile", "L40S-24C")
        body_spec.update(spec)
        result: dict[str, Any] = self.custom.create_cluster_custom_object(
            keys.GROUP,
            keys.VERSION,
            keys.PLURAL_CLASSES,
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_CLASS,
                "metadata": {"name": name},
                "spec": body_spec,
            },
        )
        return result

    def claim(
        self,
        namespace: str,
        name: str,
        gpu_class: str,
        count: int = 1,
        labels: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_CLAIMS,
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_CLAIM,
                "metadata": {"name": name, "labels": dict(labels or {})},
                "spec": {"class": gpu_class, "count": count},
            },
        )
        return result

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, name
        )
        return result

    def claims(self, namespace: str) -> list[dict[str, Any]]:
        result = self.custom.list_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS
        )
        return list(result["items"])

    def attach(self, namespace: str, claim: str, vmi: str) -> None:
        """Record an attachment as the VMI webhook does."""
        self.custom.patch_namespaced_custom_object_status(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_CLAIMS,
            claim,
            {"status": {"attachedTo": vmi, "attachedAt": _now()}},
        )

    # --- tenants -------------------------------------------------------------------------

    def namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})

    def quota(self, namespace: str, hard: Mapping[str, int]) -> None:
        self.core.create_namespaced_resource_quota(
            namespace,
            {"metadata": {"name": "gpu"}, "spec": {"hard": {k: str(v) for k, v in hard.items()}}},
        )

    # --- VMIs ----------------------------------------------------------------------------

    def vmi(
        self,
        namespace: str,
        name: str,
        *,
        claims: list[str] | None = None,
        phase: str = "Running",
        node: str | None = None,
    ) -> None:
        import json

        annotations = {}
        if claims is not None:
            annotations[keys.ANNOTATION_CLAIMS] = json.dumps({"claims": claims})
        self.custom.create_namespaced_custom_object(
            keys.KUBEVIRT_GROUP,
            keys.KUBEVIRT_VERSION,
            namespace,
            "virtualmachineinstances",
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "annotations": annotations},
                "spec": {"domain": {"devices": {}}},
            },
        )
        self.vmi_phase(namespace, name, phase, node)

    def vmi_phase(self, namespace: str, name: str, phase: str, node: str | None = None) -> None:
        status: dict[str, Any] = {"phase": phase}
        if node:
            status["nodeName"] = node
        self.custom.patch_namespaced_custom_object_status(
            keys.KUBEVIRT_GROUP,
            keys.KUBEVIRT_VERSION,
            namespace,
            "virtualmachineinstances",
            name,
            {"status": status},
        )

    def delete_vmi(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(
            keys.KUBEVIRT_GROUP, keys.KUBEVIRT_VERSION, namespace, "virtualmachineinstances", name
        )


def binder_config(namespace: str, **overrides: Any) -> Config:
    """Controller settings for tests: quick, no metrics server."""
    values: dict[str, Any] = {
        "namespace": namespace,
        "identity": "test-binder",
        "attachment_grace": 120.0,
        "rejection_ttl": 600.0,
        "raw_resource_names": RawNamesPolicy.ALLOWED,
        "extra_resource_names": frozenset(),
        "lease_duration": 15.0,
        "renew_deadline": 10.0,
        "retry_period": 2.0,
        "write_workers": 4,
        "metrics_port": 0,
        "workload_records": True,
    }
    values.update(overrides)
    return Config(**values)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Polls until ``predicate`` returns something truthy, and returns it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
