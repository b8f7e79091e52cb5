"""The launcher-pod gate, as pure rules: which pods wait at the gate, which VMI and claims
they start, the template claims to create, the one pod update that pins and ungates, and
when a scheduler's refusal of a pinned pod counts as a rejection of its node.

Seed 000 tells the path: the pod webhook puts ``keys.SCHEDULING_GATE_CLAIMS`` on a
virt-launcher pod (and on KubeVirt's temporary pod for WaitForFirstConsumer volumes); the
leader creates the VMI's template claims, places the whole set on one node, and then, in one
pod update, adds a ``metadata.name`` requirement for that node to every required node
selector term (or one term) and removes the gate. The API server lets a pod's node affinity
gain requirements only while the pod is still gated, so the pin and the ungating cannot be
split. The binder loop does the I/O; everything here is a function of API objects.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.model import ClaimKey, VolumeAffinity
from cozystack_gpu.objects import Obj, annotation, attachment, translate
from cozystack_gpu.objects.annotation import ClaimsRequest, TemplateEntry
from cozystack_gpu.objects.conditions import merge_conditions
from cozystack_gpu.objects.translate import meta, name_of, namespace_of, node_ready
from cozystack_gpu.objects.vmi_pods import (
    NODE_NAME_FIELD,
    required_terms,
)
from cozystack_gpu.objects.volumes import (
    binds_at_first_consumer,
    pod_volume_claims,
    pvc_storage_class,
    pvc_volume_name,
    volume_affinity,
)

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9./_-]+)")
_TOO_MANY_PODS = "Too many pods"


# --- the claims annotation ---------------------------------------------------------------


def claim_keys(vmi_key: tuple[str, str], vmi: Obj) -> list[ClaimKey]:
    """The keys of a VMI's claims: the held ones and those of its claim templates."""
    ref = annotation.claims_ref_of(vmi) or ClaimsRequest()
    names = [*ref.claims, *annotation.template_claim_names(vmi_key[1], ref)]
    return [ClaimKey(vmi_key[0], n) for n in names]


