"""A GPUClass's status (free units, what keeps a class being deleted) and the condition
its tenants' claims get while it is withdrawn. Pure."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import ClassReason, Phase
from cozystack_gpu.model import ClassStatus, Reason
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition, merge_conditions, same_condition
from cozystack_gpu.objects.translate import meta

# --- Class status ------------------------------------------------------------------------


# The phases of claims that keep a class being deleted (they hold its units).
KEEPING_PHASES = (Phase.BOUND, Phase.ATTACHED, Phase.LOST)


def class_status_body(
    class_obj: Obj,
    numbers: ClassStatus,
    now: float,
    kept: bool = False,
) -> dict[str, Any] | None:
    """The status a class should show, or None when it already does.

    Only free, maxFreePerNode and conditions: every authenticated user reads GPUClass, so
    no node names and no other counts go here (they go to metrics). A class being deleted
    says whether claims still hold its units (``kept``): neither names nor counts.
    """
    current = class_obj.get("status") or {}
    if meta(class_obj).get("deletionTimestamp"):
        cond = condition(
            keys.CONDITION_AVAILABLE,
            False,
            ClassReason.DELETING,
            "the class is being deleted and takes no new orders; " + _kept_by(kept),
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


def _kept_by(kept: bool) -> str:
    if not kept:
        return "no claim holds its units, so it goes now"
    return "claims still hold units of this class, and it is removed once none does"


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
