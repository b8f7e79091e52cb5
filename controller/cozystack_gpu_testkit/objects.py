"""Builders and writers of the API objects tests and benchmarks need, through the real API.

There is no kubelet, node lifecycle controller or virt-controller: these helpers write Node,
Pod and VMI status as those would. Pods are bound by the real kube-scheduler when the plane
runs one (``ControlPlane.start_scheduler``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.config import Config
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit import cluster

WORKLOAD_CRD = cluster.CRD_DIR / "extra" / "workloads.yaml"
# Multus's NetworkAttachmentDefinition, for tests of networks that name a resource.
NAD_CRD = Path(__file__).with_name("nad-crd.yaml")
# Put on every new Node by the TaintNodesByCondition admission plugin; the node lifecycle
# controller (not run here) lifts it once the kubelet reports Ready.
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# What a kubelet reports besides the tests' extended resources: enough for any test pod.
NODE_BASE_RESOURCES = {"cpu": "64", "memory": "512Gi", "ephemeral-storage": "1Ti", "pods": "110"}
# (connect, read) seconds of a driver's requests while faults come and go: a server away
# costs the step, not the run.
TIMEOUT = (5.0, 20.0)


def install_extra_crds(api: Any) -> None:
    """Workload (usage records), KubeVirt's real CRDs (VMI, VM, instance types), as its
    virt-operator generates them at the pinned release, and Multus's
    NetworkAttachmentDefinition."""
    cluster.install_crds(api, [WORKLOAD_CRD, cluster.kubevirt_crds(), NAD_CRD])


def unless(status: int, call: Callable[[], Any]) -> Any:
    """``call()``, or None when the server answers ``status``: 404 for a read of something
    absent or a delete already done, 409 for a create an earlier try already made."""
    try:
        return call()
    except ApiException as exc:
        if exc.status != status:
            raise
        return None


def message_of(exc: ApiException) -> str:
    """What the API server said in refusing a request (its Status message), else its code."""
    try:
        return str(json.loads(exc.body or "{}").get("message", "")) or f"HTTP {exc.status}"
    except (TypeError, ValueError):
        return f"HTTP {exc.status}"


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
        """Writes what the kubelet reports; on a Ready change also lifts or restores the
        not-ready NoSchedule taint, as the node lifecycle controller would, so a real
        scheduler places pods on Ready nodes only."""
        status: dict[str, Any] = {}
        if allocatable is not None:
            alloc = dict(NODE_BASE_RESOURCES)
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
        if ready is not None:
            self._not_ready_taint(name, present=not ready)

    def _not_ready_taint(self, name: str, *, present: bool) -> None:
        """Adds or removes the not-ready NoSchedule taint, guarded by resourceVersion so a
        concurrent taint change by a test is never lost."""
        for _attempt in range(20):
            node = self.core.read_node(name)
            taints = [self.api.sanitize_for_serialization(t) for t in node.spec.taints or []]
            others = [
                t for t in taints if (t["key"], t["effect"]) != (NOT_READY_TAINT, "NoSchedule")
            ]
            if (len(others) < len(taints)) == present:
                return
            if present:
                others.append({"key": NOT_READY_TAINT, "effect": "NoSchedule", "timeAdded": _now()})
            try:
                self.core.patch_node(
                    name,
                    {
                        "metadata": {"resourceVersion": node.metadata.resource_version},
                        "spec": {"taints": others},
                    },
                )
                return
            except ApiException as exc:
                if exc.status != 409:
                    raise
        raise RuntimeError(f"node {name}: taints kept changing under the test kit")

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
        unless(
            409,
            lambda: self.custom.create_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, body
            ),
        )
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
        finalizers: Sequence[str] = (),
    ) -> dict[str, Any]:
        """A claim as a tenant creates it; ``finalizers`` as admission would add them where
        no chart policy or webhook is installed."""
        metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if finalizers:
            metadata["finalizers"] = list(finalizers)
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_CLAIMS,
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_CLAIM,
                "metadata": metadata,
                "spec": {"class": gpu_class, "count": count},
            },
        )
        return result

    def reservation(
        self,
        namespace: str,
        name: str,
        gpu_class: str,
        count: int,
        start: float,
        end: float,
        **kw: Any,
    ) -> dict[str, Any]:
        """A GPUReservation as a tenant creates it, for the window ``[start, end)`` (epoch
        seconds on whole minutes); ``kw`` goes to the create (``dry_run="All"``)."""
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_RESERVATIONS,
            {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_RESERVATION,
                "metadata": {"name": name},
                "spec": {
                    "class": gpu_class,
                    "count": count,
                    "start": translate.rfc3339(start),
                    "end": translate.rfc3339(end),
                },
            },
            **kw,
        )
        return result

    def get_reservation(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, name
        )
        return result

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, name
        )
        return result

    def resource_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ResourceClaim (resource.k8s.io/v1), or None where there is none."""
        kind = keys.RESOURCE_CLAIM
        found: dict[str, Any] | None = unless(
            404,
            lambda: self.custom.get_namespaced_custom_object(
                kind.group, kind.version, namespace, kind.plural, name
            ),
        )
        return found

    def claims(self, namespace: str) -> list[dict[str, Any]]:
        result = self.custom.list_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS
        )
        return list(result["items"])

    def attach(self, namespace: str, claim: str, vmi: str) -> None:
        """Record an attachment by name alone, as release 0.2.0's VMI webhook wrote one before
        its VMI existed (the binder still reads them): a claim attached with no VMI yet."""
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
        """Creates a namespace; where a controller-manager runs, also waits for its
        ``default`` ServiceAccount, without which the ServiceAccount admission plugin
        refuses pods (as a user would wait after ``kubectl create namespace``)."""
        self.core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
        if self._has_service_account("default"):
            wait_for(
                lambda: self._has_service_account(name),
                what=f"the default ServiceAccount of namespace {name}",
            )

    def _has_service_account(self, namespace: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    # --- pods ----------------------------------------------------------------------------

    def pod(self, namespace: str, name: str, **options: Any) -> dict[str, Any]:
        """A pod for the real scheduler (``options`` as ``pod_body`` takes them), as the API
        server stored it."""
        created = self.core.create_namespaced_pod(namespace, pod_body(name, **options))
        result: dict[str, Any] = self.api.sanitize_for_serialization(created)
        return result

    def pod_scheduled(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod's PodScheduled condition as the scheduler wrote it, or None."""
        pod = self.core.read_namespaced_pod(name, namespace)
        for cond in pod.status.conditions or []:
            if cond.type == "PodScheduled":
                result: dict[str, Any] = self.api.sanitize_for_serialization(cond)
                return result
        return None

    def quota(self, namespace: str, hard: Mapping[str, int]) -> None:
        self.core.create_namespaced_resource_quota(
            namespace,
            {"metadata": {"name": "gpu"}, "spec": {"hard": {k: str(v) for k, v in hard.items()}}},
        )

    def nad(self, namespace: str, name: str, resource: str | None = None) -> None:
        """A Multus NetworkAttachmentDefinition naming ``resource`` (the annotation KubeVirt
        turns into a launcher pod request), or none."""
        notes = {keys.ANNOTATION_NAD_RESOURCE: resource} if resource else {}
        config = '{"cniVersion": "0.3.1", "type": "bridge"}'
        self.custom.create_namespaced_custom_object(
            keys.NAD.group,
            keys.NAD.version,
            namespace,
            keys.NAD.plural,
            {
                "apiVersion": keys.NAD.api_version,
                "kind": keys.NAD.kind,
                "metadata": {"name": name, "annotations": notes},
                "spec": {"config": config},
            },
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

        annotations, labels = {}, {}
        if claims is not None:
            annotations[keys.ANNOTATION_CLAIMS] = json.dumps({"claims": claims})
            labels[keys.LABEL_CLAIMS_REF] = keys.LABEL_CLAIMS_REF_VALUE
        self.custom.create_namespaced_custom_object(
            keys.KUBEVIRT_GROUP,
            keys.KUBEVIRT_VERSION,
            namespace,
            "virtualmachineinstances",
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "labels": labels, "annotations": annotations},
                "spec": {"domain": {"devices": {}}},
            },
        )
        self.vmi_phase(namespace, name, phase, node)

    def vmi_phase(self, namespace: str, name: str, phase: str, node: str | None = None) -> None:
        """Writes the phase (and node) as virt-controller and virt-handler would. KubeVirt's
        VMI CRD has no status subresource: status is written with the object."""
        status: dict[str, Any] = {"phase": phase}
        if node:
            status["nodeName"] = node
        self.custom.patch_namespaced_custom_object(
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


def order_webhook_answers(
    kube: Kube, namespace: str, gpu_class: str, unanswered: list[str] | None = None
) -> bool:
    """Whether the claim webhook answered a dry-run order of ``gpu_class`` in ``namespace``
    (as ``kube``'s user): a refusal on the merits (a budget, capacity) is an answer; only a
    call that reached no replica is not (its message added to ``unanswered``). The probe of
    a webhook gap (``answer_gap.Gap``)."""
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": "webhook-probe"},
        "spec": {"class": gpu_class, "count": 1},
    }
    try:
        kube.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, body, dry_run="All"
        )
    except ApiException as exc:
        if "failed calling webhook" not in str(exc.body):
            return True
        if unanswered is not None:
            unanswered.append(message_of(exc))
        return False
    return True


def pod_body(
    name: str,
    *,
    requests: Mapping[str, int] | None = None,
    pinned_to: str | None = None,
    gates: list[str] | None = None,
    labels: Mapping[str, str] | None = None,
    tolerations: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod with one container with ``requests`` as requests and limits (extended
    resources need both), optionally pinned to one node by a required ``metadata.name``
    node-affinity field term, and held by scheduling gates."""
    resources = {k: str(v) for k, v in (requests or {}).items()}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "compute",
                "image": "virt-launcher",
                "resources": {"requests": resources, "limits": resources},
            }
        ],
        "schedulingGates": [{"name": g} for g in gates or []],
        "tolerations": list(tolerations or []),
    }
    if pinned_to is not None:
        term = {"key": "metadata.name", "operator": "In", "values": [pinned_to]}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchFields": [term]}]
                }
            }
        }
    return {"metadata": {"name": name, "labels": dict(labels or {})}, "spec": spec}


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


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 15.0,
    what: str = "condition",
    interval: float = 0.05,
) -> Any:
    """Polls every ``interval`` seconds until ``predicate`` returns something truthy, and
    returns it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}; last: {last!r}")
