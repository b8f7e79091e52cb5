"""API objects (the JSON dicts the informers deliver) → the model's input dataclasses.

Pure: no client, no clock; the caller passes ``now`` where a rule depends on time. With its
neighbours (``attachment``: a claim's attachment and its VMI's verdict; ``pod_usage``: what
pods use and claims cover; ``volumes``: PVCs, PVs and StorageClasses) it is the only place
that knows which fields of a Node, Pod, GPUNode, GPUClass, GPUClaim, Namespace,
ResourceQuota, VMI, VM, PVC, PV or StorageClass the binder reads.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from cozystack_gpu import keys
from cozystack_gpu.keys import Mode, OnCordon, Phase
from cozystack_gpu.model import (
    ClaimInfo,
    ClassInfo,
    Device,
    MigrationTarget,
    NamespaceInfo,
    NodeInfo,
    RejectedNode,
    ReservationInfo,
    ReservationPhase,
    Taint,
    Toleration,
    VolumeAffinity,
    merge_quotas,
)
from cozystack_gpu.objects import Obj, annotation

PhaseT = TypeVar("PhaseT", bound=Enum)

FINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})
FINAL_VMI_PHASES = frozenset({"Succeeded", "Failed"})

_QUANTITY = re.compile(r"^([0-9]+)([kMGTPE]|[KMGTPE]i)?$")
_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def whole_quantity(value: Any) -> int | None:
    """An integer Kubernetes quantity ("8", "2k"), or None for fractions and garbage.

    GPU resources and quota counts are whole numbers; anything else (cpu "3800m") is not
    a GPU figure and is skipped.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    match = _QUANTITY.match(str(value).strip())
    if match is None:
        return None
    return int(match.group(1)) * _SUFFIX[match.group(2) or ""]


def timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an RFC 3339 API timestamp, or None."""
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=datetime.UTC)
    return parsed.timestamp()


def rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def name_of(obj: Obj) -> str:
    return str(meta(obj).get("name", ""))


def namespace_of(obj: Obj) -> str:
    return str(meta(obj).get("namespace", ""))


def object_key(obj: Obj) -> tuple[str, str]:
    """(namespace, name): how every reader of the cluster keys an object ("" namespace
    for a cluster-scoped one)."""
    return (namespace_of(obj), name_of(obj))


def resource_version(obj: Obj) -> int:
    """etcd revisions are integers; the binder orders events of one object by them."""
    try:
        return int(meta(obj).get("resourceVersion", 0))
    except (TypeError, ValueError):
        return 0


# --- Nodes -------------------------------------------------------------------------------


def node_ready(node: Obj) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def inventory_reported_at(gpunode: Obj | None) -> float | None:
    """When the node agent last wrote the GPUNode (``status.updatedAt``), or None."""
    return timestamp(((gpunode or {}).get("status") or {}).get("updatedAt"))


def inventory_stale(reported_at: float | None, now: float, stale_after: float) -> bool:
    """The agent has reported, but not within ``stale_after`` seconds. A node without any
    report has no devices, so it serves nothing anyway; 0 switches the check off."""
    return reported_at is not None and stale_after > 0 and now - reported_at > stale_after


def node_info(
    node: Obj,
    gpunode: Obj | None,
    raw_used: Mapping[str, int],
    *,
    stale: bool = False,
    dra_units: Mapping[str, int] | None = None,
    dra_shared: frozenset[str] = frozenset(),
) -> NodeInfo:
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    allocatable = {
        name: units
        for name, value in (status.get("allocatable") or {}).items()
        if (units := whole_quantity(value)) is not None
    }
    devices = tuple(
        Device(str(d["resourceName"]), int(d.get("allocatable") or 0))
        for d in ((gpunode or {}).get("status") or {}).get("devices") or []
        if d.get("resourceName")
    )
    return NodeInfo(
        name=name_of(node),
        labels=dict(meta(node).get("labels") or {}),
        taints=tuple(
            Taint(str(t.get("key", "")), str(t.get("effect", "")), str(t.get("value") or ""))
            for t in spec.get("taints") or []
        ),
        ready=node_ready(node),
        unschedulable=bool(spec.get("unschedulable")),
        allocatable=allocatable,
        devices=devices,
        raw_used=dict(raw_used),
        inventory_stale=stale,
        dra_units=dict(dra_units or {}),
        dra_shared=dra_shared,
    )


def node_health(node: Obj) -> tuple[Any, ...]:
    """What a rejection of a node waits for: its allocatable, taints or Ready changing."""
    status = node.get("status") or {}
    return (
        json.dumps(status.get("allocatable") or {}, sort_keys=True),
        json.dumps((node.get("spec") or {}).get("taints") or [], sort_keys=True),
        node_ready(node),
    )


# --- Classes -----------------------------------------------------------------------------


def advertised_gpu_names(node: Obj, not_gpus: Iterable[str]) -> frozenset[str]:
    """The GPU names a Node's allocatable lists: every name under nvidia.com/ (a node that
    lists one is a GPU node, with an agent or without), but those known to be other
    devices' (a NIC VF, an audio function, an NVSwitch: ``not_gpus``)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    other = frozenset(not_gpus)
    return frozenset(
        n
        for n in allocatable
        if isinstance(n, str) and n.startswith(keys.NVIDIA_RESOURCE_PREFIX) and n not in other
    )


