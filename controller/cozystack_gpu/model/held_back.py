"""What booked windows keep from orders, kept beside the snapshot's free units.

A snapshot's reservations (``Bookings``) hold units over their windows. An order holds
from now on, so it may take a node's free units less the most the windows booked there
hold at any moment from now on, and a budget's room less the most the windows under it
count (``booking.order_headroom`` and ``booking.budget_headroom``). Those two are kept
here per node and per budget count, worked out again only where a reservation, or the
claim an Active window made, changes: an order decision reads them as it reads free units.
They need no clock (``booking.held_back_on_node``): the binder ends every window at its
end, and the cluster view forgets one whose end has passed even before it does.

The snapshot keeps two class indexes: by free units (a booking reads those) and by the units
an order may take, these taken off (order decisions read those, at today's cost).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from cozystack_gpu.model.booking import held_back_on_node, held_back_under
from cozystack_gpu.model.reservations import (
    Bookings,
    Mark,
    NodeMark,
    ReservationInfo,
    ReservationPhase,
)
from cozystack_gpu.model.types import ClaimKey

if TYPE_CHECKING:
    from cozystack_gpu.model.snapshot import Snapshot


class HeldBack:
    """A snapshot's reservations and what orders must leave free for them."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap
        self.bookings = Bookings()
        # resource name -> node -> units orders must leave free there (no zero rows).
        self.nodes: dict[str, dict[str, int]] = {}

    def on_node(self, node: str, resource: str) -> int:
        rows = self.nodes.get(resource)
        return rows.get(node, 0) if rows else 0

    def get(self, key: ClaimKey) -> ReservationInfo | None:
        return self.bookings.get(key)

    def of_class(self, class_name: str) -> int:
        """Reservations of the class that hold a window (Booked, Active or Lost): they keep
        a class being deleted, as its holds do."""
        keys = self.bookings.keys_of(class_name=class_name)
        return sum(1 for key in keys if (r := self.bookings.get(key)) and r.counts_budget)

    # --- changes ---------------------------------------------------------------------------

    def upsert(self, reservation: ReservationInfo) -> None:
        marks = self.bookings.marks(reservation.key)
        self.bookings.upsert(reservation, self.snap)
        self._again(marks | self.bookings.marks(reservation.key))

    def remove(self, key: ClaimKey) -> None:
        marks = self.bookings.marks(key)
        self.bookings.remove(key)
        self._again(marks)

    def recharge(self, *, namespace: str | None = None, class_name: str | None = None) -> None:
        """Reservations of a namespace whose tenants changed, or of a class whose resource
        name changed, counted again."""
        keys = self.bookings.keys_of(namespace=namespace, class_name=class_name)
        if not keys:
            return
        marks: set[Mark] = set()
        for key in keys:
            marks |= self.bookings.marks(key)
        self.bookings.recharge(self.snap, namespace=namespace, class_name=class_name)
        for key in keys:
            marks |= self.bookings.marks(key)
        self._again(marks)

    def claim_changed(self, key: ClaimKey) -> None:
        """An Active window's claim came, changed or went: what it stands for changed."""
        reservation = self.bookings.get(key)
        if reservation is not None and reservation.phase is ReservationPhase.ACTIVE:
            self._again(self.bookings.marks(key))

    def _again(self, marks: Iterable[Mark]) -> None:
        """Work out again what orders must leave free where these holds count."""
        for mark in marks:
            if isinstance(mark, NodeMark):
                units = held_back_on_node(self.snap, self.bookings, mark.node, mark.resource)
                rows = self.nodes.setdefault(mark.resource, {})
                before = rows.get(mark.node, 0)
                if units:
                    rows[mark.node] = units
                else:
                    rows.pop(mark.node, None)
                if not rows:
                    del self.nodes[mark.resource]
                if units != before:
                    self.snap._refresh_free(mark.node, mark.resource)  # its order units move
            else:
                units = held_back_under(self.snap, self.bookings, *mark)
                self.snap._ledger.set_booked(mark.tenant, mark.tally, mark.inner, units)
