"""API objects (the JSON dicts the informers deliver) → the model's input dataclasses.

Pure: no client, no clock; the caller passes ``now`` where a rule depends on time. This is
the only place that knows which fields of a Node, Pod, GPUNode, GPUClass, GPUClaim,
Namespace, ResourceQuota, VMI, VM, PVC, PV or StorageClass the binder reads.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import Mode, OnCordon, Phase
from cozystack_gpu.model import (
    ClaimInfo,
    ClassInfo,
    Device,
    NamespaceInfo,
    NodeInfo,
    NodeRequirement,
    RejectedNode,
    Taint,
    Toleration,
    VolumeAffinity,
    merge_quotas,
)
from cozystack_gpu.objects import Obj, annotation

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
    node: Obj, gpunode: Obj | None, raw_used: Mapping[str, int], *, stale: bool = False
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
    )


def node_health(node: Obj) -> tuple[Any, ...]:
    """What a rejection of a node waits for: its allocatable, taints or Ready changing."""
    status = node.get("status") or {}
    return (
        json.dumps(status.get("allocatable") or {}, sort_keys=True),
        json.dumps((node.get("spec") or {}).get("taints") or [], sort_keys=True),
        node_ready(node),
    )


# --- Pods (raw-name usage) ---------------------------------------------------------------


@dataclass(frozen=True)
class PodUsage:
    """Extended resources one running pod requests, and where."""

    namespace: str
    node: str | None
    requests: Mapping[str, int]


# Claim phases whose units a launcher pod on the claim's node is using: Bound and Attached
# claims, and Lost ones (the model counts a Lost claim there while its VMI runs there, and
# a running launcher pod says it does).
_COVERING_PHASES = frozenset({Phase.BOUND.value, Phase.ATTACHED.value, Phase.LOST.value})


def claim_serves_vmi(claim: Obj, vmi_name: str) -> bool:
    """The claim's units are the VMI's: attached to it (``status.attachedTo``), or a
    template claim it owns (the controller creates those, owned by the VMI)."""
    return (claim.get("status") or {}).get("attachedTo") == vmi_name or (
        template_owner(claim) == vmi_name
    )


def template_owner(claim: Obj) -> str | None:
    """The VMI that owns a template claim (the controller makes them so), or None."""
    if not is_template_claim(claim):
        return None
    for ref in meta(claim).get("ownerReferences") or []:
        if ref.get("kind") == keys.VMI.kind and ref.get("name"):
            return str(ref["name"])
    return None


def claims_cover(
    claims: Iterable[Obj], resource_of: Callable[[str], str | None], node: str
) -> dict[str, int]:
    """Units, by resource name, that one VMI's claims (see ``claim_serves_vmi``) hold on
    ``node``: what its launcher pod there may use without taking anyone else's."""
    cover: dict[str, int] = {}
    for claim in claims:
        status = claim.get("status") or {}
        if status.get("nodeName") != node or status.get("phase") not in _COVERING_PHASES:
            continue
        resource = resource_of(str((claim.get("spec") or {}).get("class", "")))
        if resource:
            cover[resource] = cover.get(resource, 0) + int(
                (claim.get("spec") or {}).get("count") or 1
            )
    return cover


def sum_usage(usages: Iterable[PodUsage], gpu_names: frozenset[str]) -> dict[str, int]:
    total: dict[str, int] = {}
    for usage in usages:
        for name, units in usage.requests.items():
            if name in gpu_names:
                total[name] = total.get(name, 0) + units
    return total


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


