"""Claim lifecycle rules that sit beside the model, and the bodies the binder writes.

Pure: the binder calls these with API objects and the current time. The model decides
placement (bind, move, lose, rebind); these decide attachment (Bound ⇄ Attached), what a
claim's status patch and conditions look like, which usage records should exist, and what
the settings ConfigMap says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import ClaimReason, ClassReason, NodeReason, Phase
from cozystack_gpu.model import Action, ClaimInfo, ClassStatus, Reason, Refusal, Step
from cozystack_gpu.objects import translate
from cozystack_gpu.objects.patches import ATTACHMENT_CLEARED, finalizer_patch
from cozystack_gpu.objects.translate import (
    VMIState,
    meta,
    name_of,
    namespace_of,
    rfc3339,
    timestamp,
)
from cozystack_gpu.objects.translate import node_ready as translate_node_ready

Obj = Mapping[str, Any]

# Status writes that only tell (why a claim waits, why its deletion waits, where its set
# starts): they are not placements, so they are queued behind every bind and never held in
# flight.
NOTE_WAIT = "Wait"
NOTE_DELETING = "Deleting"
NOTE_PLACED = "Placed"
NOTE_WITHDRAWN = "Withdrawn"
NOTES = frozenset({NOTE_WAIT, NOTE_DELETING, NOTE_PLACED, NOTE_WITHDRAWN})


# --- Attachment --------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachmentChange:
    phase: Phase
    clear_attachment: bool
    reason: str
    message: str
    uid: str = ""  # the VMI's uid to record with the attachment (empty: none to write)


def attachment_change(
    claim: Obj, vmi: VMIState | None, now: float, grace: float, seen_at: float | None = None
) -> AttachmentChange | None:
    """Bound → Attached once the VMI the webhook recorded runs, recording that VMI's uid;
    back to Bound (attachment cleared) once that very VMI is Succeeded or Failed, or gone. A
    deletion timestamp on the VMI changes nothing: it may still run. Another VMI of the same
    name is another start of the VM: it ends a confirmed attachment (its VMI is gone) and
    leaves an unconfirmed one waiting for its own VMI. An attachment whose VMI never
    appeared within the grace is cleared (a later admission step refused the VMI)."""
    attached = translate.attachment_of(claim)
    if attached is None:
        return None
    phase = (claim.get("status") or {}).get("phase")
    if phase not in (Phase.BOUND.value, Phase.ATTACHED.value):
        return None
    legacy = not attached.uid and not attached.attachment_id
    if vmi is None and legacy and phase == Phase.ATTACHED.value:
        verdict = translate.Verdict.GONE  # its VMI existed: once it is not seen, it is gone
    else:
        verdict = translate.attachment_verdict(attached, vmi, now, grace, seen_at, name_of(claim))
    name = attached.vmi
    if verdict is translate.Verdict.RUNS:
        assert vmi is not None
        uid = vmi.uid if not attached.uid else ""
        if phase == Phase.BOUND.value or uid:
            return AttachmentChange(
                Phase.ATTACHED, False, ClaimReason.ATTACHED, f"attached to VMI {name}", uid=uid
            )
        return None
    if verdict is translate.Verdict.STARTING:
        return None
    if verdict is translate.Verdict.FINISHED:
        assert vmi is not None
        return AttachmentChange(
            Phase.BOUND, True, ClaimReason.VMI_FINISHED, f"VMI {name} is {vmi.phase}"
        )
    if verdict is translate.Verdict.GONE:
        which = f" (uid {attached.uid})" if attached.uid else ""
        return AttachmentChange(
            Phase.BOUND, True, ClaimReason.VMI_GONE, f"VMI {name}{which} is gone"
        )
    return AttachmentChange(
        Phase.BOUND,
        True,
        ClaimReason.ATTACHMENT_EXPIRED,
        f"VMI {name} did not appear within {grace:.0f} s of its attachment",
    )


def vmi_never_ran(vmi: VMIState) -> bool:
    """A VMI not yet scheduled: it has no node, or is still Pending or Scheduling."""
    return vmi.node is None or vmi.phase in ("Pending", "Scheduling", "")


def attachment_expiry(claim: Obj, grace: float) -> float | None:
    """When an unconfirmed attachment of a Bound claim expires (to schedule a re-check)."""
    status = claim.get("status") or {}
    if status.get("phase") != Phase.BOUND.value or not status.get("attachedTo"):
        return None
    attached_at = timestamp(status.get("attachedAt"))
    return None if attached_at is None else attached_at + grace


# --- Conditions and status patches -------------------------------------------------------


def condition(type_: str, status: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        # Plain text on the wire: str() of a (str, Enum) member is "Class.MEMBER".
        "reason": reason.value if isinstance(reason, Enum) else reason,
        "message": message[:32768],
        "lastTransitionTime": rfc3339(now),
    }


def merge_conditions(
    current: Iterable[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Replace the condition of ``new``'s type, keeping its transition time when the status
    did not change, and every other writer's conditions as they are."""
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in current:
        if cond.get("type") == new["type"]:
            merged = dict(new)
            if cond.get("status") == new["status"]:
                merged["lastTransitionTime"] = cond.get(
                    "lastTransitionTime", new["lastTransitionTime"]
                )
            out.append(merged)
            replaced = True
        else:
            out.append(dict(cond))
    if not replaced:
        out.append(dict(new))
    return out


