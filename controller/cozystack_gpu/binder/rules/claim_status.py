"""A claim's status as the binder writes it: conditions, the status patch of a decision,
an attachment's fields, and the notes that only tell (why it waits, where its set starts).
Pure: API objects and the time in, merge patches out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.rules.attachment import AttachmentChange
from cozystack_gpu.keys import ClaimReason, Phase
from cozystack_gpu.model import Action, ClaimInfo, Refusal, Step
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition, merge_conditions, same_condition
from cozystack_gpu.objects.patches import ATTACHMENT_CLEARED, attachment
from cozystack_gpu.objects.translate import meta, rfc3339

# --- Conditions and status patches -------------------------------------------------------


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
    if updated.migration is None and current.get("migration"):
        status["migration"] = None  # a rebind ends a migration's target (SPEC §12)
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
    return attachment(vmi_name, uid=vmi_uid, at=rfc3339(now))


def attachment_patch(claim_obj: Obj, change: AttachmentChange, now: float) -> dict[str, Any]:
    current = claim_obj.get("status") or {}
    status: dict[str, Any] = {"phase": change.phase.value}
    if change.clear_attachment:
        status.update(ATTACHMENT_CLEARED)
    elif change.attach_to:
        status.update(attachment_fields(change.attach_to, change.uid, now))
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
