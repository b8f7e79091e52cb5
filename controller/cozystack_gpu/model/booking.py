"""Does a reservation's window fit, where, and if not, when the earliest one that does starts
(SPEC §11); and what an order must leave free for the windows already booked.

Time enters the model here. An ordered claim holds from now on, so the snapshot's free units
of a node hold at every future moment; a reservation holds ``[start, end)``. So a window
fits a node when the node's free units now, less the most that reservations booked there
hold at any moment of the window, are enough; and it fits the budgets when, for every key
on the way up the tenant tree, the units in use now plus the most booked at any moment of
the window plus the window's own stay under the limit. An order fits a node when it leaves
room for the most booked there at any moment from now on (``order_headroom``), and a budget
when it leaves room for the most booked under the key (``budget_headroom``). Then no booked
window is ever short of its units at its start, and no budget is over at any moment.

The claim an Active reservation makes (its name, Bound on its node) is counted by the
snapshot from now on, and by its window until the window's end, when it is deleted: its
units are given back to the snapshot's count while the window lasts (``_credited``), so
they are counted once.

Placement packs, as ``search.find_node`` does for orders: the node with the fewest units
left in the window that are still enough, ties by name, so whole nodes stay free for large
sets. Nothing here does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from cozystack_gpu.keys import OnCordon
from cozystack_gpu.model.budgets import Limit, Tally, tallies, tally_of_key
from cozystack_gpu.model.reservations import (
    MINUTE,
    BookingRefusal,
    Bookings,
    BookingSettings,
    ReservationInfo,
    ReservationPhase,
)
from cozystack_gpu.model.set_shape import ClassShape, SetMember, judge_set_shape, units
from cozystack_gpu.model.timeline import Timeline
from cozystack_gpu.model.types import ClassInfo, Placement, Reason

if TYPE_CHECKING:
    from cozystack_gpu.model.snapshot import Snapshot


def check_booking(
    snap: Snapshot,
    bookings: Bookings,
    reservation: ReservationInfo,
    now: float,
    settings: BookingSettings | None = None,
) -> Placement | BookingRefusal:
    """Judge one reservation: its window (past, too far ahead, too long), its class and
    maxCount, the vGPU entitlement and every budget key on the way up across the window,
    then one node with room across the window (best fit).

    A reservation that already counts (Booked, Active, Lost: being placed again because
    its node went) skips the window, maxCount, entitlement and budget checks, as a claim's
    rebind does, and is judged over what is left of its window; it keeps its node when the
    node still takes it. A refusal for short capacity or budget names the earliest window
    of the same length that fits, not before the asked start and within ``maxLead``.
    """
    settings = settings or BookingSettings()
    if (
        reservation.end <= reservation.start
        or reservation.start % MINUTE
        or reservation.end % MINUTE
    ):
        raise ValueError(f"{reservation.key}: a window is whole minutes with start < end")
    again = reservation.counts_budget
    if not again:
        window = window_refusal(reservation, now, settings)
        if window is not None:
            return window
    a, b = max(reservation.start, now), reservation.end
    if a >= b:
        return BookingRefusal(Reason.WINDOW_IN_PAST, f"the window ended at {at(b)}")
    klass = snap.gpu_class(reservation.class_name)
    member = SetMember(reservation.class_name, reservation.count, order=not again)
    shape = {} if klass is None else {klass.name: _shape(snap, klass)}
    _demand, refusal = judge_set_shape([member], shape, max_count=not again)
    if refusal is not None:
        return BookingRefusal.of(refusal)
    assert klass is not None  # judge_set_shape refuses a missing class
    judge = _Judge(snap, bookings, klass, reservation, now)
    if not again:
        short = judge.entitlement_and_budgets(a, b, settings)
        if short is not None:
            return short
    node = judge.best_node(a, b)
    if node is not None:
        return Placement(node)
    return judge.capacity_refusal(a, b, None if again else judge.earliest(settings), settings)


def earliest_window(
    snap: Snapshot,
    bookings: Bookings,
    reservation: ReservationInfo,
    now: float,
    settings: BookingSettings | None = None,
    not_before: float | None = None,
) -> int | None:
    """The earliest start, on a whole minute from ``not_before`` (the window's own start
    when None; never before now) and no later than ``maxLead`` ahead, at which a window of
    the reservation's length fits capacity and budgets; None when none does. It is judged
    as a new booking (its own holds, if it has any, count against it); its class, maxCount
    and entitlement are not judged (``check_booking`` does)."""
    settings = settings or BookingSettings()
    klass = snap.gpu_class(reservation.class_name)
    if klass is None:
        return None
    judge = _Judge(snap, bookings, klass, reservation, now)
    judge.limits, uncovered = snap._ledger.budget_checks(reservation.namespace, klass)
    if uncovered is not None:
        return None
    return judge.earliest(settings, not_before)


def order_headroom(snap: Snapshot, bookings: Bookings, node: str, resource: str, now: float) -> int:
    """The units an order on the node must leave free beside the snapshot's free units: the
    most that reservations booked there hold at any moment from now on, less what their
    claims already hold (the snapshot counts those)."""
    return bookings.peak(node, resource, now) - _node_credit(snap, bookings, node, resource, now)


def budget_headroom(snap: Snapshot, bookings: Bookings, tenant: str, key: str, now: float) -> int:
    """The units an order must leave under one budget key of a tenant beside what the key
    has in use (``Snapshot.budget_used``): the most that reservations in the tenant's
    subtree count against it at any moment from now on, less what their claims already
    count."""
    peak = bookings.budget_peak(tenant, key, now)
    return peak - _budget_credit(snap, bookings, tenant, tally_of_key(key), now)


# What the snapshot keeps for its order decisions: the two headrooms over all time, which
# needs no clock. While every window in ``bookings`` ends after now (the binder ends each
# at its end), units held before now were held by windows still held now, so the busiest
# moment of all time is one from now on, and these equal the headrooms above.


def held_back_on_node(snap: Snapshot, bookings: Bookings, node: str, resource: str) -> int:
    """``order_headroom`` with no clock (see above)."""
    peak = bookings.peak(node, resource, -math.inf)
    return peak - _node_credit(snap, bookings, node, resource, None)


def held_back_under(
    snap: Snapshot, bookings: Bookings, tenant: str, tally: Tally, inner: str
) -> int:
    """``budget_headroom`` with no clock, for one count of a tenant (see above)."""
    timeline = bookings.budget_timeline_of(tenant, tally, inner)
    peak = timeline.peak(-math.inf) if timeline is not None else 0
    return peak - _budget_credit(snap, bookings, tenant, (tally, inner), None)


def why_move(snap: Snapshot, reservation: ReservationInfo) -> str | None:
    """Why a Booked reservation must be judged again before its window (SPEC §11), or None
    while its node keeps it: the node is gone, cordoned (a Move class), no longer serves
    the class, or lost capacity so that some window on it is short at its busiest moment.
    A node NotReady or with an old report keeps its bookings: it may be back before the
    window. A class deleted keeps its windows, as it keeps its claims' holds."""
    name = reservation.node
    if name is None or reservation.phase is not ReservationPhase.BOOKED:
        return None
    node = snap.node(name)
    if node is None:
        return f"its node {name} is gone"
    klass = snap.gpu_class(reservation.class_name)
    if klass is None:
        return None
    if node.unschedulable and klass.on_cordon is OnCordon.MOVE:
        return f"its node {name} is cordoned"
    why = snap.why_not_placeable(node, klass)
    if why is not None:
        return f"its node {name} no longer serves class {klass.name} ({why})"
    res = klass.resource_name
    if snap.free(name, res) < snap.held_back(name, res):
        return f"its node {name} lost capacity: its windows need more than it has"
    return None


