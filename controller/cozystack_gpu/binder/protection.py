"""The protection finalizers: when a claim or a class keeps its finalizer, and what a claim
whose deletion waits for its VM is told. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.claim_status import condition
from cozystack_gpu.keys import ClaimReason
from cozystack_gpu.objects.patches import finalizer_patch
from cozystack_gpu.objects.translate import (
    meta,
)

Obj = Mapping[str, Any]


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