def class_resource_name(gpu_class: Obj) -> str:
    source = (gpu_class.get("spec") or {}).get("source") or {}
    return str((source.get("devicePlugin") or {}).get("resourceName", ""))


def dra_units_key(class_name: str) -> str:
    """The key the model counts a ``dra`` class's units under. A class's devices are its
    alone (two classes matching one device serve neither there) and no pod requests the
    key, so it is never a resource name (a colon cannot be in one) nor raw usage."""
    return "dra:" + class_name


def class_units_key(gpu_class: Obj) -> str:
    """What the model counts the class's units under: its resource name, or for a ``dra``
    class a key of its own (``dra_units_key``)."""
    source = (gpu_class.get("spec") or {}).get("source") or {}
    if isinstance(source.get("dra"), Mapping):
        return dra_units_key(name_of(gpu_class))
    return class_resource_name(gpu_class)


def class_info(gpu_class: Obj) -> ClassInfo:
    spec = gpu_class.get("spec") or {}
    return ClassInfo(
        name=name_of(gpu_class),
        mode=Mode(spec.get("mode", Mode.PASSTHROUGH.value)),
        resource_name=class_units_key(gpu_class),
        dra=isinstance(((spec.get("source") or {}).get("dra")), Mapping),
        max_count=spec.get("maxCount"),
        node_selector=dict(spec.get("nodeSelector") or {}),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in spec.get("tolerations") or []
        ),
        on_cordon=OnCordon(spec.get("onCordon") or OnCordon.MOVE.value),
        deleting=bool(meta(gpu_class).get("deletionTimestamp")),
    )


# --- VMIs and claims ---------------------------------------------------------------------


@dataclass(frozen=True)
class VMIState:
    """What the binder needs of a VirtualMachineInstance."""

    namespace: str
    name: str
    phase: str
    node: str | None
    held_claims: tuple[str, ...]
    uses_claims: bool = False  # it carries the reference label (keys.uses_claims)
    uid: str = ""
    attachment_id: str = ""  # keys.ANNOTATION_ATTACHMENT_ID, written at its admission

    @property
    def final(self) -> bool:
        return self.phase in FINAL_VMI_PHASES


def claims_annotation(annotations: Mapping[str, str]) -> tuple[str, ...]:
    """Held claim names from the claims annotation (``annotation.request_of``: a malformed
    one names nothing; the VMI webhook refuses it at admission)."""
    request = annotation.request_of(annotations)
    return request.claims if request is not None else ()