def same_condition(current: Iterable[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """True when writing ``new`` would change nothing a reader sees."""
    for cond in current:
        if cond.get("type") == new["type"]:
            return all(cond.get(k) == new[k] for k in ("status", "reason", "message"))
    return False


_ACTION_REASON = {
    Step.BIND: ClaimReason.BOUND,
    Step.MOVE: ClaimReason.MOVED,
    Step.LOSE: ClaimReason.LOST,
    Step.REBIND: ClaimReason.REBOUND,
    Step.REATTACH: ClaimReason.REATTACHED,
}


def action_condition(action: Action, updated: ClaimInfo, now: float) -> dict[str, Any]:
    reason = _ACTION_REASON.get(action.step, str(action.step))
    if action.step is Step.LOSE:
        message = f"lost its node: {action.why}" if action.why else "lost its node"
        return condition(keys.CONDITION_BOUND, False, reason, message, now)
    message = f"holds {updated.count} unit(s) of class {updated.class_name} on node {updated.node}"
    if action.why:
        message += f" ({action.why})"
    return condition(keys.CONDITION_BOUND, True, reason, message, now)


def oldest_waiting(claims: Iterable[ClaimInfo | None]) -> dict[str, float]:
    """Per class, the creation time of its oldest waiting order: of the claims a pass left
    waiting, the Pending ones (a Lost claim waiting to rebind has an alert of its own). A
    claim with no creation time known is left out rather than read as 1970."""
    oldest: dict[str, float] = {}
    for claim in claims:
        if claim is None or claim.phase is not Phase.PENDING or claim.created <= 0:
            continue
        have = oldest.get(claim.class_name)
        if have is None or claim.created < have:
            oldest[claim.class_name] = claim.created
    return oldest


def waiting_condition(refusal: Refusal, now: float) -> dict[str, Any]:
    return condition(keys.CONDITION_BOUND, False, str(refusal.reason), refusal.message, now)


def claim_status_patch(
    claim_obj: Obj, updated: ClaimInfo, cond: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A merge patch of the status fields the binder owns, with the resourceVersion the
    decision was made on, so the write fails (409) instead of acting on stale state."""
    status: dict[str, Any] = {
        "phase": updated.phase.value,
        "nodeName": updated.node,
        "boundAt": rfc3339(updated.bound_at) if updated.bound_at is not None else None,
    }
    current = claim_obj.get("status") or {}
    if updated.attached_to is None and current.get("attachedTo"):
        status.update(ATTACHMENT_CLEARED)
    conditions = list(current.get("conditions") or [])
    moved = current.get("nodeName") not in (None, updated.node)
    if moved and any(c.get("type") == keys.CONDITION_PLACED for c in conditions):
        # Placed told where the VM's launcher pod was pinned: a claim moved off that node
        # no longer says so (its next start is placed, and told, again).
        conditions = [c for c in conditions if c.get("type") != keys.CONDITION_PLACED]
        status["conditions"] = conditions
    if cond is not None:
        status["conditions"] = merge_conditions(conditions, cond)
    return {
        "metadata": {"resourceVersion": meta(claim_obj).get("resourceVersion")},
        "status": status,
    }


def attachment_fields(vmi_name: str, vmi_uid: str, now: float) -> dict[str, Any]:
    """The status fields of an attachment the controller writes itself (a template claim,
    made for one VMI whose uid it knows)."""
    return {
        "attachedTo": vmi_name,
        "attachedToUID": vmi_uid,
        "attachmentID": None,
        "attachedAt": rfc3339(now),
    }


def attachment_patch(claim_obj: Obj, change: AttachmentChange, now: float) -> dict[str, Any]:
    current = claim_obj.get("status") or {}
    status: dict[str, Any] = {"phase": change.phase.value}
    if change.clear_attachment:
        status.update(ATTACHMENT_CLEARED)
    elif change.uid:
        status["attachedToUID"] = change.uid
    cond = condition(keys.CONDITION_BOUND, True, change.reason, change.message, now)
    status["conditions"] = merge_conditions(current.get("conditions") or [], cond)
    return {
        "metadata": {"resourceVersion": meta(claim_obj).get("resourceVersion")},
        "status": status,
    }


def condition_patch(claim_obj: Obj, cond: Mapping[str, Any]) -> dict[str, Any]:
    current = claim_obj.get("status") or {}
    return {
        "metadata": {"resourceVersion": meta(claim_obj).get("resourceVersion")},
        "status": {"conditions": merge_conditions(current.get("conditions") or [], cond)},
    }


def _unbound_order(claim_obj: Obj) -> bool:
    phase = (claim_obj.get("status") or {}).get("phase")
    return not phase or phase == Phase.PENDING.value


def waiting_note_due(claim_obj: Obj, cond: Mapping[str, Any]) -> bool:
    """A waiting claim should be told (again): its reason changed, or it is an order that
    does not show the Pending phase yet."""
    status = claim_obj.get("status") or {}
    if _unbound_order(claim_obj) and status.get("phase") != Phase.PENDING.value:
        return True
    return not same_condition(status.get("conditions") or [], cond)


def waiting_patch(claim_obj: Obj, cond: Mapping[str, Any]) -> dict[str, Any]:
    """Why a claim waits; an order not bound yet also shows the phase Pending (a Lost claim
    waiting to rebind keeps its phase)."""
    body = condition_patch(claim_obj, cond)
    if _unbound_order(claim_obj):
        body["status"]["phase"] = Phase.PENDING.value
    return body


# --- Finalizers --------------------------------------------------------------------------


def deleting(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def class_protection(class_obj: Obj, holding_claims: int) -> dict[str, Any] | None:
    """Keep the class-protection finalizer on a live class; let a class being deleted go
    once no claim holds units of it (Bound, Attached or Lost)."""
    if not deleting(class_obj):
        return finalizer_patch(class_obj, keys.FINALIZER_CLASS, True)
    if holding_claims == 0:
        return finalizer_patch(class_obj, keys.FINALIZER_CLASS, False)
    return None


def claim_protection(
    claim_obj: Obj, vmi_live: bool, *, owner_live: bool = False
) -> dict[str, Any] | None:
    """Keep the claim-protection finalizer while the claim is attached to a VMI that runs
    (or may still appear, within the attachment grace), and on a template claim while the
    VMI it was made for lives (``owner_live``: it carries the finalizer from its creation),
    so deleting the claim cannot pull the GPU from under a VM; drop it once that is over."""
    attached = bool((claim_obj.get("status") or {}).get("attachedTo"))
    protect = (attached and vmi_live) or owner_live
    if protect and not deleting(claim_obj):
        return finalizer_patch(claim_obj, keys.FINALIZER_CLAIM, True)
    if not protect:
        return finalizer_patch(claim_obj, keys.FINALIZER_CLAIM, False)
    return None


def deletion_waits_condition(claim_obj: Obj, now: float) -> dict[str, Any] | None:
    """What a tenant who deleted an attached claim sees: why it is still there."""
    status = claim_obj.get("status") or {}
    vmi = status.get("attachedTo")
    if not deleting(claim_obj) or not vmi:
        return None
    return condition(
        keys.CONDITION_DELETING,
        True,
        ClaimReason.WAITING_FOR_VMI,
        f"deletion waits for VMI {vmi} to stop: its GPU stays attached until the VMI is "
        "Succeeded, Failed or deleted; then the claim and its usage record go",
        now,
    )


# --- Class status ------------------------------------------------------------------------


# The phases of claims that keep a class being deleted (they hold its units), in the order
# the class's condition names them.
KEEPING_PHASES = (Phase.BOUND, Phase.ATTACHED, Phase.LOST)


def class_status_body(
    class_obj: Obj,
    numbers: ClassStatus,
    now: float,
    keeping: Mapping[Phase, int] | None = None,
) -> dict[str, Any] | None:
    """The status a class should show, or None when it already does.

    Only free, maxFreePerNode and conditions: every authenticated user reads GPUClass, so
    no node names and no other counts go here (they go to metrics). A class being deleted
    says how many claims of which phase keep it (``keeping``): counts, never names.
    """
    current = class_obj.get("status") or {}
    if meta(class_obj).get("deletionTimestamp"):
        cond = condition(
            keys.CONDITION_AVAILABLE,
            False,
            ClassReason.DELETING,
            "the class is being deleted and takes no new orders; " + _kept_by(keeping or {}),
            now,
        )
    elif numbers.free > 0:
        cond = condition(
            keys.CONDITION_AVAILABLE,
            True,
            ClassReason.FREE,
            "units are free on nodes serving the class",
            now,
        )
    else:
        cond = condition(
            keys.CONDITION_AVAILABLE,
            False,
            ClassReason.NO_FREE_UNITS,
            "no node serving the class has a free unit",
            now,
        )
    unchanged = (
        current.get("free") == numbers.free
        and current.get("maxFreePerNode") == numbers.max_free_per_node
        and same_condition(current.get("conditions") or [], cond)
    )
    if unchanged:
        return None
    return {
        "status": {
            "free": numbers.free,
            "maxFreePerNode": numbers.max_free_per_node,
            "conditions": merge_conditions(current.get("conditions") or [], cond),
        }
    }


def _kept_by(keeping: Mapping[Phase, int]) -> str:
    counts = [(phase, keeping.get(phase, 0)) for phase in KEEPING_PHASES]
    total = sum(n for _phase, n in counts)
    if not total:
        return "no claim holds its units, so it goes now"
    each = ", ".join(f"{n} {phase.value}" for phase, n in counts if n)
    noun = "claim keeps" if total == 1 else "claims keep"
    return f"it goes once no claim holds its units: {total} {noun} it ({each})"


def withdrawal_condition(class_name: str, phase: Phase, now: float) -> dict[str, Any]:
    """What a claim of a class being deleted is told: the offer goes, and what that means
    for this claim (a hold stays while the claim does; an order is never bound)."""
    if phase is Phase.PENDING:
        then = "this order will not be bound: delete it and order another class"
    else:
        then = (
            "this claim keeps its units until it is deleted, and once released they "
            "cannot be ordered again"
        )
    return condition(
        keys.CONDITION_OFFER_WITHDRAWN,
        True,
        Reason.CLASS_DELETING.value,
        f"class {class_name} is being deleted: the hoster withdraws this offer; {then}",
        now,
    )


# --- Usage records -----------------------------------------------------------------------


def workload_name(claim_name: str) -> str:
    return ("gpuclaim-" + claim_name)[:253]


def wants_usage_record(claim_obj: Obj) -> bool:
    """One record per ordered claim while it is Bound or Attached; template claims, and
    Pending or Lost ones, have none."""
    labels = meta(claim_obj).get("labels") or {}
    if labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE:
        return False
    phase = (claim_obj.get("status") or {}).get("phase")
    return phase in (Phase.BOUND.value, Phase.ATTACHED.value)


def usage_record(claim_obj: Obj) -> dict[str, Any]:
    return {
        "apiVersion": keys.WORKLOAD_API_VERSION,
        "kind": keys.WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(name_of(claim_obj)),
            "namespace": namespace_of(claim_obj),
            # Owned by the claim: the garbage collector removes it with the claim, so no
            # monitor or reserved label has to guard it.
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND_CLAIM,
                    "name": name_of(claim_obj),
                    "uid": meta(claim_obj).get("uid"),
                    "blockOwnerDeletion": False,
                    "controller": True,
                }
            ],
        },
        "status": usage_status(claim_obj),
    }


def usage_status(claim_obj: Obj) -> dict[str, Any]:
    spec = claim_obj.get("spec") or {}
    return {
        "kind": keys.WORKLOAD_STATUS_KIND,
        "type": keys.WORKLOAD_STATUS_TYPE,
        "resources": {keys.quota_key(str(spec.get("class"))): str(int(spec.get("count") or 1))},
        "operational": True,
    }


def owned_claim_name(workload: Obj) -> str | None:
    for ref in meta(workload).get("ownerReferences") or []:
        if ref.get("kind") == keys.KIND_CLAIM and ref.get("apiVersion") == keys.API_VERSION:
            return str(ref.get("name"))
    return None


# --- Settings ----------------------------------------------------------------------------


def settings_data(names: Iterable[str], raw_policy: keys.RawNamesPolicy) -> dict[str, str]:
    """The gpu-settings ConfigMap's data: the effective GPU resource-name set and the
    raw-name policy the ValidatingAdmissionPolicies take as a parameter."""
    return {
        keys.SETTINGS_KEY_RESOURCE_NAMES: keys.format_resource_names(list(names)),
        keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: raw_policy.value,
    }


# --- GPUNode conditions ------------------------------------------------------------------


def gpunode_conditions(
    node: Obj | None, gpunode: Obj, stale: bool, stale_after: float, now: float
) -> list[dict[str, Any]]:
    """The conditions the binder keeps on a GPUNode: ``Ready`` (does the node serve GPU
    classes now, and if not why, in words a hoster can act on) and
    ``ResourceNamesAdvertised`` (does kubelet advertise every resource name the agent
    reports for the node's devices)."""
    name = name_of(gpunode)
    return [
        _ready_condition(name, node, gpunode, stale, stale_after, now),
        _names_condition(name, node, gpunode, now),
    ]


def _ready_condition(
    name: str, node: Obj | None, gpunode: Obj, stale: bool, stale_after: float, now: float
) -> dict[str, Any]:
    def not_ready(reason: str, message: str) -> dict[str, Any]:
        return condition(keys.CONDITION_READY, False, reason, message, now)

    if node is None:
        return not_ready(
            NodeReason.NODE_GONE, f"Node {name} does not exist; the GPUNode goes with it"
        )
    reported = timestamp((gpunode.get("status") or {}).get("updatedAt"))
    if reported is None:
        return not_ready(
            NodeReason.NO_INVENTORY,
            "the node agent has not reported this node yet; check that the "
            "cozystack-gpu-agent DaemonSet runs a pod on it",
        )
    if stale:
        return not_ready(
            NodeReason.INVENTORY_STALE,
            f"the node agent last reported at {rfc3339(reported)}, more than "
            f"{stale_after:.0f} s ago: its holds stay, but nothing new is placed on the "
            "node until it reports again; check the cozystack-gpu-agent pod on this node "
            "and its logs",
        )
    if not translate_node_ready(node):
        return not_ready(NodeReason.NODE_NOT_READY, f"Node {name} is not Ready")
    if (node.get("spec") or {}).get("unschedulable"):
        return not_ready(
            NodeReason.CORDONED,
            f"Node {name} is cordoned: no new order binds here; unattached holds move where "
            "their class says onCordon: Move and stay where it says Stay (a stopped VM's "
            "hold on its local disk here stays)",
        )
    state = (meta(node).get("labels") or {}).get(keys.LABEL_NODE_LAYOUT_STATE)
    if state == keys.LayoutState.PENDING.value:
        return not_ready(
            NodeReason.LAYOUT_PENDING,
            f"the GPU layout of Node {name} is being changed "
            f"({keys.LABEL_NODE_LAYOUT_STATE}=pending): it serves no class until it is applied",
        )
    if state == keys.LayoutState.FAILED.value:
        return condition(
            keys.CONDITION_READY,
            True,
            NodeReason.LAYOUT_FAILED,
            f"the last GPU layout change of Node {name} failed "
            f"({keys.LABEL_NODE_LAYOUT_STATE}=failed); the node serves what its devices "
            "advertise; rerun the host playbook to finish the layout",
            now,
        )
    return condition(
        keys.CONDITION_READY, True, NodeReason.SERVING, "the node serves GPU classes", now
    )


def _names_condition(name: str, node: Obj | None, gpunode: Obj, now: float) -> dict[str, Any]:
    advertised = set(((node or {}).get("status") or {}).get("allocatable") or {})
    missing: dict[str, list[str]] = {}
    for device in (gpunode.get("status") or {}).get("devices") or []:
        resource = device.get("resourceName")
        if resource and resource not in advertised:
            missing.setdefault(str(resource), []).append(str(device.get("pciAddress", "?")))
    if not missing:
        return condition(
            keys.CONDITION_NAMES_ADVERTISED,
            True,
            NodeReason.ADVERTISED,
            "kubelet advertises every resource name reported for the node's devices",
            now,
        )
    parts = [f"{res} ({', '.join(sorted(addrs))})" for res, addrs in sorted(missing.items())]
    return condition(
        keys.CONDITION_NAMES_ADVERTISED,
        False,
        NodeReason.NOT_ADVERTISED,
        f"kubelet does not advertise {'; '.join(parts)}: these names were predicted from "
        "sysfs and the host's pci.ids, but the device plugin names devices from the pci.ids "
        "in its own image, or it does not run yet. These devices count as 0 units. Compare "
        f"kubectl get node {name} -o jsonpath='{{.status.allocatable}}' and name classes "
        "after what kubelet advertises",
        now,
    )


def gpunode_status_patch(
    gpunode: Obj, conditions: Iterable[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """A status merge patch of the binder's conditions, or None when they already show.

    Only ``conditions`` is sent: the agent owns every other status field and merge-patches
    only those, so neither writer overwrites the other.
    """
    current = (gpunode.get("status") or {}).get("conditions") or []
    merged: list[dict[str, Any]] = [dict(c) for c in current]
    changed = False
    for cond in conditions:
        if not same_condition(merged, cond):
            merged = merge_conditions(merged, cond)
            changed = True
    return {"status": {"conditions": merged}} if changed else None
