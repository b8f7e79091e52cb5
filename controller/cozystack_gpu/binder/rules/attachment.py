"""When a claim is attached to its VMI and when it is not: the Bound <-> Attached rule the
binder's attachments part applies (pure: API objects and the time in, a change out)."""

from __future__ import annotations

from dataclasses import dataclass

from cozystack_gpu.keys import ClaimReason, Phase
from cozystack_gpu.objects import Obj, attachment
from cozystack_gpu.objects.translate import VMIState, made_by_template, meta, name_of, timestamp

# --- Attachment --------------------------------------------------------------------------


@dataclass(frozen=True)
class AttachmentChange:
    phase: Phase
    clear_attachment: bool
    reason: str
    message: str
    uid: str = ""  # the VMI's uid to record with the attachment (empty: none to write)
    attach_to: str = ""  # the VMI to attach the claim to (empty: the attachment stays)


def attachment_change(
    claim: Obj, vmi: VMIState | None, now: float, grace: float, seen_at: float | None = None
) -> AttachmentChange | None:
    """Bound → Attached once the VMI the webhook recorded runs, recording that VMI's uid;
    back to Bound (attachment cleared) once that very VMI is Succeeded or Failed, or gone. A
    deletion timestamp on the VMI changes nothing: it may still run. Another VMI of the same
    name is another start of the VM: it ends a confirmed attachment (its VMI is gone) and
    leaves an unconfirmed one waiting for its own VMI. An attachment whose VMI never
    appeared within the grace is cleared (a later admission step refused the VMI)."""
    attached = attachment.attachment_of(claim)
    if attached is None:
        return None
    phase = (claim.get("status") or {}).get("phase")
    if phase not in (Phase.BOUND.value, Phase.ATTACHED.value):
        return None
    legacy = not attached.uid and not attached.attachment_id
    if vmi is None and legacy and phase == Phase.ATTACHED.value:
        verdict = attachment.Verdict.GONE  # its VMI existed: once it is not seen, it is gone
    else:
        verdict = attachment.attachment_verdict(attached, vmi, now, grace, seen_at, name_of(claim))
    name = attached.vmi
    if verdict is attachment.Verdict.RUNS:
        assert vmi is not None
        uid = vmi.uid if not attached.uid else ""
        if phase == Phase.BOUND.value or uid:
            return AttachmentChange(
                Phase.ATTACHED, False, ClaimReason.ATTACHED, f"attached to VMI {name}", uid=uid
            )
        return None
    if verdict is attachment.Verdict.STARTING:
        return None
    if verdict is attachment.Verdict.FINISHED:
        assert vmi is not None
        return AttachmentChange(
            Phase.BOUND, True, ClaimReason.VMI_FINISHED, f"VMI {name} is {vmi.phase}"
        )
    if verdict is attachment.Verdict.GONE:
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


def start_attachment(claim: Obj | None, vmi: VMIState) -> AttachmentChange | None:
    """Attach a Bound claim that no VMI holds to the live VMI that names it (by uid).

    The binder writes every attachment (SPEC §7): the VMI webhook only judges, so a review
    that did not come from the API server changes nothing. A claim attached elsewhere, being
    deleted, or not Bound stays as it is (the gate says why the VM waits); a template claim
    is the gate's to attach, in the write that binds it.
    """
    if claim is None or vmi.final or not vmi.uid or made_by_template(claim):
        return None
    if meta(claim).get("deletionTimestamp"):
        return None
    status = claim.get("status") or {}
    if status.get("attachedTo") or status.get("phase") != Phase.BOUND.value:
        return None
    return AttachmentChange(
        Phase.ATTACHED,
        False,
        ClaimReason.ATTACHED,
        f"attached to VMI {vmi.name}",
        uid=vmi.uid,
        attach_to=vmi.name,
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
