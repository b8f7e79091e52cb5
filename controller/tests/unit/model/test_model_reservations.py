"""Properties of reservations over random clusters and random sequences of bookings,
cancellations, orders, node losses and clock steps (see ``reservation_world``): every
window starts with its units, no budget is over at any moment, a refusal's offered window
really fits and none earlier does, a booking is the best fit across its window, and the
answers do not depend on the order events came in. CI runs a modest number of examples; set
MODEL_HYPOTHESIS_EXAMPLES for a longer run.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reservation_world import (
    CAPACITY_SHORT,
    N_OPS,
    RES,
    SETTINGS,
    Op,
    Sim,
    random_sim,
)

from cozystack_gpu.model import Placement, Reason
from cozystack_gpu.model._index import ClassIndex
from cozystack_gpu.model.booking import check_booking
from cozystack_gpu.model.reservations import BookingRefusal, ReservationInfo
from cozystack_gpu.model.timeline import Timeline

EXAMPLES = int(os.environ.get("MODEL_HYPOTHESIS_EXAMPLES", "40"))

ops_strategy = st.lists(
    st.tuples(
        st.integers(0, N_OPS - 1),
        st.integers(0, 999),
        st.integers(0, 999),
        st.integers(0, 999),
    ),
    min_size=1,
    max_size=60,
)
model_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
seeds = st.integers(0, 2**32)
asks = st.tuples(st.integers(0, 999), st.integers(0, 999), st.integers(0, 999))
JUDGED_CAPACITY = (Reason.INSUFFICIENT_CAPACITY, Reason.NO_NODE_SERVES)


def run(seed: int, ops: list[Op]) -> Sim:
    return random_sim(seed, ops, check=False)


@model_settings
@given(seed=seeds, ops=ops_strategy)
def test_no_booked_window_starts_short_of_its_units(seed: int, ops: list[Op]) -> None:
    # The simulation asserts at every window's start that its node has its units beside
    # everything else held there, and after every operation that no node holds more than
    # its capacity at any moment from now on (orders, plus the windows covering it).
    sim = Sim.of(seed)
    for op in ops:
        sim.apply(op, check=False)
        sim.check_windows()


@model_settings
@given(seed=seeds, ops=ops_strategy)
def test_no_budget_key_is_over_its_limit_at_any_moment(seed: int, ops: list[Op]) -> None:
    sim = Sim.of(seed)
    for op in ops:
        sim.apply(op, check=False)
        sim.check_budgets()


def fit_regions(sim: Sim, window: ReservationInfo, first: int, last: float) -> list[int]:
    """The first whole-minute start of every stretch of starts over which a window of this
    length touches the same bookings: the start ``first``, every booking's end, and the
    minute after each start at which the window first reaches a booking."""
    length = window.length
    points = {first}
    for other in sim.windows.values():
        points |= {other.end, other.start - length + 60}
    return sorted(p for p in points if first <= p <= last)


@model_settings
@given(seed=seeds, ops=ops_strategy, ask=asks)
def test_the_earliest_window_a_refusal_offers_fits_and_none_earlier_does(
    seed: int, ops: list[Op], ask: tuple[int, int, int]
) -> None:
    sim = run(seed, ops)
    for window in several(sim, ask):
        check_offer(sim, window)


def several(sim: Sim, ask: tuple[int, int, int]) -> list[ReservationInfo]:
    """Eight asks from one drawn: a refusal with an offer is rarer than a booking."""
    a, b, c = ask
    return [sim.new_window(a + 7 * i, b + 3 * i, c + 5 * i) for i in range(8)]


def check_offer(sim: Sim, window: ReservationInfo) -> None:
    decision = check_booking(sim.snap, sim.bookings, window, sim.now, SETTINGS)
    if not isinstance(decision, BookingRefusal) or decision.reason not in CAPACITY_SHORT:
        assert not isinstance(decision, BookingRefusal) or decision.earliest is None
        return
    last = sim.now + SETTINGS.max_lead
    offered = decision.earliest
    if offered is not None:
        assert offered % 60 == 0 and window.start < offered <= last, decision
        moved = replace(window, start=offered, end=offered + window.length)
        assert isinstance(
            check_booking(sim.snap, sim.bookings, moved, sim.now, SETTINGS), Placement
        ), f"the offered window {offered} does not fit: {decision.message}"
    # No start before the offer (or, with no offer, within maxLead) fits: one start from
    # every stretch over which the window touches the same bookings is enough.
    for start in fit_regions(sim, window, window.start, offered - 60 if offered else last):
        earlier = replace(window, start=start, end=start + window.length)
        answer = check_booking(sim.snap, sim.bookings, earlier, sim.now, SETTINGS)
        assert not isinstance(answer, Placement), f"{start} fits before the offer {offered}"


@model_settings
@given(seed=seeds, ops=ops_strategy, ask=asks)
def test_booking_is_deterministic_whatever_the_order_of_events(
    seed: int, ops: list[Op], ask: tuple[int, int, int]
) -> None:
    sim = run(seed, ops)
    snap, bookings = sim.rebuilt()
    for window in several(sim, ask):
        first = check_booking(sim.snap, sim.bookings, window, sim.now, SETTINGS)
        assert check_booking(sim.snap, sim.bookings, window, sim.now, SETTINGS) == first
        assert check_booking(snap, bookings, window, sim.now, SETTINGS) == first


@model_settings
@given(seed=seeds, ops=ops_strategy)
def test_incremental_bookings_equal_a_rebuild(seed: int, ops: list[Op]) -> None:
    sim = run(seed, ops)
    snap, bookings = sim.rebuilt()
    assert sim.bookings.tables() == bookings.tables()
    # What orders must leave free, per node and per budget count, alike.
    assert sim.snap.windows.nodes == snap.windows.nodes
    assert sim.snap._ledger.tables() == snap._ledger.tables()


@model_settings
@given(seed=seeds, ops=ops_strategy, ask=asks)
def test_a_booking_goes_to_the_brute_force_best_fit_across_its_window(
    seed: int, ops: list[Op], ask: tuple[int, int, int]
) -> None:
    sim = run(seed, ops)
    for window in several(sim, ask):
        check_best_fit(sim, window)


def check_best_fit(sim: Sim, window: ReservationInfo) -> None:
    decision = check_booking(sim.snap, sim.bookings, window, sim.now, SETTINGS)
    if isinstance(decision, BookingRefusal) and decision.reason not in JUDGED_CAPACITY:
        return  # refused before capacity is judged
    res = RES[window.class_name]
    moments = [window.start] + [
        t for w in sim.windows.values() for t in (w.start, w.end) if window.start < t < window.end
    ]
    fits = []
    for name, node in sorted(sim.nodes.items()):
        if not sim.snap.serves(name, window.class_name):
            continue
        left = node.capacity().get(res, 0) - max(sim.held_on(name, res, t) for t in moments)
        if left >= window.count:
            fits.append((left, name))
    expected = min(fits)[1] if fits else None
    got = decision.node if isinstance(decision, Placement) else None
    assert got == expected, decision


def test_the_random_runs_book_start_end_refuse_offer_move_and_lose() -> None:
    # Guards the properties above from testing nothing: over fixed seeds, windows are
    # booked, start and end, refusals offer windows, orders are kept out by windows, and
    # windows are moved and lost when their nodes go.
    rng = random.Random(20261206)
    seen = Sim().seen
    for seed in range(40):
        ops = [
            (rng.randrange(N_OPS), rng.randrange(1000), rng.randrange(1000), rng.randrange(1000))
            for _draw in range(60)
        ]
        seen += random_sim(seed, ops).seen
    for what in (
        "booked",
        "started",
        "ended",
        "offered",
        "moved",
        "lost",
        "ordered",
        "order kept out by a node's windows",
        "InsufficientCapacity",
        "BudgetExceeded",
        "WindowInPast",
        "WindowTooLong",
    ):
        assert seen[what] > 0, f"no run saw {what}: {dict(seen)}"


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(
    holds=st.lists(
        st.tuples(st.integers(0, 100), st.integers(1, 30), st.integers(1, 3), st.booleans()),
        max_size=150,
    ),
    a=st.integers(-5, 140),
    length=st.integers(1, 40),
    cap=st.integers(-1, 6),
)
def test_a_timeline_answers_as_brute_force(
    holds: list[tuple[int, int, int, bool]], a: int, length: int, cap: int
) -> None:
    # Enough holds to split chunks, and some taken back again to empty and merge them.
    timeline = Timeline()
    kept: list[tuple[int, int, int]] = []
    for start, span, units, taken_back in holds:
        timeline.add(start, start + span, units)
        if taken_back:
            timeline.add(start, start + span, -units)
        else:
            kept.append((start, start + span, units))

    def value(t: int) -> int:
        return sum(u for s, e, u in kept if s <= t < e)

    assert timeline.value_at(a) == value(a)
    assert timeline.peak(a, a + length) == max(value(t) for t in range(a, a + length))
    assert timeline.peak(a) == max(value(t) for t in range(a, 200))
    until = a + 60
    expected = next(
        (
            s
            for s in range(a, until + 1)
            if cap >= 0 and max(value(t) for t in range(s, s + length)) <= cap
        ),
        None,
    )
    assert timeline.earliest_fit(a, length, cap, until) == expected


@settings(max_examples=EXAMPLES * 5, deadline=None)
@given(
    frees=st.lists(st.integers(0, 8), min_size=1, max_size=120),
    skipped=st.one_of(
        st.sets(st.integers(0, 119), max_size=8), st.sets(st.integers(0, 119), min_size=33)
    ),
    need=st.integers(0, 9),
)
def test_best_fit_outside_a_crowd_answers_as_with_an_accept_test(
    frees: list[int], skipped: set[int], need: int
) -> None:
    # Booking skips the nodes booked in its window; past a few dozen the index takes them
    # out of each bucket as a set, which must answer as popping them off its heap does.
    idx = ClassIndex()
    for i, free in enumerate(frees):
        idx.put(f"n{i:03}", free, 8)
    skip = {f"n{i:03}" for i in skipped}
    assert idx.best_outside(need, skip) == idx.best(need, lambda n: n not in skip)
    assert idx.largest_outside(skip) == idx.largest(lambda n: n not in skip)
