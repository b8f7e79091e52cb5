"""What the binder writes when a reservation's window opens, nears its end and ends
(SPEC §11). Pure: the reservation object, its model reading and the time in; bodies and
merge patches out.

- At ``start`` a Booked reservation turns Active, and the claim of its name is made: owned
  by it (deleting the reservation deletes the claim), labelled with its name, protected by
  the claim finalizer like any held claim, ordering its class and count. The binder then
  binds that claim onto the booked node.
- At ``end - warnBefore`` the Ending condition says when the window ends.
- At ``end`` the VMs using the claim are halted, the claim deleted and the phase Ended.

Every patch carries the resourceVersion it was built on: a reservation changed meanwhile
answers 409 and is looked at again.
"""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.model.booking import at, span
from cozystack_gpu.model.reservations import ReservationInfo, ReservationPhase
from cozystack_gpu.objects import Obj, translate
from cozystack_gpu.objects.conditions import condition, merge_conditions
from cozystack_gpu.objects.translate import meta, name_of, namespace_of

ACTIVE_REASON = "WindowOpen"
ENDING_REASON = "WindowEnding"
ENDED_REASON = "WindowEnded"
CLAIM_TAKEN_REASON = "ClaimNameTaken"

# A VirtualMachine halted at the window's end: runStrategy Halted, and ``running`` (the
# older field, which may not be set beside runStrategy) taken away.
HALT_PATCH: dict[str, Any] = {"spec": {"running": None, "runStrategy": "Halted"}}


def window_claim(reservation: Obj, info: ReservationInfo) -> dict[str, Any]:
    """The GPUClaim a reservation makes at its start: of its name, owned by it (the garbage
    collector deletes it with the reservation), labelled with its name (the claim webhook
    admits it without the order check: its units were booked with the window) and
    protected from its creation on, like a held claim a VM may start with."""
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {
            "name": info.name,
            "namespace": info.namespace,
            "labels": {keys.LABEL_RESERVATION: info.name},
            "finalizers": [keys.FINALIZER_CLAIM],
            "ownerReferences": [
                {
                    "apiVersion": keys.GPU_RESERVATION.api_version,
                    "kind": keys.GPU_RESERVATION.kind,
                    "name": info.name,
                    "uid": str(meta(reservation).get("uid") or ""),
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {"class": info.class_name, "count": info.count},
    }


def made_by(claim: Obj, reservation: Obj) -> bool:
    """Whether the claim is the one this very reservation made (its label, and its owner by
    uid), not a tenant's order of the same name nor one an earlier reservation of the name
    made."""
    uid = translate.window_reservation_uid(claim)
    return uid is not None and uid == meta(reservation).get("uid")


def name_taken(claim: Obj, info: ReservationInfo) -> str:
    """Why the window has no claim: another GPUClaim has its name."""
    return (
        f"GPUClaim {name_of(claim)} exists in namespace {namespace_of(claim)} and is not the "
        f"one this reservation makes at its start, so the window's {info.count} of class "
        f"{info.class_name} on node {info.node} cannot be handed to a VM: delete that claim, "
        "and the window's claim is made at once"
    )


def _patch(obj: Obj, status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"resourceVersion": meta(obj).get("resourceVersion")}, "status": status}


def _conditions(obj: Obj, *new: dict[str, Any]) -> list[dict[str, Any]]:
    conditions = list((obj.get("status") or {}).get("conditions") or [])
    for cond in new:
        conditions = merge_conditions(conditions, cond)
    return conditions


def active_patch(obj: Obj, info: ReservationInfo, now: float) -> dict[str, Any]:
    """The window is open: phase Active, and the Booked condition saying what it holds."""
    words = (
        f"the window is open until {at(info.end)}: GPUClaim {info.name} holds {info.count} of "
        f"class {info.class_name} on node {info.node}; name it in a VM's claims"
    )
    cond = condition(keys.CONDITION_BOOKED, True, ACTIVE_REASON, words, now)
    return _patch(
        obj, {"phase": ReservationPhase.ACTIVE.value, "conditions": _conditions(obj, cond)}
    )


def ending_words(info: ReservationInfo, now: float) -> str:
    return (
        f"the window ends at {at(info.end)}, in {span(max(info.end - now, 0))}: the VMs "
        f"using GPUClaim {info.name} are stopped then (runStrategy Halted) and the claim is "
        "deleted; save their work before"
    )


def ending_patch(obj: Obj, info: ReservationInfo, now: float) -> dict[str, Any]:
    """The Ending condition, ``warnBefore`` ahead of the end."""
    cond = condition(keys.CONDITION_ENDING, True, ENDING_REASON, ending_words(info, now), now)
    return _patch(obj, {"conditions": _conditions(obj, cond)})


def warned(obj: Obj) -> bool:
    """Whether the Ending condition says so already."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == keys.CONDITION_ENDING:
            return bool(cond.get("status") == "True")
    return False


def ended_words(info: ReservationInfo) -> str:
    """What the end did, by what the reservation was when it came."""
    if info.phase in (ReservationPhase.BOOKED, ReservationPhase.ACTIVE):
        return (
            f"the window ended at {at(info.end)}: the VMs using GPUClaim {info.name} were "
            "stopped and the claim deleted"
        )
    return f"the window ended at {at(info.end)} while the reservation was {info.phase.value}"


def ended_patch(obj: Obj, info: ReservationInfo, now: float) -> dict[str, Any]:
    """Phase Ended: the window holds nothing any more."""
    booked = condition(keys.CONDITION_BOOKED, False, ENDED_REASON, ended_words(info), now)
    ending = condition(keys.CONDITION_ENDING, False, ENDED_REASON, ended_words(info), now)
    return _patch(
        obj,
        {"phase": ReservationPhase.ENDED.value, "conditions": _conditions(obj, booked, ending)},
    )


def taken_patch(obj: Obj, words: str, now: float) -> dict[str, Any] | None:
    """The Booked condition saying another claim has the window's name; None when it says
    so already."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == keys.CONDITION_BOOKED and cond.get("reason") == CLAIM_TAKEN_REASON:
            return None
    cond = condition(keys.CONDITION_BOOKED, True, CLAIM_TAKEN_REASON, words, now)
    return _patch(obj, {"conditions": _conditions(obj, cond)})


def bound_words(info: ReservationInfo) -> str:
    return (
        f"holds {info.count} unit(s) of class {info.class_name} on node {info.node} for "
        f"GPUReservation {info.name}'s window, until {at(info.end)}"
    )
