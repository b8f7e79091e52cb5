"""A claim's attachment to a VMI, and whether that VMI runs, may still appear, or has
ended: what the binder judges attachments by."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import VMIState, name_of, timestamp


@dataclass(frozen=True)
class Attachment:
    """A claim's attachment: the VMI's name, its uid once the controller recorded it, the
    id an earlier release's VMI webhook wrote with it (and into the VMI), and when it was
    written."""

    vmi: str
    uid: str
    attachment_id: str
    at: float | None

    @property
    def confirmed(self) -> bool:
        return bool(self.uid)

    @property
    def token(self) -> tuple[str, str, str]:
        """What changes when the attachment is written anew (a new start, or the uid)."""
        return (self.vmi, self.attachment_id, str(self.at))


def attachment_of(claim: Obj) -> Attachment | None:
    status = claim.get("status") or {}
    target = status.get("attachedTo")
    if not target:
        return None
    return Attachment(
        vmi=str(target),
        uid=str(status.get("attachedToUID") or ""),
        attachment_id=str(status.get("attachmentID") or ""),
        at=timestamp(status.get("attachedAt")),
    )


class Verdict(Enum):
    """Where a claim's attachment stands against the VMI of that name the binder sees."""

    RUNS = "runs"  # that very VMI exists and is not final
    STARTING = "starting"  # not seen yet (or only another VMI of that name), within the grace
    FINISHED = "finished"  # that very VMI is Succeeded or Failed
    GONE = "gone"  # that VMI was seen and is gone (or replaced by another of the same name)
    EXPIRED = "expired"  # never seen within the grace: a later admission step refused it


def same_vmi(attached: Attachment, vmi: VMIState) -> bool | None:
    """Is ``vmi`` the incarnation the attachment names? True or False when the attachment
    says (by uid, else by the webhook's attachment id); None for an attachment that carries
    neither (written before either existed): the name is all there is."""
    if attached.uid:
        return vmi.uid == attached.uid
    if attached.attachment_id:
        return vmi.attachment_id == attached.attachment_id
    return None


def attachment_verdict(
    attached: Attachment,
    vmi: VMIState | None,
    now: float,
    grace: float,
    seen_at: float | None,
    claim_name: str = "",
) -> Verdict:
    """Whether the attachment's VMI runs, may still appear, or has ended.

    A VMI is known by its uid once the controller has recorded it: only the end of that VMI
    ends the attachment, so a stop and a start of the same VM racing each other never clear
    the new start's claims. An attachment written by an earlier release's VMI webhook
    carries its attachment id instead, which says which VMI it was admitted with. Another
    VMI of the same name is no answer within the grace (the view may lag behind the
    attachment); after it, the attached VMI is gone.

    The grace counts from the later of the webhook's ``attachedAt`` and ``seen_at`` (when
    this binder first saw the attachment): a webhook replica whose clock runs behind the
    leader's must not make a starting VM's attachment expire early.
    """
    if vmi is not None:
        same = same_vmi(attached, vmi)
        if same is None or same:
            return Verdict.FINISHED if vmi.final else Verdict.RUNS
        if attached.confirmed and claim_name not in vmi.held_claims:
            return Verdict.GONE  # a VMI of that name that does not hold the claim
        # Another VMI of that name that names this claim: the next start of the VM (the
        # binder attaches it once this attachment is cleared), or an older one in a view
        # that lags (a new leader's first listing). Within the grace of the attachment, or
        # of this binder's first look at it, the view may still bring the attached one;
        # after it, that VMI is gone. A restart after a long run is judged at once.
    elif attached.confirmed:
        return Verdict.GONE
    starts = [t for t in (attached.at, seen_at) if t is not None]
    if starts and now < max(starts) + grace:
        return Verdict.STARTING
    return Verdict.GONE if attached.confirmed else Verdict.EXPIRED


LIVE_VERDICTS = frozenset({Verdict.RUNS, Verdict.STARTING})


def vmi_live(
    claim: Obj, vmi: VMIState | None, now: float, grace: float, seen_at: float | None = None
) -> bool:
    """The VMI a claim is attached to runs, or may still appear (``attachment_verdict``).

    An Attached or Lost claim whose attachment carries neither uid nor attachment id (written
    before this controller recorded them) keeps the old rule: its VMI existed, so once no VMI
    of that name is seen it is gone.
    """
    attached = attachment_of(claim)
    if attached is None:
        return False
    phase = (claim.get("status") or {}).get("phase")
    legacy = not attached.uid and not attached.attachment_id
    if vmi is None and legacy and phase != Phase.BOUND.value:
        return False
    verdict = attachment_verdict(attached, vmi, now, grace, seen_at, name_of(claim))
    return verdict in LIVE_VERDICTS


def being_deleted(claim_name: str) -> str:
    """Why a VM cannot start on a claim being deleted (the webhook's refusal and the gate's
    note say the same)."""
    return (
        f"GPUClaim {claim_name} is being deleted; remove it from the VM's "
        f"{keys.ANNOTATION_CLAIMS} annotation, or order another claim"
    )


def attached_elsewhere(claim_name: str, attached_to: str) -> str:
    """Why a VM cannot have a claim another VMI holds (the webhook's refusal and the gate's
    note say the same)."""
    return (
        f"GPUClaim {claim_name} is attached to VirtualMachineInstance {attached_to}; a "
        "claim serves one VM at a time: stop that VM, or order another claim"
    )
