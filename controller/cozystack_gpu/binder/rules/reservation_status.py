"""What the binder writes on a GPUReservation: its booking, or why it waits (SPEC §11).

Pure: the reservation object and the model's answer in, a status merge patch out. Each
patch carries the resourceVersion it was built on, so a reservation changed meanwhile
answers 409 and is judged again.
"""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.model import Refusal
from cozystack_gpu.model.booking import at
from cozystack_gpu.model.reservations import ReservationInfo, ReservationPhase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition, merge_conditions, same_condition
from cozystack_gpu.objects.translate import meta, rfc3339

BOOKED_REASON = "Booked"
MOVED_REASON = "Moved"


def booked_patch(
    obj: Obj, reservation: ReservationInfo, node: str, now: float, moved: str | None = None
) -> dict[str, Any]:
    """The booking: phase Booked on ``node``, when, and a condition saying so (and why it
    moved there, for a booking placed again)."""
    words = (
        f"{reservation.count} of class {reservation.class_name} booked on node {node} from "
        f"{at(reservation.start)} to {at(reservation.end)}"
    )
    if moved is not None:
        words = f"{words}; moved because {moved}"
    reason = BOOKED_REASON if moved is None else MOVED_REASON
    cond = condition(keys.CONDITION_BOOKED, True, reason, words, now)
    status = obj.get("status") or {}
    return {
        "metadata": {"resourceVersion": meta(obj).get("resourceVersion")},
        "status": {
            "phase": ReservationPhase.BOOKED.value,
            "nodeName": node,
            "bookedAt": rfc3339(now),
            "conditions": merge_conditions(status.get("conditions") or [], cond),
        },
    }


def waiting_patch(obj: Obj, refusal: Refusal, now: float) -> dict[str, Any] | None:
    """Why a reservation is not booked (phase Pending and the model's words), or None when
    it says so already: a window admitted by a replica whose view lagged, or one whose
    class or budget changed before the binder came to it."""
    cond = condition(keys.CONDITION_BOOKED, False, str(refusal.reason), refusal.message, now)
    status = obj.get("status") or {}
    current = status.get("conditions") or []
    if status.get("phase") == ReservationPhase.PENDING.value and same_condition(current, cond):
        return None
    return {
        "metadata": {"resourceVersion": meta(obj).get("resourceVersion")},
        "status": {
            "phase": ReservationPhase.PENDING.value,
            "conditions": merge_conditions(current, cond),
        },
    }


def lost_patch(obj: Obj, why: str, refusal: Refusal, now: float) -> dict[str, Any]:
    """A booking no node has room for any more (SPEC §11): phase Lost, no node, and the
    condition saying why; the binder places it again first, as soon as a node has room."""
    cond = condition(
        keys.CONDITION_BOOKED, False, str(refusal.reason), lost_words(why, refusal), now
    )
    status = obj.get("status") or {}
    return {
        "metadata": {"resourceVersion": meta(obj).get("resourceVersion")},
        "status": {
            "phase": ReservationPhase.LOST.value,
            "nodeName": None,
            "conditions": merge_conditions(status.get("conditions") or [], cond),
        },
    }


def lost_words(why: str, refusal: Refusal) -> str:
    return f"lost: {why}, and no node has room in the window: {refusal.message}"