def template_claim(vmi: Obj, template: TemplateEntry) -> dict[str, Any]:
    """The GPUClaim the controller creates from one claim template: labelled, owned by the
    VMI (the garbage collector removes it with the VMI), annotated with that VMI's uid (the
    binder deletes it once no VMI of that uid exists, whatever its owners say by then), and
    protected from its creation on: it holds GPUs for that VMI alone, so deleting it must
    wait until the VMI ends."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {
            "name": keys.template_claim_name(name_of(vmi), template.name),
            "namespace": namespace_of(vmi),
            "labels": {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE},
            "annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: str(meta(vmi).get("uid") or "")},
            "finalizers": [keys.FINALIZER_CLAIM],
            "ownerReferences": [
                {
                    "apiVersion": keys.VMI.api_version,
                    "kind": keys.VMI.kind,
                    "name": name_of(vmi),
                    "uid": meta(vmi).get("uid"),
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {"class": template.gpu_class, "count": template.count},
    }


def template_claim_conflict(
    claim: Obj, vmi_name: str, vmi_uid: str, template: TemplateEntry
) -> str | None:
    """Why an existing claim that has the name of one of this VMI's template claims is not
    that claim, or None when it is: only a claim the controller made (the template label),
    controlled by this very VMI (by uid) and ordering the template's class and count is
    adopted. A tenant can create a claim under that name first, or a claim of the VM's
    previous start may still be there; taking either would hold GPUs nobody ordered or
    hand the VM a claim that is about to be garbage-collected."""
    problems: list[str] = []
    owner = translate.controlling_vmi(claim)
    earlier_start = owner is not None and owner[0] == vmi_name and owner[1] != vmi_uid
    if not translate.is_template_claim(claim):
        problems.append(f"it is an ordered claim, not labelled {keys.LABEL_TEMPLATE_CLAIM}")
    elif earlier_start:
        assert owner is not None
        problems.append(
            f"it belongs to an earlier start of this VM (VMI uid {owner[1]}), and the "
            "garbage collector removes it with that VMI"
        )
    elif owner is None or owner != (vmi_name, vmi_uid):
        problems.append("it is not controlled by this VirtualMachineInstance")
    spec = claim.get("spec") or {}
    ordered = (str(spec.get("class", "")), int(spec.get("count") or 1))
    if ordered != (template.gpu_class, template.count):
        problems.append(
            f"it orders {ordered[1]} of class {ordered[0]} where the template asks for "
            f"{template.count} of class {template.gpu_class}"
        )
    if not problems:
        return None
    fix = (
        "the VM starts once it is gone"
        if earlier_start and len(problems) == 1
        else "delete that claim, or rename the claim template, and the VM starts"
    )
    return (
        f"GPUClaim {name_of(claim)} has the name of the claim made from claim template "
        f"{template.name} of VMI {vmi_name}, but {'; '.join(problems)}: the VM waits at the "
        f"gate; {fix}"
    )


def template_claims_conflict(vmi: Obj, claim_of: Callable[[ClaimKey], Obj | None]) -> str | None:
    """Why a claim named like one of the VMI's template claims is not its template claim
    (see ``template_claim_conflict``), or None."""
    ref = annotation.claims_ref_of(vmi) or ClaimsRequest()
    name, uid = translate.name_of(vmi), str(translate.meta(vmi).get("uid") or "")
    namespace = translate.namespace_of(vmi)
    for template in ref.templates:
        key = ClaimKey(namespace, keys.template_claim_name(name, template.name))
        existing = claim_of(key)
        if existing is None:
            continue
        problem = template_claim_conflict(existing, name, uid, template)
        if problem is not None:
            return problem
    return None


# --- launcher pods -----------------------------------------------------------------------


def pin_and_ungate(pod: Obj, node: str) -> dict[str, Any]:
    """The one update that pins a gated pod to ``node`` and removes our gate: a merge patch
    carrying the pod's resourceVersion (lists are replaced whole, so the patch holds every
    term and every other gate as they are)."""
    spec = pod.get("spec") or {}
    requirement = {"key": NODE_NAME_FIELD, "operator": "In", "values": [node]}
    terms = copy.deepcopy(required_terms(spec)) or [{}]
    for term in terms:
        term["matchFields"] = [*(term.get("matchFields") or []), requirement]
    gates = [
        g for g in spec.get("schedulingGates") or [] if g.get("name") != keys.SCHEDULING_GATE_CLAIMS
    ]
    return {
        "metadata": {"resourceVersion": meta(pod).get("resourceVersion")},
        "spec": {
            "schedulingGates": gates or None,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
                }
            },
        },
    }


def ungate(pod: Obj) -> dict[str, Any]:
    """Only remove our gate (a pod of a VMI without claims to place)."""
    gates = [
        g
        for g in (pod.get("spec") or {}).get("schedulingGates") or []
        if g.get("name") != keys.SCHEDULING_GATE_CLAIMS
    ]
    return {
        "metadata": {"resourceVersion": meta(pod).get("resourceVersion")},
        "spec": {"schedulingGates": gates or None},
    }


@dataclass(frozen=True)
class ResourceRefusal:
    """The scheduler refused a pod for lack of resources it requests: its message, and
    which of the pod's resources the node lacked."""

    message: str
    resources: tuple[str, ...]


def requested_resources(pod: Obj) -> frozenset[str]:
    """Every resource a pod asks the scheduler for: its containers' and init containers'
    requests and limits (KubeVirt's launcher pod asks for cpu, memory, ephemeral storage,
    devices.kubevirt.io/kvm, tun, vhost-net and the GPU names), and a pod slot."""
    spec = pod.get("spec") or {}
    names = {"pods"}
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        names.update(resources.get("requests") or {})
        names.update(resources.get("limits") or {})
    return frozenset(names)