def template_claim_names(vmi: Obj) -> tuple[str, ...]:
    """Names of the claims made from a VMI's claim templates (a malformed annotation names
    nothing)."""
    request = annotation.request_of(meta(vmi).get("annotations"))
    if request is None:
        return ()
    return tuple(keys.template_claim_name(name_of(vmi), t.name) for t in request.templates)


def vmi_state(vmi: Obj) -> VMIState:
    status = vmi.get("status") or {}
    annotations = meta(vmi).get("annotations") or {}
    return VMIState(
        namespace=namespace_of(vmi),
        name=name_of(vmi),
        phase=str(status.get("phase") or "Pending"),
        node=status.get("nodeName") or None,
        held_claims=claims_annotation(annotations),
        uses_claims=keys.uses_claims(meta(vmi).get("labels")),
        uid=str(meta(vmi).get("uid") or ""),
        attachment_id=str(annotations.get(keys.ANNOTATION_ATTACHMENT_ID) or ""),
    )


def vm_held_claims(vm: Obj) -> tuple[str, ...]:
    """Claims a VirtualMachine's template names: the set it keeps while it is stopped."""
    template = (vm.get("spec") or {}).get("template") or {}
    return claims_annotation((template.get("metadata") or {}).get("annotations") or {})


def is_template_claim(claim: Obj) -> bool:
    labels = meta(claim).get("labels") or {}
    return bool(labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE)


def window_reservation_uid(claim: Obj) -> str | None:
    """Uid of the GPUReservation whose window claim ``claim`` is (SPEC §11): the claim of the
    reservation's name that it makes at its start, labelled with that name and owned by it.
    None for any other claim (an order, a template claim)."""
    name = name_of(claim)
    labels = meta(claim).get("labels") or {}
    if not name or labels.get(keys.LABEL_RESERVATION) != name:
        return None
    for ref in meta(claim).get("ownerReferences") or []:
        if (
            ref.get("kind") == keys.KIND_RESERVATION
            and ref.get("apiVersion") == keys.API_VERSION
            and ref.get("name") == name
            and ref.get("uid")
        ):
            return str(ref["uid"])
    return None


def is_window_claim(claim: Obj) -> bool:
    """The claim a reservation makes at its window's start: its units are the window's."""
    return window_reservation_uid(claim) is not None


def made_by_template(claim: Obj) -> bool:
    """A claim the controller made from a claim template: labelled so, or carrying the uid
    of the VMI it was made for (a label taken off does not make it an order)."""
    annotations = meta(claim).get("annotations") or {}
    return is_template_claim(claim) or keys.ANNOTATION_TEMPLATE_VMI_UID in annotations


def template_made_for(claim: Obj) -> str | None:
    """Uid of the VMI a template claim was made for: the annotation the controller wrote
    at creation, or (a claim made before it wrote one) its controlling VMI owner's uid;
    None when the claim says neither."""
    annotations = meta(claim).get("annotations") or {}
    uid = str(annotations.get(keys.ANNOTATION_TEMPLATE_VMI_UID) or "")
    if uid:
        return uid
    owner = controlling_vmi(claim)
    if owner is None or not owner[1]:
        return None
    return owner[1]


def controlling_vmi(obj: Obj) -> tuple[str, str] | None:
    """(name, uid) of the VMI that controls an object (a template claim, a launcher pod):
    its controller ownerReference of kind VirtualMachineInstance in the kubevirt.io group."""
    for ref in meta(obj).get("ownerReferences") or []:
        if (
            ref.get("kind") == keys.VMI.kind
            and str(ref.get("apiVersion", "")).split("/", 1)[0] == keys.KUBEVIRT_GROUP
            and ref.get("controller")
        ):
            return str(ref.get("name")), str(ref.get("uid") or "")
    return None


def set_id_for(claim: Obj, vmi_of_claim: str | None, vm_of_claim: str | None) -> str | None:
    """Claims of one VM share a set id: the VM (or VMI) that names them, or the VMI that
    owns a template claim."""
    for ref in meta(claim).get("ownerReferences") or []:
        if ref.get("kind") == "VirtualMachineInstance":
            return "vm/" + str(ref.get("name"))
    if vm_of_claim:
        return "vm/" + vm_of_claim
    if vmi_of_claim:
        return "vm/" + vmi_of_claim
    return None