def class_info(gpu_class: Obj) -> ClassInfo:
    spec = gpu_class.get("spec") or {}
    return ClassInfo(
        name=name_of(gpu_class),
        mode=Mode(spec.get("mode", Mode.PASSTHROUGH.value)),
        resource_name=class_resource_name(gpu_class),
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


def vm_volume_claims(vm: Obj) -> tuple[str, ...]:
    """PVC names of a VirtualMachine's volumes: ``persistentVolumeClaim.claimName``, and
    ``dataVolume.name`` (a DataVolume makes a PVC of its own name)."""
    spec = ((vm.get("spec") or {}).get("template") or {}).get("spec") or {}
    names: list[str] = []
    for volume in spec.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        data = (volume.get("dataVolume") or {}).get("name")
        for name in (claim, data):
            if name and str(name) not in names:
                names.append(str(name))
    return tuple(names)


def pod_volume_claims(pod: Obj) -> tuple[str, ...]:
    """PVC names of a pod's volumes (KubeVirt renders DataVolumes as their PVCs)."""
    return tuple(
        str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    )


def pvc_volume_name(pvc: Obj) -> str | None:
    """The PV a PVC is bound to (``spec.volumeName``, set by the binding), or None."""
    return (pvc.get("spec") or {}).get("volumeName") or None


def binds_at_first_consumer(storage_class: Obj | None) -> bool:
    """An unbound PVC whose StorageClass binds WaitForFirstConsumer: the scheduler binds it
    where its first pod goes, so it limits nothing before."""
    return (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"


def pvc_storage_class(pvc: Obj) -> str:
    return str((pvc.get("spec") or {}).get("storageClassName") or "")


def volume_affinity(pv: Obj) -> VolumeAffinity | None:
    """A PV's required node affinity (local and topology-bound volumes have one), or None
    when it may be used from any node."""
    required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        requirements = [
            NodeRequirement(
                str(e.get("key", "")),
                str(e.get("operator", "")),
                tuple(str(v) for v in e.get("values") or []),
            )
            for e in term.get("matchExpressions") or []
        ]
        for field in term.get("matchFields") or []:
            if field.get("key") != "metadata.name":
                # No other field can be matched: the term matches no node.
                requirements.append(NodeRequirement("", "In", (), True))
                continue
            requirements.append(
                NodeRequirement(
                    "",
                    str(field.get("operator", "")),
                    tuple(str(v) for v in field.get("values") or []),
                    True,
                )
            )
        if not requirements:
            # An empty term matches no node (as kube-scheduler reads it).
            requirements.append(NodeRequirement("", "In", (), True))
        terms.append(tuple(requirements))
    if not terms:
        return None
    return VolumeAffinity(name_of(pv), tuple(terms))


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


@dataclass(frozen=True)
class Attachment:
    """A claim's attachment: the VMI's name, its uid once the controller recorded it, the
    id the VMI webhook wrote with it (and into the VMI), and when it was written."""

    vmi: str
    uid: str
    attachment_id: str
    at: float | None

    @property
    def confirmed(self) -> bool:
        return bool(self.uid)

    @property
    def token(self) -> tuple[str, str, str]:
        """What changes when the attachment is written anew (a new start, or the uid)."""
        return (self.vmi, self.attachment_id, str(self.at))


def attachment_of(claim: Obj) -> Attachment | None:
    status = claim.get("status") or {}
    target = status.get("attachedTo")
    if not target:
        return None
    return Attachment(
        vmi=str(target),
        uid=str(status.get("attachedToUID") or ""),
        attachment_id=str(status.get("attachmentID") or ""),
        at=timestamp(status.get("attachedAt")),
    )


class Verdict(Enum):
    """Where a claim's attachment stands against the VMI of that name the binder sees."""

    RUNS = "runs"  # that very VMI exists and is not final
    STARTING = "starting"  # not seen yet (or only another VMI of that name), within the grace
    FINISHED = "finished"  # that very VMI is Succeeded or Failed
    GONE = "gone"  # that VMI was seen and is gone (or replaced by another of the same name)
    EXPIRED = "expired"  # never seen within the grace: a later admission step refused it


def same_vmi(attached: Attachment, vmi: VMIState) -> bool | None:
    """Is ``vmi`` the incarnation the attachment names? True or False when the attachment
    says (by uid, else by the webhook's attachment id); None for an attachment that carries
    neither (written before either existed): the name is all there is."""
    if attached.uid:
        return vmi.uid == attached.uid
    if attached.attachment_id:
        return vmi.attachment_id == attached.attachment_id
    return None


def attachment_verdict(
    attached: Attachment,
    vmi: VMIState | None,
    now: float,
    grace: float,
    seen_at: float | None,
    claim_name: str = "",
) -> Verdict:
    """Whether the attachment's VMI runs, may still appear, or has ended.

    A VMI is known by its uid once the controller has recorded it: only the end of that VMI
    ends the attachment, so a stop and a start of the same VM racing each other never clear
    the new start's claims. Before that, the webhook's attachment id says which VMI the
    attachment was admitted with; another VMI of the same name (the previous start, still in
    a lagging view) is no answer, and the attachment waits for its own within the grace.

    The grace counts from the later of the webhook's ``attachedAt`` and ``seen_at`` (when
    this binder first saw the attachment): a webhook replica whose clock runs behind the
    leader's must not make a starting VM's attachment expire early.
    """
    if vmi is not None:
        same = same_vmi(attached, vmi)
        if same is None or same:
            return Verdict.FINISHED if vmi.final else Verdict.RUNS
        if attached.confirmed and claim_name not in vmi.held_claims:
            return Verdict.GONE  # a VMI of that name that does not hold the claim
        if attached.confirmed:
            # Another VMI of that name that names this claim: a newer one would have been
            # admitted with it and have written a new attachment, so this is an older one
            # in a view that lags (a new leader's first listing): wait for the view.
            return Verdict.STARTING
    elif attached.confirmed:
        return Verdict.GONE
    starts = [t for t in (attached.at, seen_at) if t is not None]
    if starts and now < max(starts) + grace:
        return Verdict.STARTING
    return Verdict.EXPIRED


LIVE_VERDICTS = frozenset({Verdict.RUNS, Verdict.STARTING})


def vmi_live(
    claim: Obj, vmi: VMIState | None, now: float, grace: float, seen_at: float | None = None
) -> bool:
    """The VMI a claim is attached to runs, or may still appear (``attachment_verdict``).

    An Attached or Lost claim whose attachment carries neither uid nor attachment id (written
    before this controller recorded them) keeps the old rule: its VMI existed, so once no VMI
    of that name is seen it is gone.
    """
    attached = attachment_of(claim)
    if attached is None:
        return False
    phase = (claim.get("status") or {}).get("phase")
    legacy = not attached.uid and not attached.attachment_id
    if vmi is None and legacy and phase != Phase.BOUND.value:
        return False
    verdict = attachment_verdict(attached, vmi, now, grace, seen_at, name_of(claim))
    return verdict in LIVE_VERDICTS


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
    try:
        phase = Phase(status.get("phase") or Phase.PENDING.value)
    except ValueError:
        phase = Phase.PENDING
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