def refused_for_resources(pod: Obj) -> ResourceRefusal | None:
    """The scheduler's refusal of the pod for lack of any resource the pod requests
    (PodScheduled False, reason Unschedulable, "Insufficient <name>" or "Too many pods"),
    else None. A pinned pod can only go to one node, so the lack is that node's."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False":
            continue
        if cond.get("reason") != "Unschedulable":
            continue
        message = str(cond.get("message") or "")
        wanted = requested_resources(pod)
        lacking = [name for name in _INSUFFICIENT.findall(message) if name in wanted]
        if _TOO_MANY_PODS in message:
            lacking.append("pods")
        if lacking:
            return ResourceRefusal(message, tuple(sorted(set(lacking))))
    return None


def node_state(node: Obj) -> str:
    """A digest of what a rejection of a node waits for (its allocatable, taints and Ready),
    kept in the rejectedNodes entry so any replica, a new leader too, can tell whether the
    node changed since it refused."""
    text = json.dumps(translate.node_health(node), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def node_may_reject(node: Obj | None, stay_pinned: bool) -> bool:
    """A refusal counts against a node only when the node is Ready and not cordoned and the
    set is not under a Stay pin: a pod waiting on a cordoned or NotReady node, or under a
    Stay pin, waits for the node rather than leaving it."""
    if node is None or stay_pinned:
        return False
    return node_ready(node) and not (node.get("spec") or {}).get("unschedulable")


def pinned_message(pod: str, node: str) -> str:
    """The Placed condition's message once a set's launcher pod is pinned."""
    return f"launcher pod {pod} pinned to node {node}"


def says_pinned_to(claim: Obj, node: str) -> bool:
    """The claim's Placed condition says its VM's launcher pod is pinned to ``node``."""
    for cond in (claim.get("status") or {}).get("conditions") or []:
        if cond.get("type") == keys.CONDITION_PLACED:
            return bool(
                cond.get("reason") == keys.ClaimReason.PINNED.value
                and str(cond.get("message", "")).endswith(f" pinned to node {node}")
            )
    return False


def bound_on(claim: Obj | None, node: str) -> bool:
    """The API has the claim bound (or attached) on ``node``."""
    status = (claim or {}).get("status") or {}
    return status.get("nodeName") == node and status.get("phase") in (
        keys.Phase.BOUND.value,
        keys.Phase.ATTACHED.value,
    )


def held_claim_wait(claim_name: str, claim: Obj | None, vmi_name: str) -> tuple[str, str] | None:
    """Why the binder cannot attach a claim the VMI holds by name, as (reason, message):
    another VMI has it (two VMIs admitted before either was attached), or it is being
    deleted. None when it is this VMI's or can become so."""
    if claim is None:
        return None
    attached_to = str((claim.get("status") or {}).get("attachedTo") or "")
    if attached_to and attached_to != vmi_name:
        return (
            keys.AdmissionReason.CLAIM_ATTACHED_ELSEWHERE.value,
            attachment.attached_elsewhere(claim_name, attached_to),
        )
    if not attached_to and meta(claim).get("deletionTimestamp"):
        return (
            keys.AdmissionReason.CLAIM_BEING_DELETED.value,
            attachment.being_deleted(claim_name),
        )
    return None


def held_for_start(claim: Obj | None, vmi: Obj) -> bool:
    """A held claim (one the tenant ordered) is ready for its VM's start: Attached to this
    very VMI and carrying the claim-protection finalizer. The pin waits for both, so a VM
    never runs on a claim that could still be moved or deleted from under it (the binder
    attaches a claim once it sees the VMI, ``attachments``, and protects it then where
    admission has not). KubeVirt names every VMI of a VM alike: an attachment that names an
    earlier VMI of the name (by uid, or by a 0.2.0 webhook's attachment id) is not this
    one's, however quickly the VM was restarted."""
    if claim is None:
        return False
    status = claim.get("status") or {}
    attached = attachment.attachment_of(claim)
    return (
        status.get("phase") == keys.Phase.ATTACHED.value
        and attached is not None
        and attached.vmi == name_of(vmi)
        and attachment.same_vmi(attached, translate.vmi_state(vmi)) is not False
        and keys.FINALIZER_CLAIM in (meta(claim).get("finalizers") or [])
    )


