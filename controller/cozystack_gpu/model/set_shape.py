"""Is a VM's set of claims one that can be placed at all, whatever the nodes hold? The rule
alone, so the VMI webhook (at admission, from the objects) and the snapshot (at placement,
from the model's classes) refuse the same sets with the same words.

A set is refused when a member's class does not exist, when a new order (not a unit already
held) is of a class being deleted, when it asks for more than one vGPU class (a VM takes one
vGPU profile), or, where maxCount is judged, when it asks for more units of a class than
the class's maxCount allows per VM. The VMI webhook judges it for every start (the VM uses
the whole set); the snapshot only for a set with a new order in it: a move or rebind of
units already held is judged by capacity alone, so a hold is not refused for what the
largest node became.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cozystack_gpu.keys import Mode
from cozystack_gpu.model.types import Reason, Refusal


@dataclass(frozen=True, slots=True)
class SetMember:
    """One claim (or claim template) of the set. ``label`` is how a refusal names it
    ("GPUClaim a", "claim template gpu"; "" where the class alone is clear); ``order`` says
    it is a new order rather than units already held."""

    class_name: str
    count: int
    order: bool
    label: str = ""


@dataclass(frozen=True, slots=True)
class ClassShape:
    """What the rule reads of a class: its mode, whether it is being deleted, and its
    maxCount resolved (None where it cannot be known yet: a passthrough class without
    maxCount before its nodes are known)."""

    mode: Mode
    deleting: bool
    max_count: int | None


def units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def judge_set_shape(
    members: Sequence[SetMember], classes: Mapping[str, ClassShape], *, max_count: bool
) -> tuple[dict[str, int], Refusal | None]:
    """The set's demand (units by class) and the first refusal of its shape, or None."""
    demand: dict[str, int] = {}
    for member in members:
        shape = classes.get(member.class_name)
        if shape is None:
            of = f" of {member.label}" if member.label else ""
            message = f"class {member.class_name}{of} does not exist"
            return demand, Refusal(Reason.CLASS_MISSING, message)
        if shape.deleting and member.order:
            where = f" ({member.label})" if member.label else ""
            message = f"class {member.class_name} is being deleted and takes no new orders{where}"
            return demand, Refusal(Reason.CLASS_DELETING, message)
        demand[member.class_name] = demand.get(member.class_name, 0) + member.count
    vgpu = sorted(name for name in demand if classes[name].mode is Mode.VGPU)
    if len(vgpu) > 1:
        message = f"a VM takes one vGPU class; the set asks for {', '.join(vgpu)}"
        return demand, Refusal(Reason.VGPU_CLASSES_MIXED, message)
    if max_count:
        for name in sorted(demand):
            limit = classes[name].max_count
            if limit is not None and limit > 0 and demand[name] > limit:
                message = (
                    f"class {name} allows at most {units(limit)} per VM; "
                    f"the set asks for {demand[name]}"
                )
                return demand, Refusal(Reason.MAX_COUNT_EXCEEDED, message)
    return demand, None
