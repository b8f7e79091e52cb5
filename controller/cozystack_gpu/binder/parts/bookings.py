"""The binder's bookings (SPEC §11): each reservation not yet booked is judged in the single
loop, as orders are, and booked on one node.

The webhook judged the window at create time on its replica's snapshot; the binder judges
it again on its own, so a window admitted by a lagging replica, or one whose class or budget
changed before the binder came to it, waits with the model's words instead of being booked
short. A booking is recorded in the snapshot when its write is sent, so the rest of the turn
(the orders, the next bookings) judges beside it. It stays there until the view shows the
reservation at a newer version: the booking written, or the reservation as it is now after
a refusal, judged again. A booking whose answer was lost is sent again, guarded by the same
version: if the first landed, the second is refused and the view catches up.

Lost reservations (their node went before the window) are placed first, then the others in
the order they came.
"""

from __future__ import annotations

from dataclasses import replace

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.reservations import ReservationStatus
from cozystack_gpu.binder.parts.handle import PartHandle
from cozystack_gpu.binder.rules import reservation_status
from cozystack_gpu.model import ClaimKey, Placement
from cozystack_gpu.model.booking import at, check_booking
from cozystack_gpu.model.reservations import ReservationInfo, ReservationPhase
from cozystack_gpu.objects import MutableObj
from cozystack_gpu.objects.translate import meta

UNBOOKED = (ReservationPhase.PENDING, ReservationPhase.LOST)


class Bookings:
    def __init__(self, handle: PartHandle) -> None:
        self.handle = handle
        # Bookings sent: the reservation's version the write was built on, and the write.
        self._sent: dict[ClaimKey, tuple[str, ReservationStatus]] = {}

    def held(self) -> set[ClaimKey]:
        """Reservations whose booking the snapshot keeps as sent: the view still has them
        at the version the write was built on."""
        for key, (version, _call) in list(self._sent.items()):
            obj = self.handle.view.reservations.get(key)
            if obj is None or meta(obj).get("resourceVersion") != version:
                del self._sent[key]
        return set(self._sent)

    def run(self, now: float) -> None:
        snap = self.handle.snapshot
        settings = self.handle.config.booking
        held = self.held()
        unbooked = sorted(
            (r for r in snap.bookings if r.phase in UNBOOKED and r.key not in held),
            key=lambda r: (r.phase is not ReservationPhase.LOST, r.created, r.key),
        )
        for reservation in unbooked:
            obj = self.handle.view.reservations.get(reservation.key)
            if obj is None or self.handle.writing(_key(reservation.key)):
                continue
            decision = check_booking(snap, snap.bookings, reservation, now, settings)
            if isinstance(decision, Placement):
                self._book(obj, reservation, decision.node, now)
                continue
            body = reservation_status.waiting_patch(obj, decision, now)
            if body is not None:
                call = ReservationStatus(reservation.namespace, reservation.name, body, "waiting")
                self.handle.send(call)
        # A booking whose answer never came: sent again as it was.
        for _version, call in self._sent.values():
            if not self.handle.writing(call.key):
                self.handle.send(call)

    def _book(self, obj: MutableObj, reservation: ReservationInfo, node: str, now: float) -> None:
        body = reservation_status.booked_patch(obj, reservation, node, now)
        call = ReservationStatus(reservation.namespace, reservation.name, body)
        self.handle.snapshot.windows.upsert(
            replace(reservation, phase=ReservationPhase.BOOKED, node=node)
        )
        self._sent[reservation.key] = (str(meta(obj).get("resourceVersion") or ""), call)
        self.handle.send(call)
        self.handle.event(
            obj,
            reservation_status.BOOKED_REASON,
            f"booked on node {node} from {at(reservation.start)} to {at(reservation.end)}",
            False,
            kind=keys.GPU_RESERVATION,
        )


def _key(key: ClaimKey) -> tuple[str, str, str]:
    return (ReservationStatus.what, key.namespace, key.name)
