"""What one look reads and what it reports: the cluster as the API server held it at one
revision (``read_state``: every list at one resourceVersion), the part of it a test owns
(``Scope``), and a broken rule (``Violation``, named by one of the rule names here)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.cluster.informer import list_function
from cozystack_gpu.objects import MutableObj

CAPACITY = "node over capacity"
BUDGET = "budget over its limit"
BOUND_TWICE = "claim bound twice"
ATTACHED_MOVED = "attached claim moved"
POD_ELSEWHERE = "launcher pod on another node than its claims"
NOT_JUDGED = "order not judged"
RECORDS = "usage records"
NOT_ATTACHED = "running VMI's claim not attached to it"
UNPROTECTED = "running VMI's claim unprotected"
FOREIGN_TEMPLATE = "running VMI uses a template claim not its own"
SERVES_TWO = "claim serves two VMIs"
UNPINNED = "launcher pod ungated without its pin"
WINDOW_NOT_KEPT = "booked window not kept at its start or end"
DRA_NOT_FOLLOWED = "dra claim's ResourceClaim missing, twice, or allocated off its node"
# What a driver judges itself (``driver_looks``; the lifecycle fuzz's): a VMI or launcher pod
# with GPU entries of its own admitted under ``forbidden``, a started VM stranded at a node
# that refuses its pinned pod, a template claim left behind by its VMI, a tenant's own pod
# requesting a GPU admitted under ``forbidden``, a launcher pod let go asking more than its
# claims hold, a launcher pod's claims gate taken off by its tenant.
RAW_ADMITTED = "raw GPU entries admitted without claims"
STRANDED = "started VM stranded at a refusing node"
ORPHANED = "template claim outlived the VMI it was made for"
FORGED_ADMITTED = "a tenant's own pod admitted with a GPU under forbidden"
SURPLUS = "launcher pod ungated asking more GPUs than its claims cover"
UNGATED_BY_TENANT = "a tenant took the claims gate off its launcher pod"
READ_TIMEOUT_S = (5.0, 30.0)


@dataclass(frozen=True)
class Violation:
    rule: str
    subject: str
    detail: str

    def __str__(self) -> str:
        return f"{self.rule}: {self.subject}: {self.detail}"


@dataclass(frozen=True)
class Scope:
    """What one test owns on a shared control plane: claims, quotas and records in
    ``namespaces``, and the nodes matching ``node_labels``. None means everything."""

    namespaces: frozenset[str] | None = None
    node_labels: Mapping[str, str] | None = None

    def has_namespace(self, name: str) -> bool:
        return self.namespaces is None or name in self.namespaces

    def has_node(self, node: MutableObj) -> bool:
        if self.node_labels is None:
            return True
        labels = _meta(node).get("labels") or {}
        return all(labels.get(k) == v for k, v in self.node_labels.items())


@dataclass
class State:
    """Everything the rules read, as the API server held it at one revision."""

    nodes: list[MutableObj]
    gpunodes: list[MutableObj]
    classes: list[MutableObj]
    claims: list[MutableObj]
    namespaces: list[MutableObj]
    quotas: list[MutableObj]
    pods: list[MutableObj]
    workloads: list[MutableObj]
    vmis: list[MutableObj]
    reservations: list[MutableObj] = field(default_factory=list)
    # resource.k8s.io, where it is served (empty where not): a dra class's devices.
    resource_slices: list[MutableObj] = field(default_factory=list)
    device_classes: list[MutableObj] = field(default_factory=list)
    resource_claims: list[MutableObj] = field(default_factory=list)
    resource_version: str | None = None  # the revision every list was served at
    read_at: float = field(default_factory=time.time)  # when its revision was served


_LISTS: dict[str, keys.ApiKind] = {
    "nodes": keys.NODE,
    "gpunodes": keys.GPU_NODE,
    "classes": keys.GPU_CLASS,
    "claims": keys.GPU_CLAIM,
    "namespaces": keys.NAMESPACE,
    "quotas": keys.RESOURCE_QUOTA,
    "pods": keys.POD,
    "workloads": keys.WORKLOAD,
    "vmis": keys.VMI,
    "reservations": keys.GPU_RESERVATION,
    "resource_slices": keys.RESOURCE_SLICE,
    "device_classes": keys.DEVICE_CLASS,
    "resource_claims": keys.RESOURCE_CLAIM,
}


def read_state(api: client.ApiClient, at: str | None = None) -> State:
    """Lists every kind the rules read, as raw JSON (the client's models are slow); a kind
    the server does not serve (no KubeVirt, no Workload CRD) reads as empty.

    Every list is served at one resourceVersion (the first list's, or ``at``), exactly:
    every kind shares etcd's revision, so the state is one moment of the cluster. Lists
    read one after another would see a VM start between them (its claims before they were
    attached, its launcher pod after it was bound) and call the pod's units held twice.
    """
    items: dict[str, list[MutableObj]] = {}
    revision = at
    started = time.time()  # the revision is the first list's: the state is of about then
    for name, kind in _LISTS.items():
        at_revision: dict[str, str] = {}
        if revision is not None:
            at_revision = {"resource_version": revision, "resource_version_match": "Exact"}
        try:
            response = list_function(api, kind)(
                _preload_content=False, _request_timeout=READ_TIMEOUT_S, **at_revision
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            items[name] = []
            continue
        listed = json.loads(response.data)
        revision = revision or str((listed.get("metadata") or {}).get("resourceVersion"))
        items[name] = list(listed.get("items") or [])
    return State(
        nodes=items["nodes"],
        gpunodes=items["gpunodes"],
        classes=items["classes"],
        claims=items["claims"],
        namespaces=items["namespaces"],
        quotas=items["quotas"],
        pods=items["pods"],
        workloads=items["workloads"],
        vmis=items["vmis"],
        reservations=items["reservations"],
        resource_slices=items["resource_slices"],
        device_classes=items["device_classes"],
        resource_claims=items["resource_claims"],
        resource_version=revision,
        read_at=started,
    )


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}
