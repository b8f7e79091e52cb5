"""The protection finalizers: when a claim or a class keeps its finalizer, what a claim
whose deletion waits for its VM is told, and when a template claim has outlived the VMI it
was made for. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import ClaimReason
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition
from cozystack_gpu.objects.patches import finalizer_patch
from cozystack_gpu.objects.translate import made_by_template, meta, template_made_for, timestamp

# --- Finalizers --------------------------------------------------------------------------


def deleting(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def class_protection(class_obj: Obj, holding_claims: int) -> dict[str, Any] | None:
    """Keep the class-protection finalizer on a live class; let a class being deleted go
    once nothing holds units of it: no claim Bound, Attached or Lost, and no reservation
    Booked, Active or Lost (``holding_claims`` counts both)."""
    if not deleting(class_obj):
        return finalizer_patch(class_obj, keys.FINALIZER_CLASS, True)
    if holding_claims == 0:
        return finalizer_patch(class_obj, keys.FINALIZER_CLASS, False)
    return None


def claim_protection(
    claim_obj: Obj, vmi_live: bool, *, owner_live: bool = False
) -> dict[str, Any] | None:
    """The claim-protection finalizer, kept as Kubernetes keeps ``kubernetes.io/pvc-protection``.

    Admission puts it on every claim at create time (SPEC.md §5), so neither a bind nor a
    VM start writes it. A live claim keeps it whatever its phase; one created before that
    (an older release) gets it once it is attached to a VMI that runs, or may still appear
    within the attachment grace, or when it is a template claim whose VMI lives
    (``owner_live``). A deleted claim keeps it while that holds, so the GPU is not pulled
    from under a VM, and loses it once nothing uses it: the one write of its deletion."""
    attached = bool((claim_obj.get("status") or {}).get("attachedTo"))
    protect = (attached and vmi_live) or owner_live
    if not deleting(claim_obj):
        return finalizer_patch(claim_obj, keys.FINALIZER_CLAIM, True) if protect else None
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


# --- Template claims that outlived their VMI ---------------------------------------------


@dataclass(frozen=True)
class TemplateLeftOver:
    """What becomes of a template claim: ``delete`` says why it goes (its VMI is gone), or
    ``judge_at`` says when it can be judged (too young: its VMI's watch event may lag)."""

    delete: str | None = None
    judge_at: float | None = None


def template_left_over(
    claim: Obj, vmi_exists: Callable[[str], bool], now: float, grace: float
) -> TemplateLeftOver | None:
    """A template claim whose VMI (by the uid it was made for, ``template_made_for``) no
    longer exists is deleted, whatever its labels and owners say now: the garbage
    collector deletes it only while its VMI ownerReference stays, and a claim left over
    would hold its GPUs with no usage record (template claims have none), or be taken by a
    later VM. ``vmi_exists`` tells whether a VMI of a uid exists in the claim's namespace.
    A claim made less than ``grace`` ago waits: the controller made it for a VMI it saw, and
    another replica's watch of VMIs may not have brought that VMI yet. None: it stays."""
    if not made_by_template(claim) or deleting(claim):
        return None
    uid = template_made_for(claim)
    if uid is not None and vmi_exists(uid):
        return None
    created = timestamp(meta(claim).get("creationTimestamp"))
    if created is not None and now < created + grace:
        return TemplateLeftOver(judge_at=created + grace)
    if uid is None:
        why = "it names no VMI it was made for (neither its annotation nor an owner)"
    else:
        why = f"VMI uid {uid}, which it was made for, is gone"
    return TemplateLeftOver(delete=why)