def window_refusal(
    reservation: ReservationInfo, now: float, settings: BookingSettings
) -> BookingRefusal | None:
    """A window that starts before now, more than ``maxLead`` ahead, or lasts more than
    ``maxLength``: the tenant can fix the first, the hoster sets the other two."""
    start = reservation.start
    if start < now:
        return BookingRefusal(
            Reason.WINDOW_IN_PAST,
            f"the window starts at {at(start)}, before now ({at(now)}): "
            "a reservation books a window that starts later",
        )
    if start - now > settings.max_lead:
        return BookingRefusal(
            Reason.WINDOW_TOO_FAR_AHEAD,
            f"the window starts at {at(start)}, {span(start - now)} ahead; a window starts "
            f"at most {span(settings.max_lead)} ahead (reservations.maxLead, which the hoster "
            f"sets): book it from {at(start - settings.max_lead)} on",
        )
    if reservation.length > settings.max_length:
        return BookingRefusal(
            Reason.WINDOW_TOO_LONG,
            f"the window lasts {span(reservation.length)}; a window lasts at most "
            f"{span(settings.max_length)} (reservations.maxLength, which the hoster sets): "
            "book a shorter window",
        )
    return None


def at(t: float) -> str:
    """A moment as RFC 3339 in UTC, as the API writes it."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def span(seconds: float) -> str:
    """A length of time in days, hours and minutes: ``9h``, ``1d2h30m``, ``90d``."""
    minutes = math.ceil(seconds / MINUTE)
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    parts = [f"{n}{u}" for n, u in ((days, "d"), (hours, "h"), (mins, "m")) if n]
    return "".join(parts) or "0m"


def _shape(snap: Snapshot, klass: ClassInfo) -> ClassShape:
    return ClassShape(klass.mode, klass.deleting, snap.max_count(klass.name))


def _credited(
    snap: Snapshot, reservation: ReservationInfo, now: float | None, *, on_node: bool
) -> int:
    """Units of an Active reservation's claim that the snapshot counts while the window,
    which counts them too, lasts: its claim is the one of its name, of its class (on its
    node, for capacity); it is deleted at the window's end, so none after. With no clock
    (``now`` None), Active means within the window: the binder sets it at the start and
    ends it at the end."""
    if reservation.phase is not ReservationPhase.ACTIVE:
        return 0
    if now is not None and not reservation.start <= now < reservation.end:
        return 0
    claim = snap.claim(reservation.key)
    if claim is None or claim.class_name != reservation.class_name:
        return 0
    if on_node and not (claim.holds_node and claim.node == reservation.node):
        return 0
    if not on_node and not claim.counts_budget:
        return 0
    return min(claim.count, reservation.count)


def _node_credit(
    snap: Snapshot, bookings: Bookings, node: str, resource: str, now: float | None
) -> int:
    return sum(_credited(snap, r, now, on_node=True) for r in bookings.active_on(node, resource))


def _budget_credit(
    snap: Snapshot, bookings: Bookings, tenant: str, tally: tuple[Tally, str], now: float | None
) -> int:
    credit = 0
    for reservation in bookings.active_under(tenant):
        charge = bookings.held(reservation.key)[2]
        if charge is not None and tally in tallies(charge.class_name, charge.resource):
            credit += _credited(snap, reservation, now, on_node=False)
    return credit


@dataclass
class _Judge:
    """One reservation's questions to the snapshot and the bookings: room on a node and
    under a budget key across a window, the best node, and the earliest window."""

    snap: Snapshot
    bookings: Bookings
    klass: ClassInfo
    reservation: ReservationInfo
    now: float

    def __post_init__(self) -> None:
        self.res = self.klass.resource_name
        self.count = self.reservation.count
        self.idx = self.snap._idx[self.klass.name]
        # Being placed again: its own units on its node are no one else's.
        self.own = self.reservation.node if self.reservation.holds_node else None
        self.limits: list[Limit] = []  # the budget keys on the way up, once judged
        self.timelines = self.bookings.node_timelines(self.res)
        # Kept for the refusal's words, which read the same window again.
        self._busy: tuple[tuple[float, float], set[str]] | None = None
        self._left: dict[tuple[str, float, float], int] = {}
        self.active = self.bookings.active_nodes(self.res)

    def most(self, node: str, free: int) -> int:
        """The most units of the node a window could have: its free units now, and an
        Active window's claim given back."""
        if node not in self.active:
            return free
        return free + _node_credit(self.snap, self.bookings, node, self.res, self.now)

    def free_in(self, node: str, most: int, a: float, b: float) -> int:
        """Units of the node left at the busiest moment of ``[a, b)``, from ``most``, its
        units before any window (``_Judge.most``)."""
        left = self._left.get((node, a, b))
        if left is None:
            timeline = self.timelines.get(node)
            booked = timeline.peak(a, b) if timeline is not None else 0
            if node == self.own:
                booked -= self.count  # ``[a, b)`` lies within its own window
            left = self._left[(node, a, b)] = most - booked
        return left

    def busy(self, a: float, b: float) -> set[str]:
        """Nodes whose free units in ``[a, b)`` may differ from the snapshot's: booked
        then, or holding an Active window's claim."""
        if self._busy is None or self._busy[0] != (a, b):
            nodes = self.bookings.nodes_booked_in(self.res, a, b)
            nodes.update(self.bookings.active_nodes(self.res))
            self._busy = ((a, b), nodes)
        return self._busy[1]

    def best_node(self, a: float, b: float) -> str | None:
        idx, count = self.idx, self.count
        own = self.own
        # A window placed again keeps its node while the node takes it.
        if own is not None and own in idx:
            kept = self.free_in(own, self.most(own, idx.free[own]), a, b)
            if kept >= count:
                return own
        busy = self.busy(a, b)
        best: tuple[int, str] | None = None
        frees = idx.free
        for node in busy:
            free = frees.get(node)
            if free is None or node == own:
                continue
            most = self.most(node, free)
            if most < count:
                continue  # short even before its windows
            left = self.free_in(node, most, a, b)
            if left >= count and (best is None or (left, node) < best):
                best = (left, node)
        found = idx.best_outside(count, busy)
        if found is not None and (best is None or (idx.free[found], found) < best):
            best = (idx.free[found], found)
        return best[1] if best is not None else None

    def largest(self, a: float, b: float) -> int | None:
        """The most units one serving node has left across ``[a, b)``; None when none."""
        busy = self.busy(a, b)
        largest = self.idx.largest_outside(busy)
        frees = self.idx.free
        # Most first: once a node's units before its windows are no more than the largest
        # found, no node after it has more.
        for most, node in sorted(
            ((self.most(n, frees[n]), n) for n in busy if n in frees), reverse=True
        ):
            if largest is not None and most <= largest:
                break
            left = self.free_in(node, most, a, b)
            largest = left if largest is None else max(largest, left)
        return largest

    def entitlement_and_budgets(
        self, a: float, b: float, settings: BookingSettings
    ) -> BookingRefusal | None:
        """The vGPU entitlement, then every budget key on the way up across ``[a, b)``, as
        ``Ledger.check_orders`` judges an order's (same keys, same order, same words)."""
        ledger, namespace, count = self.snap._ledger, self.reservation.namespace, self.count
        refusal = ledger.entitlement_refusal(namespace, self.klass)
        if refusal is not None:
            return BookingRefusal.of(refusal)
        limits, uncovered = ledger.budget_checks(namespace, self.klass)
        self.limits = limits
        for limit in limits:
            used = self.used(limit)
            booked = self.bookings.budget_peak(limit.tenant, limit.key, a, b)
            if used + booked + count > limit.limit:
                held = f"{used} in use and {booked} booked at the busiest moment of the window"
                words = ledger.over_budget(limit, namespace, held, f"the reservation asks {count}")
                earliest = self.earliest(settings)
                return BookingRefusal(
                    words.reason, words.message + self.offer(earliest, settings), earliest
                )
        return None if uncovered is None else BookingRefusal.of(uncovered)

    def used(self, limit: Limit) -> int:
        """Units in use under the key now, an Active window's claim left to its window."""
        tenant, key = limit.tenant, limit.key
        credit = _budget_credit(self.snap, self.bookings, tenant, tally_of_key(key), self.now)
        return self.snap.budget_used(tenant, key) - credit

    def earliest(self, settings: BookingSettings, not_before: float | None = None) -> int | None:
        """The earliest whole-minute start from ``not_before`` within ``maxLead`` at which a
        window of this length fits every budget key and some node; None when none does.

        Each budget key and each node says the earliest start at or after a candidate at
        which it fits (``Timeline.earliest_fit``); the candidate moves to the latest of
        these until all agree, which they must within the holds' ends.
        """
        limits = self.limits
        length = self.reservation.length
        first = self.reservation.start if not_before is None else not_before
        start = _ceil_minute(max(first, self.now))
        until = self.now + settings.max_lead
        hint: str | None = None
        while start <= until:
            moved = False
            for limit in limits:
                room = limit.limit - self.used(limit) - self.count
                timeline = self.bookings.budget_timeline(limit.tenant, limit.key)
                fits = (
                    timeline.earliest_fit(start, length, room, until)
                    if timeline is not None
                    else (start if room >= 0 else None)
                )
                if fits is None:
                    return None
                if fits > start:
                    start, moved = fits, True
                    break
            if moved:
                continue
            fits, hint = self._earliest_node(start, length, until, hint)
            if fits is None or fits == start:
                return fits
            start = fits
        return None

    def _earliest_node(
        self, start: int, length: int, until: float, hint: str | None
    ) -> tuple[int | None, str | None]:
        """The earliest start from ``start`` at which some node has room, and that node.
        ``hint``, the node found last time, is asked first: after the budgets agree with
        the start it gave, it usually still has room then."""
        idx, count = self.idx, self.count
        booked = self.bookings.node_timelines(self.res)
        if idx.best_outside(count, booked.keys()) is not None:
            return start, None
        best: int | None = None
        found: str | None = None
        nodes: Iterable[tuple[str, Timeline]] = booked.items()
        if hint is not None and hint in booked:
            nodes = itertools.chain([(hint, booked[hint])], nodes)
        for node, timeline in nodes:
            free = idx.free.get(node)
            if free is None:
                continue
            room = self.most(node, free)
            if room < count:
                continue
            # Only a start before the best so far is worth walking to.
            latest = until if best is None else best - MINUTE
            fits = timeline.earliest_fit(start, length, room - count, latest)
            if fits is not None and (best is None or fits < best):
                best, found = fits, node
                if fits == start:
                    break
        return best, found

    def offer(self, earliest: int | None, settings: BookingSettings) -> str:
        length = span(self.reservation.length)
        if earliest is not None:
            return f"; the earliest window of {length} that fits starts at {at(earliest)}"
        until = at(self.now + settings.max_lead)
        return f"; no window of {length} fits before {until} (reservations.maxLead)"

    def capacity_refusal(
        self, a: float, b: float, earliest: int | None, settings: BookingSettings
    ) -> BookingRefusal:
        name = self.klass.name
        largest = self.largest(a, b)
        if largest is None or (largest == 0 and self.idx.max_cap() == 0):
            message = f"no node serves class {name}"
            if next(self.snap.nodes(), None) is not None:
                message += ": " + self.snap.why_no_node_serves(name)
            return BookingRefusal(Reason.NO_NODE_SERVES, message)
        message = (
            f"no node serving class {name} has {units(self.count)} free from {at(a)} to "
            f"{at(b)}; the largest has {largest} then"
        )
        if self.reservation.counts_budget:
            return BookingRefusal(Reason.INSUFFICIENT_CAPACITY, message)
        message += self.offer(earliest, settings)
        return BookingRefusal(Reason.INSUFFICIENT_CAPACITY, message, earliest)


def _ceil_minute(t: float) -> int:
    return math.ceil(t / MINUTE) * MINUTE
