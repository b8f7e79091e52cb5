"""The GPUClaim webhook's rules: an order is judged at create time, the spec never changes.

An order is judged by the model's ``set_placement.check_order`` against this replica's
read-only snapshot (budgets and capacity), so the tenant reads the binder's own sentence
("tenant-a has 2 of 2 gpu.cozystack.io/l40s-24c in use; the order needs 1 more") at
``kubectl apply`` time instead of a claim waiting Pending. The binder judges again in its
single loop, so a replica whose watches lag can at worst admit an order that then waits.

Template claims (label ``gpu.cozystack.io/template-claim``) are the controller's own,
created for a VMI at start and judged with the VMI's whole set when its launcher pod is
placed; they are admitted without the check, but only as what they claim to be: owned by a
VMI. Only the controller creates them: the chart's protection policy
(templates/protection-policy.yaml) refuses the label on a claim anyone else creates.

A window's claim (label ``gpu.cozystack.io/reservation``) is made by the controller at a
GPUReservation's start, of the reservation's name and owned by it; its units were booked
with the window, so it is admitted without the check, but only as what it claims to be
(and the protection policy refuses the label on a claim anyone else creates).

Pure: no kopf, no client; the snapshot is passed in.
"""

from __future__ import annotations

from dataclasses import replace

from cozystack_gpu import keys
from cozystack_gpu.model import Refusal, Snapshot, set_placement
from cozystack_gpu.model.booking import check_booking
from cozystack_gpu.model.reservations import BookingSettings, ReservationPhase
from cozystack_gpu.objects import Obj, translate
from cozystack_gpu.objects.translate import meta

SPEC_IMMUTABLE = "spec is immutable; delete the claim and order a new one"


def is_template(claim: Obj) -> bool:
    labels = meta(claim).get("labels") or {}
    return labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE


def template_refusal(claim: Obj) -> str | None:
    """A claim labelled as a template must be owned by a VMI, as the controller makes them:
    the label alone would let an order skip the create-time check."""
    for ref in meta(claim).get("ownerReferences") or []:
        if ref.get("kind") == keys.VMI.kind:
            return None
    return (
        f"GPUClaim {meta(claim).get('name', '')} is labelled {keys.LABEL_TEMPLATE_CLAIM}, "
        "which marks the claims the controller creates from a VMI's claimTemplates; such "
        "a claim is owned by its VirtualMachineInstance. Remove the label to order a claim"
    )


def has_window_label(claim: Obj) -> bool:
    return keys.LABEL_RESERVATION in (meta(claim).get("labels") or {})


def window_label_refusal(claim: Obj) -> str | None:
    """A claim labelled as a window's must be owned by the GPUReservation of its name, as
    the controller makes them: the label alone would let an order skip the check."""
    if translate.is_window_claim(claim):
        return None
    name = str(meta(claim).get("name", ""))
    return (
        f"GPUClaim {name} is labelled {keys.LABEL_RESERVATION}, which marks the claim the "
        "controller makes when a GPUReservation's window opens; such a claim has the "
        "reservation's name and is owned by it. Remove the label to order a claim, or book "
        "a window with a GPUReservation"
    )


def order_refusal(snapshot: Snapshot, claim: Obj, now: float) -> Refusal | None:
    """The model's refusal of a new order, or None when it fits now.

    The claim is judged as an order (Pending), whatever status the request carries.
    """
    info = translate.claim_info(claim, vmi_live_now=False, set_id=None)
    info = replace(info, phase=keys.Phase.PENDING, node=None, attached_to=None, rejected=())
    decision = set_placement.check_order(snapshot, info, now)
    return decision if isinstance(decision, Refusal) else None


def booking_refusal(
    snapshot: Snapshot, reservation: Obj, now: float, settings: BookingSettings
) -> Refusal | None:
    """The model's refusal of a new reservation (SPEC §11), or None when its window fits:
    judged as a new booking (Pending, on no node), whatever status the request carries.
    A refusal for short capacity or budget names the earliest window that fits. The
    window must be readable (``unreadable_window`` first)."""
    info = translate.reservation_info(reservation)
    if info is None:
        raise ValueError("booking_refusal: the window cannot be read")
    info = replace(info, phase=ReservationPhase.PENDING, node=None)
    decision = check_booking(snapshot, snapshot.bookings, info, now, settings)
    return decision if isinstance(decision, Refusal) else None


def unreadable_window(reservation: Obj) -> str | None:
    """Why a reservation's window cannot be read, or None. The CRD's rules refuse such a
    window before any webhook is called; this answers the rest, should they be dropped."""
    if translate.reservation_info(reservation) is not None:
        return None
    return (
        "spec.start and spec.end must be RFC 3339 times on whole minutes (seconds 00), "
        "start before end, e.g. start: 2027-01-04T09:00:00Z, end: 2027-01-04T18:00:00Z"
    )


def update_refusal(old: Obj, new: Obj) -> tuple[str, keys.AdmissionReason] | None:
    """What an update may not change, with its reason: the spec (the CRD's CEL rule says
    the same, in the same words), and whether the claim is a template claim."""
    if (old.get("spec") or {}) != (new.get("spec") or {}):
        return SPEC_IMMUTABLE, keys.AdmissionReason.SPEC_IMMUTABLE
    if is_template(old) != is_template(new):
        return (
            f"label {keys.LABEL_TEMPLATE_CLAIM} cannot be added to or removed from an "
            "existing claim",
            keys.AdmissionReason.TEMPLATE_LABEL_MISUSED,
        )
    if has_window_label(old) != has_window_label(new):
        return (
            f"label {keys.LABEL_RESERVATION} cannot be added to or removed from an existing claim",
            keys.AdmissionReason.WINDOW_LABEL_MISUSED,
        )
    return None
