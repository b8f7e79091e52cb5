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

A Booked window whose node goes, is cordoned (a Move class), stops serving its class or
loses capacity before the window is judged again over what is left of it: moved to a node
with room in the window, or Lost when none has, saying why. Lost reservations are placed
again first, as soon as a node has room, then the others in the order they came.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls.reservations import ReservationStatus
from cozystack_gpu.binder.parts.handle import PartHandle
from cozystack_gpu.binder.rules import reservation_status
from cozystack_gpu.model import ClaimKey, Placement
from cozystack_gpu.model.booking import at, check_booking, why_move
from cozystack_gpu.model.reservations import ReservationInfo, ReservationPhase
from cozystack_gpu.objects import MutableObj
from cozystack_gpu.objects.translate import meta

UNBOOKED = (ReservationPhase.PENDING, ReservationPhase.LOST)


class Bookings:
    def __init__(self, handle: PartHandle) -> None:
        self.handle = handle
        # Bookings sent: the reservation's version the write was built on, and the write.
        self._sent: dict[ClaimKey, tuple[str, ReservationStatus]] = {}
        # Nodes whose bookings to look at again (``nodes_changed``); all at the start.
        self._look_at: set[str] = set()
        self._look_all = True

    def held(self) -> set[ClaimKey]:
        """Reservations whose booking the snapshot keeps as sent: the view still has them
        at the version the write was built on."""
        for key, (version, _call) in list(self._sent.items()):
            obj = self.handle.view.reservations.get(key)
            if obj is None or meta(obj).get("resourceVersion") != version:
                del self._sent[key]
        return set(self._sent)

    def nodes_changed(self, nodes: Iterable[str], everything: bool = False) -> None:
        """Nodes whose bookings are looked at again (all of them after a class changed,
        or when this replica starts to lead)."""
        self._look_all |= everything
        self._look_at.update(nodes)

    def run(self, now: float) -> None:
        snap = self.handle.snapshot
        settings = self.handle.config.booking
        held = self.held()
        self._place_again(now, held)
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
            if reservation.phase is ReservationPhase.LOST:
                continue  # it stays Lost, its condition saying why, until a node has room
            body = reservation_status.waiting_patch(obj, decision, now)
            if body is not None:
                metrics.RESERVATION_DECISIONS.labels("Waiting").inc()
                call = ReservationStatus(reservation.namespace, reservation.name, body, "waiting")
                self.handle.send(call)
        # A booking whose answer never came: sent again as it was.
        for _version, call in self._sent.values():
            if not self.handle.writing(call.key):
                self.handle.send(call)

    def _place_again(self, now: float, held: set[ClaimKey]) -> None:
        """Booked windows whose node went, was cordoned, stopped serving the class or lost
        capacity: judged again over what is left of the window, the latest booked first
        (the earlier keep their node when it still takes them), and moved, or Lost."""
        snap = self.handle.snapshot
        if not (self._look_all or self._look_at):
            return
        nodes = None if self._look_all else self._look_at
        self._look_all, self._look_at = False, set()
        booked = [
            r
            for r in snap.bookings
            if r.phase is ReservationPhase.BOOKED
            and (nodes is None or r.node in nodes)
            and r.key not in held
        ]
        for reservation in sorted(booked, key=lambda r: (r.created, r.key), reverse=True):
            why = why_move(snap, reservation)
            obj = self.handle.view.reservations.get(reservation.key)
            if why is None or obj is None or self.handle.writing(_key(reservation.key)):
                continue
            decision = check_booking(
                snap, snap.bookings, reservation, now, self.handle.config.booking
            )
            if isinstance(decision, Placement):
                if decision.node != reservation.node:
                    self._book(obj, reservation, decision.node, now, moved=why)
                continue
            body = reservation_status.lost_patch(obj, why, decision, now)
            lost = replace(reservation, phase=ReservationPhase.LOST, node=None)
            self._send(obj, lost, ReservationStatus(lost.namespace, lost.name, body, "lose"))
            metrics.RESERVATION_DECISIONS.labels("Lost").inc()
            self.handle.event(
                obj,
                str(decision.reason),
                reservation_status.lost_words(why, decision),
                True,
                kind=keys.GPU_RESERVATION,
            )

    def _book(
        self,
        obj: MutableObj,
        reservation: ReservationInfo,
        node: str,
        now: float,
        moved: str | None = None,
    ) -> None:
        body = reservation_status.booked_patch(obj, reservation, node, now, moved)
        booked = replace(reservation, phase=ReservationPhase.BOOKED, node=node)
        self._send(obj, booked, ReservationStatus(booked.namespace, booked.name, body))
        words = f"booked on node {node} from {at(reservation.start)} to {at(reservation.end)}"
        reason = reservation_status.BOOKED_REASON
        if moved is not None:
            words, reason = f"{words}; moved because {moved}", reservation_status.MOVED_REASON
        metrics.RESERVATION_DECISIONS.labels(reason).inc()
        self.handle.event(obj, reason, words, False, kind=keys.GPU_RESERVATION)

    def _send(self, obj: MutableObj, decided: ReservationInfo, call: ReservationStatus) -> None:
        """Record the decision in the snapshot and send its write; the snapshot keeps it
        until the view shows the reservation at a newer version (``held``)."""
        self.handle.snapshot.windows.upsert(decided)
        self._sent[decided.key] = (str(meta(obj).get("resourceVersion") or ""), call)
        self.handle.send(call)


def _key(key: ClaimKey) -> tuple[str, str, str]:
    return (ReservationStatus.what, key.namespace, key.name)