def rejection_patch(
    claim: Obj,
    node: str,
    until: str,
    now_rfc3339: str,
    state: str,
    condition: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Add (or renew) a rejectedNodes entry with the node's state when it refused, and say
    why on the claim; expired entries are dropped on the way."""
    status = claim.get("status") or {}
    kept = [
        dict(e)
        for e in status.get("rejectedNodes") or []
        if e.get("node") != node and str(e.get("until", "")) > now_rfc3339
    ]
    body: dict[str, Any] = {
        "metadata": {"resourceVersion": meta(claim).get("resourceVersion")},
        "status": {"rejectedNodes": [*kept, {"node": node, "until": until, "nodeState": state}]},
    }
    if condition is not None:
        body["status"]["conditions"] = merge_conditions(status.get("conditions") or [], condition)
    return body


def stale_rejections(claim: Obj, states: Mapping[str, str | None]) -> list[str]:
    """Nodes of the claim's rejectedNodes entries that changed since they refused (their
    digest differs from ``states``; None: the node is gone). Entries written before the
    digest existed count as changed only when the node is gone."""
    changed = []
    for entry in (claim.get("status") or {}).get("rejectedNodes") or []:
        node = str(entry.get("node") or "")
        if node not in states:
            continue
        recorded, current = entry.get("nodeState"), states[node]
        if current is None or (recorded and recorded != current):
            changed.append(node)
    return changed


def without_rejections(claim: Obj, nodes: Sequence[str]) -> dict[str, Any] | None:
    """Drop the entries of ``nodes`` (their allocatable, taints or Ready changed)."""
    entries = (claim.get("status") or {}).get("rejectedNodes") or []
    kept = [dict(e) for e in entries if e.get("node") not in nodes]
    if len(kept) == len(entries):
        return None
    return {
        "metadata": {"resourceVersion": meta(claim).get("resourceVersion")},
        "status": {"rejectedNodes": kept},
    }


# --- WaitForFirstConsumer volumes --------------------------------------------------------


@dataclass(frozen=True)
class PodVolumes:
    """What a launcher pod's volumes say about where it may start: the node affinity of
    each bound PV, and the PVCs it waits for (not bound yet, and not bound by the scheduler
    at the pod's first scheduling, or missing)."""

    volumes: tuple[VolumeAffinity, ...] = ()
    unbound: tuple[str, ...] = ()


def pod_volumes(
    pod: Obj,
    pvc_of: Callable[[str], Obj | None],
    pv_of: Callable[[str], Obj | None],
    storage_class_of: Callable[[str], Obj | None],
) -> PodVolumes:
    """A pod's volumes as the binder's watches hold them (``pvc_of`` looks a PVC up in the
    pod's namespace): no API read, so a slow or absent API server cannot hold the gate."""
    volumes: list[VolumeAffinity] = []
    unbound: list[str] = []
    for name in pod_volume_claims(pod):
        pvc = pvc_of(name)
        if pvc is None:
            unbound.append(name)
            continue
        volume = pvc_volume_name(pvc)
        if volume is None:
            if not binds_at_first_consumer(storage_class_of(pvc_storage_class(pvc))):
                unbound.append(name)
            continue
        pv = pv_of(volume)
        if pv is None:
            unbound.append(name)  # bound to a PV not seen yet: its event comes
            continue
        affinity = volume_affinity(pv)
        if affinity is not None:
            volumes.append(affinity)
    return PodVolumes(tuple(volumes), tuple(unbound))


def volume_nodes(volumes: Iterable[VolumeAffinity], nodes: Iterable[Obj]) -> set[str] | None:
    """Nodes every volume can be used from (a PV's required node affinity, as local and
    WaitForFirstConsumer volumes have), or None when no volume limits the choice."""
    limits = list(volumes)
    if not limits:
        return None
    return {
        name_of(n)
        for n in nodes
        if all(v.admits(name_of(n), meta(n).get("labels") or {}) for v in limits)
    }
