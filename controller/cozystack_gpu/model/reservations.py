"""Reservations: GPUs of a class booked on one node for a window ``[start, end)`` (SPEC §11),
and the index of what they hold over time.

A ``ReservationInfo`` is a GPUReservation as the binder sees it. ``Bookings`` keeps, one
watch event at a time, the units reservations hold per node and resource name and per
tenant and budget key, each as a ``Timeline``, so a booking decision reads the busiest
moment of a window without walking the reservations. Judging a booking is in ``booking``.

What a reservation holds, by phase (as a claim's phase says what it holds, see
``ClaimInfo``):

- ``Booked`` and ``Active``: its units on its node over its window, and against every
  budget key of its class on its namespace and each tenant above, over its window.
- ``Lost`` (its node went and no node had room): the budget only, so placing it again
  never fails on a budget, as a Lost claim's rebind never does.
- ``Pending`` (being judged) and ``Ended``: nothing.

The claim an Active reservation makes at its start (of the reservation's name, Bound on
its node) is counted by the snapshot as a hold from now on; ``booking`` gives those units
back while the window lasts, so a window and its claim are counted once.

Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import math
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from cozystack_gpu.model._index import discard_member
from cozystack_gpu.model.budgets import Charge, Tally, tallies, tally_of_key
from cozystack_gpu.model.timeline import Timeline
from cozystack_gpu.model.types import ClaimKey, Refusal

if TYPE_CHECKING:
    from cozystack_gpu.model.snapshot import Snapshot

MINUTE = 60
DAY = 24 * 3600


class ReservationPhase(StrEnum):
    """GPUReservation ``status.phase``."""

    PENDING = "Pending"
    BOOKED = "Booked"
    ACTIVE = "Active"
    ENDED = "Ended"
    LOST = "Lost"


@dataclass(frozen=True)
class ReservationInfo:
    """A GPUReservation: spec, status, and its identity.

    - ``start``, ``end``: the window, epoch seconds on whole minutes, ``start < end`` (the
      CRD's rules make sure).
    - ``node``: ``status.nodeName``, the node it is booked on (None before it is booked and
      once it is Lost).
    - ``created``: creationTimestamp; with the name it fixes arrival order.
    """

    namespace: str
    name: str
    uid: str
    class_name: str
    count: int
    start: int
    end: int
    node: str | None = None
    phase: ReservationPhase = ReservationPhase.PENDING
    created: float = 0.0

    @property
    def key(self) -> ClaimKey:
        """Namespace and name: the key of the claim it makes at its start, too."""
        return ClaimKey(self.namespace, self.name)

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def counts_budget(self) -> bool:
        """Booked, Active and Lost reservations count against budgets."""
        return self.phase in _COUNTING

    @property
    def holds_node(self) -> bool:
        """Holds units on ``node`` over its window: Booked or Active there."""
        return self.node is not None and self.phase in _HOLDING


_COUNTING = frozenset({ReservationPhase.BOOKED, ReservationPhase.ACTIVE, ReservationPhase.LOST})
_HOLDING = frozenset({ReservationPhase.BOOKED, ReservationPhase.ACTIVE})


def booked_by_class(reservations: Iterable[ReservationInfo]) -> dict[str, Timeline]:
    """Per class, the units its reservations booked on a node (Booked or Active:
    ``holds_node``) hold over time, each window ``[start, end)``; a Pending, Lost or Ended one
    holds none. The one count of "units booked" that the metric
    ``cozystack_gpu_class_booked_units`` samples at each whole hour ahead and ``kubectl gpu
    top classes`` reads the busiest moment of over the next day."""
    out: dict[str, Timeline] = {}
    for reservation in reservations:
        if reservation.holds_node:
            timeline = out.setdefault(reservation.class_name, Timeline())
            timeline.add(reservation.start, reservation.end, reservation.count)
    return out


@dataclass(frozen=True, slots=True)
class BookingSettings:
    """The hoster's limits on a window (seconds): ``reservations.maxLead``, how far ahead a
    window may start, and ``reservations.maxLength``, how long it may last."""

    max_lead: int = 90 * DAY
    max_length: int = 30 * DAY


@dataclass(frozen=True, slots=True)
class BookingRefusal(Refusal):
    """A refused booking; ``earliest`` is the start of the earliest window of the same
    length that fits (within ``maxLead``), when capacity or budget was short and one does."""

    earliest: int | None = None

    @classmethod
    def of(cls, refusal: Refusal, earliest: int | None = None) -> BookingRefusal:
        return cls(refusal.reason, refusal.message, earliest)


class NodeMark(NamedTuple):
    """Where a reservation holds units: a resource name on a node."""

    resource: str
    node: str


class BudgetMark(NamedTuple):
    """A budget count a reservation adds to: one tenant's tally of a class, of every class
    or of a resource name (``budgets.tallies``)."""

    tenant: str
    tally: Tally
    inner: str


Mark = NodeMark | BudgetMark


class _Held(NamedTuple):
    """What one reservation added to the index, so removing it takes back exactly that."""

    charge: Charge | None  # set when it counts against budgets
    node: str | None  # set when it holds units on a node
    resource: str | None
    start: int
    end: int
    units: int
    active: bool  # Active: its claim may already stand for it (see ``booking``)


class Bookings:
    """Reservations, with the units they hold over time per node and per budget key.

    Feed every GPUReservation event to ``upsert``/``remove`` (with the snapshot, for the
    class's resource name and the namespace's tenants), and call ``recharge`` when a class
    or a namespace changes; ``Bookings.build`` of the same objects gives the same index.
    """

    def __init__(self) -> None:
        self._items: dict[ClaimKey, ReservationInfo] = {}
        self._held: dict[ClaimKey, _Held] = {}
        self._nodes: dict[str, dict[str, Timeline]] = {}  # resource -> node -> units held
        # resource -> (start, end, node, key) of every hold, by start: the nodes booked in
        # a window are found without walking every node that has a booking some day.
        self._starts: dict[str, list[tuple[int, int, str, ClaimKey]]] = {}
        self._longest: dict[str, int] = {}  # resource -> longest hold ever seen (grows only)
        self._budgets: dict[tuple[str, Tally, str], Timeline] = {}
        self._on_node: dict[str, set[ClaimKey]] = {}
        # resource -> node -> Active reservations there: their claims may stand for them.
        self._active_on: dict[str, dict[str, set[ClaimKey]]] = {}
        self._active_under: dict[str, set[ClaimKey]] = {}
        self._by_namespace: dict[str, set[ClaimKey]] = {}
        self._by_class: dict[str, set[ClaimKey]] = {}

    @classmethod
    def build(cls, snap: Snapshot, reservations: Iterable[ReservationInfo]) -> Bookings:
        """An index of these reservations; the same as upserting them one by one."""
        bookings = cls()
        for reservation in reservations:
            bookings.upsert(reservation, snap)
        return bookings

    # --- reading ---------------------------------------------------------------------------

    def get(self, key: ClaimKey) -> ReservationInfo | None:
        return self._items.get(key)

    def __iter__(self) -> Iterator[ReservationInfo]:
        return iter(self._items.values())

    def __len__(self) -> int:
        return len(self._items)

    def on_node(self, node: str) -> frozenset[ClaimKey]:
        """Reservations holding units on the node (Booked or Active there)."""
        return frozenset(self._on_node.get(node, ()))

    def held(self, key: ClaimKey) -> tuple[str | None, str | None, Charge | None]:
        """Where a reservation holds (node, resource name) and what it charges budgets."""
        held = self._held[key]
        return held.node, held.resource, held.charge

    def peak(self, node: str, resource: str, a: float, b: float = math.inf) -> int:
        """The most units reservations hold on the node at any moment of ``[a, b)``."""
        timeline = self._nodes.get(resource, {}).get(node)
        return timeline.peak(a, b) if timeline is not None else 0

    def budget_peak(self, tenant: str, key: str, a: float, b: float = math.inf) -> int:
        """The most units reservations in the tenant's subtree count against one of its
        budget keys at any moment of ``[a, b)`` (``key`` as ``Ledger.used`` reads it)."""
        timeline = self._budgets.get((tenant, *tally_of_key(key)))
        return timeline.peak(a, b) if timeline is not None else 0

    def budget_timeline(self, tenant: str, key: str) -> Timeline | None:
        return self._budgets.get((tenant, *tally_of_key(key)))

    def budget_timeline_of(self, tenant: str, tally: Tally, inner: str) -> Timeline | None:
        return self._budgets.get((tenant, tally, inner))

    def marks(self, key: ClaimKey) -> set[Mark]:
        """What the reservation's holds count in: (resource name, node) where it holds
        units, and (tenant, tally, inner) for each budget count it adds to. Empty for one
        not indexed."""
        held = self._held.get(key)
        if held is None:
            return set()
        marks: set[Mark] = set()
        if held.node is not None and held.resource is not None:
            marks.add(NodeMark(held.resource, held.node))
        if held.charge is not None:
            counts = tallies(held.charge.class_name, held.charge.resource)
            marks.update(
                BudgetMark(tenant, tally, inner)
                for tenant in held.charge.ancestors
                for tally, inner in counts
            )
        return marks

    def keys_of(
        self, *, namespace: str | None = None, class_name: str | None = None
    ) -> set[ClaimKey]:
        """The reservations of a namespace, or of a class (both: either)."""
        keys: set[ClaimKey] = set()
        if namespace is not None:
            keys |= self._by_namespace.get(namespace, set())
        if class_name is not None:
            keys |= self._by_class.get(class_name, set())
        return keys

    def node_timelines(self, resource: str) -> dict[str, Timeline]:
        """Per node, the units reservations hold there: every node with a booking of the
        resource name, at any time. Read only."""
        return self._nodes.get(resource, {})

    def nodes_booked_in(self, resource: str, a: float, b: float) -> set[str]:
        """Nodes where a reservation holds units of the resource at some moment of
        ``[a, b)``."""
        starts = self._starts.get(resource)
        if not starts:
            return set()
        lo = bisect_left(starts, (a - self._longest[resource],))
        hi = bisect_left(starts, (b,), lo)
        return {node for _s, end, node, _k in starts[lo:hi] if end > a}

    def active_on(self, node: str, resource: str) -> Iterator[ReservationInfo]:
        """Active reservations holding units of the resource name on the node."""
        return (self._items[k] for k in self._active_on.get(resource, {}).get(node, ()))

    def active_nodes(self, resource: str) -> Iterable[str]:
        """Nodes with an Active reservation holding units of the resource name."""
        return self._active_on.get(resource, {}).keys()

    def active_under(self, tenant: str) -> Iterator[ReservationInfo]:
        """Active reservations counted against the tenant's budgets."""
        return (self._items[k] for k in self._active_under.get(tenant, ()))

    def tables(self) -> dict[str, Any]:
        """Every index as plain values, for comparing two indexes of the same reservations."""
        starts = {res: list(rows) for res, rows in self._starts.items() if rows}
        nodes = {res: {n: t.points() for n, t in rows.items()} for res, rows in self._nodes.items()}
        return {
            "nodes": {res: rows for res, rows in nodes.items() if rows},
            "budgets": {key: t.points() for key, t in self._budgets.items()},
            "starts": starts,
            "on_node": self._on_node,
            "active_on": self._active_on,
            "active_under": self._active_under,
        }

    # --- changes ---------------------------------------------------------------------------

    def upsert(self, reservation: ReservationInfo, snap: Snapshot) -> None:
        """Take in a reservation's spec and status (its class's resource name and its
        namespace's tenants read from the snapshot)."""
        key = reservation.key
        if key in self._items:
            self._drop(key)
        self._items[key] = reservation
        klass = snap.gpu_class(reservation.class_name)
        res = klass.resource_name if klass is not None else None
        charge = None
        if reservation.counts_budget:
            ancestors = snap._ledger.ancestors(reservation.namespace)
            charge = Charge(ancestors, reservation.class_name, res, reservation.count)
        node = reservation.node if reservation.holds_node and res is not None else None
        active = reservation.phase is ReservationPhase.ACTIVE
        held = _Held(
            charge, node, res, reservation.start, reservation.end, reservation.count, active
        )
        self._held[key] = held
        self._apply(key, held, 1)
        self._by_namespace.setdefault(reservation.namespace, set()).add(key)
        self._by_class.setdefault(reservation.class_name, set()).add(key)

    def remove(self, key: ClaimKey) -> None:
        if key in self._items:
            self._drop(key)

    def recharge(
        self, snap: Snapshot, *, namespace: str | None = None, class_name: str | None = None
    ) -> None:
        """Count again the reservations of a namespace whose tenants changed, or of a class
        whose resource name changed (or that came or went)."""
        for key in sorted(self.keys_of(namespace=namespace, class_name=class_name)):
            self.upsert(self._items[key], snap)

    def _drop(self, key: ClaimKey) -> None:
        reservation = self._items.pop(key)
        self._apply(key, self._held.pop(key), -1)
        discard_member(self._by_namespace, reservation.namespace, key)
        discard_member(self._by_class, reservation.class_name, key)

    def _apply(self, key: ClaimKey, held: _Held, sign: int) -> None:
        units = sign * held.units
        if held.node is not None and held.resource is not None:
            res, node = held.resource, held.node
            rows = self._nodes.setdefault(res, {})
            timeline = rows.get(node)
            if timeline is None:
                timeline = rows[node] = Timeline()
            timeline.add(held.start, held.end, units)
            if not timeline:
                del rows[node]
            row = (held.start, held.end, node, key)
            starts = self._starts.setdefault(res, [])
            if sign > 0:
                insort(starts, row)
                self._longest[res] = max(self._longest.get(res, 0), held.end - held.start)
                self._on_node.setdefault(node, set()).add(key)
                if held.active:
                    self._active_on.setdefault(res, {}).setdefault(node, set()).add(key)
            else:
                del starts[bisect_left(starts, row)]
                discard_member(self._on_node, node, key)
                if held.active:
                    discard_member(self._active_on[res], node, key)
                    if not self._active_on[res]:
                        del self._active_on[res]
        if held.charge is not None:
            counts = tallies(held.charge.class_name, held.charge.resource)
            for tenant in held.charge.ancestors:
                for tally, inner in counts:
                    budget = self._budgets.get((tenant, tally, inner))
                    if budget is None:
                        budget = self._budgets[(tenant, tally, inner)] = Timeline()
                    budget.add(held.start, held.end, units)
                    if not budget:
                        del self._budgets[(tenant, tally, inner)]
                if held.active:
                    if sign > 0:
                        self._active_under.setdefault(tenant, set()).add(key)
                    else:
                        discard_member(self._active_under, tenant, key)