def status_phase(status: Mapping[str, Any], default: PhaseT) -> PhaseT:
    """``status.phase`` as ``default``'s enum; ``default`` when absent or not one it knows
    (a phase a newer release writes)."""
    try:
        return type(default)(status.get("phase") or default.value)
    except ValueError:
        return default


def migration_target(status: Mapping[str, Any]) -> MigrationTarget | None:
    """``status.migration`` (SPEC §12) as the model reads it; None when absent or when a
    field is missing or malformed (no node, no migration uid, no RFC 3339 ``since``)."""
    entry = status.get("migration")
    if not isinstance(entry, Mapping):
        return None
    node, uid = entry.get("node"), entry.get("migrationUID")
    since = timestamp(entry.get("since"))
    if not (isinstance(node, str) and node and isinstance(uid, str) and uid) or since is None:
        return None
    return MigrationTarget(node, uid, since)


def claim_info(
    claim: Obj,
    *,
    vmi_live_now: bool,
    set_id: str | None,
    volumes: tuple[VolumeAffinity, ...] = (),
) -> ClaimInfo:
    spec = claim.get("spec") or {}
    status = claim.get("status") or {}
    rejected = []
    for entry in status.get("rejectedNodes") or []:
        until = timestamp(entry.get("until"))
        if entry.get("node") and until is not None:
            rejected.append(RejectedNode(str(entry["node"]), until))
    phase = status_phase(status, Phase.PENDING)
    return ClaimInfo(
        namespace=namespace_of(claim),
        name=name_of(claim),
        class_name=str(spec.get("class", "")),
        count=int(spec.get("count") or 1),
        created=timestamp(meta(claim).get("creationTimestamp")) or 0.0,
        phase=phase,
        node=status.get("nodeName") or None,
        attached_to=status.get("attachedTo") or None,
        vmi_live=vmi_live_now,
        bound_at=timestamp(status.get("boundAt")),
        rejected=tuple(rejected),
        set_id=set_id,
        template=is_template_claim(claim),
        volumes=volumes,
        window=is_window_claim(claim),
        migration=migration_target(status),
    )


# --- Reservations ------------------------------------------------------------------------


def reservation_info(reservation: Obj) -> ReservationInfo | None:
    """A GPUReservation as the booking model reads it; None when its window cannot be read
    (the CRD's rules refuse such a window, so only an object stored before them has one):
    a reservation without a window holds nothing."""
    spec = reservation.get("spec") or {}
    status = reservation.get("status") or {}
    start, end = timestamp(spec.get("start")), timestamp(spec.get("end"))
    if start is None or end is None or start >= end or start % 60 or end % 60:
        return None
    phase = status_phase(status, ReservationPhase.PENDING)
    return ReservationInfo(
        namespace=namespace_of(reservation),
        name=name_of(reservation),
        uid=str(meta(reservation).get("uid", "")),
        class_name=str(spec.get("class", "")),
        count=int(spec.get("count") or 1),
        start=int(start),
        end=int(end),
        node=status.get("nodeName") or None,
        phase=phase,
        created=timestamp(meta(reservation).get("creationTimestamp")) or 0.0,
    )


# --- Namespaces --------------------------------------------------------------------------


def quota_hard(quota: Obj) -> dict[str, int]:
    hard = (quota.get("spec") or {}).get("hard") or {}
    return {
        key: units for key, value in hard.items() if (units := whole_quantity(value)) is not None
    }


def namespace_info(
    namespace: Obj, quotas: Iterable[Obj], raw_used: Mapping[str, int]
) -> NamespaceInfo:
    return NamespaceInfo(
        name=name_of(namespace),
        labels=dict(meta(namespace).get("labels") or {}),
        quota=merge_quotas([quota_hard(q) for q in quotas]),
        raw_used=dict(raw_used),
    )
