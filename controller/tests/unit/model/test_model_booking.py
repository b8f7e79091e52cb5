"""Booking a reservation, by example: every refusal reason with the words a tenant reads
(what is missing, who can fix it, the earliest window that fits), where a window goes, what
an order must leave free for it, and how an Active window's claim is counted once."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from model_builders import H100, L40S_24C, bound, node, passthrough, tenant, vgpu
from reservation_world import reservation

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, OnCordon, quota_key, raw_quota_keys
from cozystack_gpu.model import ClaimInfo, ClaimKey, Placement, Reason, Refusal, Snapshot
from cozystack_gpu.model.booking import (
    budget_headroom,
    check_booking,
    earliest_window,
    order_headroom,
    why_move,
)
from cozystack_gpu.model.reservations import (
    BookingRefusal,
    Bookings,
    BookingSettings,
    ReservationInfo,
    ReservationPhase,
)
from cozystack_gpu.model.set_placement import check_order

HOUR = 3600
DAY = 24 * HOUR
NOW = datetime(2027, 1, 1, 12, tzinfo=UTC).timestamp()  # a Friday, noon
MONDAY_9 = int(datetime(2027, 1, 4, 9, tzinfo=UTC).timestamp())
MONDAY_18 = MONDAY_9 + 9 * HOUR
BOOKED = ReservationPhase.BOOKED
ACTIVE = ReservationPhase.ACTIVE
TREE = [
    tenant("tenant-root", quota={quota_key("h100"): 12}),
    tenant("tenant-a", "tenant-root", quota={quota_key("h100"): 10}),
]
ROOMY = [tenant("tenant-root"), tenant("tenant-a", "tenant-root")]  # no budget keys


def monday(count: int, name: str = "r", **kw: object) -> ReservationInfo:
    """A window of ``count`` H100 next Monday 09:00-18:00."""
    return reservation("h100", count, MONDAY_9, MONDAY_18, name=name, **kw)  # type: ignore[arg-type]


def world(
    *nodes: str, claims: tuple = (), namespaces: list | None = None, gpus: int = 8
) -> Snapshot:
    return Snapshot.build(
        nodes=[node(n, gpus) for n in nodes],
        classes=[passthrough()],
        claims=claims,
        namespaces=ROOMY if namespaces is None else namespaces,
    )


def booked(snap: Snapshot, *windows: ReservationInfo) -> Bookings:
    return Bookings.build(snap, windows)


def refusal(decision: object) -> BookingRefusal:
    assert isinstance(decision, BookingRefusal), decision
    return decision


# --- the window ----------------------------------------------------------------------------


def test_a_window_that_starts_before_now_is_refused_as_in_the_past() -> None:
    snap = world("n1")
    window = reservation("h100", 1, int(NOW) - HOUR, int(NOW) + HOUR)
    answer = refusal(check_booking(snap, Bookings(), window, NOW))
    assert answer.reason is Reason.WINDOW_IN_PAST
    assert answer.message == (
        "the window starts at 2027-01-01T11:00:00Z, before now (2027-01-01T12:00:00Z): "
        "a reservation books a window that starts later"
    )
    assert answer.earliest is None


def test_a_window_further_ahead_than_max_lead_says_when_it_can_be_booked() -> None:
    snap = world("n1")
    start = MONDAY_9 + 100 * DAY
    window = reservation("h100", 1, start, start + HOUR)
    answer = refusal(check_booking(snap, Bookings(), window, NOW))
    assert answer.reason is Reason.WINDOW_TOO_FAR_AHEAD
    assert answer.message == (
        "the window starts at 2027-04-14T09:00:00Z, 102d21h ahead; a window starts at most "
        "90d ahead (reservations.maxLead, which the hoster sets): book it from "
        "2027-01-14T09:00:00Z on"
    )
    settings = BookingSettings(max_lead=120 * DAY)
    assert isinstance(check_booking(snap, Bookings(), window, NOW, settings), Placement)


def test_a_window_longer_than_max_length_names_the_hoster_setting() -> None:
    snap = world("n1")
    window = reservation("h100", 1, MONDAY_9, MONDAY_9 + 31 * DAY)
    answer = refusal(check_booking(snap, Bookings(), window, NOW))
    assert answer.reason is Reason.WINDOW_TOO_LONG
    assert answer.message == (
        "the window lasts 31d; a window lasts at most 30d (reservations.maxLength, which the "
        "hoster sets): book a shorter window"
    )
    short = BookingSettings(max_length=2 * HOUR + 30 * 60)
    answer = refusal(check_booking(snap, Bookings(), monday(1), NOW, short))
    assert "the window lasts 9h; a window lasts at most 2h30m" in answer.message


def test_a_window_off_whole_minutes_or_not_after_its_start_is_a_caller_error() -> None:
    snap = world("n1")
    for start, end in ((MONDAY_9 + 1, MONDAY_18), (MONDAY_9, MONDAY_9)):
        with pytest.raises(ValueError, match="whole minutes with start < end"):
            check_booking(snap, Bookings(), reservation("h100", 1, start, end), NOW)


# --- the order's rules, in the order's words -----------------------------------------------


def test_class_max_count_entitlement_and_raw_keys_refuse_in_the_order_words() -> None:
    ns = [
        tenant("tenant-root", quota={raw_quota_keys(H100)[0]: 4}),
        tenant("tenant-a", "tenant-root"),
    ]
    snap = Snapshot.build(
        nodes=[node("n1"), node("v1", 8, L40S_24C)],
        classes=[
            passthrough(max_count=4),
            replace(passthrough("old"), deleting=True),
            vgpu(),
        ],
        namespaces=ns,
    )
    cases = {
        "h1000": (Reason.CLASS_MISSING, "class h1000 does not exist"),
        "old": (Reason.CLASS_DELETING, "class old is being deleted and takes no new orders"),
        "l40s-24c": (Reason.VGPU_NOT_ENTITLED, "vGPU class l40s-24c needs the vGPU entitlement"),
    }
    for class_name, (reason, words) in cases.items():
        window = reservation(class_name, 1, MONDAY_9, MONDAY_18)
        answer = refusal(check_booking(snap, Bookings(), window, NOW))
        assert (answer.reason, answer.earliest) == (reason, None)
        assert answer.message.startswith(words), answer.message
    answer = refusal(check_booking(snap, Bookings(), monday(5), NOW))
    assert answer.reason is Reason.MAX_COUNT_EXCEEDED
    assert answer.message == "class h100 allows at most 4 units per VM; the set asks for 5"
    answer = refusal(check_booking(snap, Bookings(), monday(1), NOW))
    assert answer.reason is Reason.RAW_KEY_UNCOVERED
    assert answer.message == (
        "tenant-root limits nvidia.com/GH100_H100 by quota key requests.nvidia.com/GH100_H100 "
        "and has no gpu.cozystack.io/h100 or gpu.cozystack.io/total key for class h100"
    )


def test_no_node_serving_the_class_is_said_in_counts_as_for_an_order() -> None:
    snap = world("n1", gpus=0)
    answer = refusal(check_booking(snap, Bookings(), monday(1), NOW))
    assert answer.reason is Reason.NO_NODE_SERVES
    assert answer.message == (
        "no node serves class h100: of 1 node, 1 advertises no nvidia.com/GH100_H100"
    )
    assert answer.earliest is None


# --- capacity and budgets across the window ------------------------------------------------


def test_capacity_short_in_the_window_names_the_largest_and_the_earliest_window() -> None:
    snap = world("n1", "n2")
    # n1 is booked 6 from 09:00 to 18:00, n2 4 from 12:00 to 20:00: 5 fit on n1 from 18:00.
    bookings = booked(
        snap,
        monday(6, "a", node="n1", phase=BOOKED),
        reservation(
            "h100", 4, MONDAY_9 + 3 * HOUR, MONDAY_9 + 11 * HOUR, name="b", node="n2", phase=BOOKED
        ),
    )
    answer = refusal(check_booking(snap, bookings, monday(5, "c"), NOW))
    assert answer.reason is Reason.INSUFFICIENT_CAPACITY
    assert answer.earliest == MONDAY_18
    assert answer.message == (
        "no node serving class h100 has 5 units free from 2027-01-04T09:00:00Z to "
        "2027-01-04T18:00:00Z; the largest has 4 then; the earliest window of 9h that fits "
        "starts at 2027-01-04T18:00:00Z"
    )
    # Before 12:00 n2 is free: a window ending by then fits there, beside the others.
    morning = reservation("h100", 5, MONDAY_9, MONDAY_9 + 3 * HOUR, name="d")
    assert check_booking(snap, bookings, morning, NOW) == Placement("n2")


def test_budget_short_in_the_window_counts_its_bookings_and_offers_the_earliest() -> None:
    snap = world("n1", "n2", claims=(bound("h100", 2, "n1"),), namespaces=TREE)
    bookings = booked(snap, monday(6, "a", node="n2", phase=BOOKED))
    answer = refusal(check_booking(snap, bookings, monday(3, "b"), NOW))
    assert answer.reason is Reason.BUDGET_EXCEEDED
    assert answer.earliest == MONDAY_18
    assert answer.message == (
        "budget gpu.cozystack.io/h100 of tenant-a (this namespace's own quota) allows 10: "
        "2 in use and 6 booked at the busiest moment of the window, the reservation asks 3 "
        "more; the hoster can raise it (on Cozystack, the administrator of its parent tenant "
        "tenant-root, on the Tenant); the earliest window of 9h that fits starts at "
        "2027-01-04T18:00:00Z"
    )
    # The same units on Tuesday do not meet Monday's booking.
    tuesday = replace(monday(3, "b"), start=MONDAY_9 + DAY, end=MONDAY_18 + DAY)
    assert isinstance(check_booking(snap, bookings, tuesday, NOW), Placement)


def test_no_window_fits_within_max_lead_when_orders_hold_the_units_for_good() -> None:
    snap = world("n1", claims=(bound("h100", 6, "n1"),))
    answer = refusal(check_booking(snap, Bookings(), monday(3), NOW))
    assert answer.reason is Reason.INSUFFICIENT_CAPACITY
    assert answer.earliest is None
    assert answer.message.endswith(
        "; no window of 9h fits before 2027-04-01T12:00:00Z (reservations.maxLead)"
    )


def test_the_earliest_window_can_be_searched_from_now_for_a_what_if() -> None:
    snap = world("n1")
    bookings = booked(snap, monday(8, "a", node="n1", phase=BOOKED))
    asked = replace(monday(8, "b"), start=MONDAY_9 + 4 * HOUR, end=MONDAY_18 + 4 * HOUR)
    assert earliest_window(snap, bookings, asked, NOW) == MONDAY_18
    assert earliest_window(snap, bookings, asked, NOW, not_before=NOW) == int(NOW)


# --- placement -----------------------------------------------------------------------------


def test_a_window_goes_to_the_fullest_node_with_room_and_leaves_whole_nodes_free() -> None:
    snap = world("n1", "n2", "n3")
    # Nothing held now on any node, but n2 is booked 5 on Monday: 3 units fit there best.
    bookings = booked(snap, monday(5, "a", node="n2", phase=BOOKED))
    assert check_booking(snap, bookings, monday(3, "b"), NOW) == Placement("n2")
    assert check_booking(snap, bookings, monday(4, "c"), NOW) == Placement("n1")


def test_back_to_back_windows_share_a_node() -> None:
    snap = world("n1")
    bookings = booked(snap, monday(8, "a", node="n1", phase=BOOKED))
    evening = reservation("h100", 8, MONDAY_18, MONDAY_18 + 3 * HOUR, name="b")
    assert check_booking(snap, bookings, evening, NOW) == Placement("n1")
    overlapping = replace(evening, start=MONDAY_18 - 60)
    assert refusal(check_booking(snap, bookings, overlapping, NOW)).earliest == MONDAY_18


def test_a_window_placed_again_keeps_its_node_or_moves_and_skips_the_budget() -> None:
    tight = [tenant("tenant-root"), tenant("tenant-a", "tenant-root", quota={QUOTA_KEY_TOTAL: 4})]
    snap = world("n1", "n2", namespaces=tight)
    window = monday(4, "a", node="n1", phase=BOOKED)
    bookings = booked(snap, window)
    # Counted already: its own units are no one else's, and the budget (4 of 4) is not
    # judged again.
    assert check_booking(snap, bookings, window, NOW) == Placement("n1")
    snap.remove_node("n1")
    assert check_booking(snap, bookings, window, NOW) == Placement("n2")
    lost = replace(window, node=None, phase=ReservationPhase.LOST)
    bookings.upsert(lost, snap)
    assert bookings.budget_peak("tenant-a", QUOTA_KEY_TOTAL, NOW) == 4, "Lost still counts"
    assert bookings.peak("n1", H100, NOW) == 0, "and holds no node"
    assert check_booking(snap, bookings, lost, NOW) == Placement("n2")
    snap.remove_node("n2")
    answer = refusal(check_booking(snap, bookings, lost, NOW))
    assert (answer.reason, answer.earliest) == (Reason.NO_NODE_SERVES, None)


# --- orders beside windows, and a window's own claim ---------------------------------------


def test_an_order_leaves_room_for_the_busiest_moment_ahead_on_the_node_and_the_budget() -> None:
    snap = world("n1", "n2")
    bookings = booked(
        snap,
        monday(3, "a", node="n1", phase=BOOKED),
        reservation("h100", 2, MONDAY_9 + HOUR, MONDAY_18, name="b", node="n1", phase=BOOKED),
        reservation(
            "h100", 4, MONDAY_18 + DAY, MONDAY_18 + 2 * DAY, name="c", node="n2", phase=BOOKED
        ),
    )
    assert order_headroom(snap, bookings, "n1", H100, NOW) == 5
    assert order_headroom(snap, bookings, "n2", H100, NOW) == 4
    assert order_headroom(snap, bookings, "n1", H100, MONDAY_18) == 0, "the windows are over"
    for tenant_name in ("tenant-a", "tenant-root"):
        key = quota_key("h100")
        assert budget_headroom(snap, bookings, tenant_name, key, NOW) == 5
        assert budget_headroom(snap, bookings, tenant_name, QUOTA_KEY_TOTAL, NOW) == 5
        assert budget_headroom(snap, bookings, tenant_name, key, MONDAY_18) == 4


def test_an_active_window_and_its_claim_are_counted_once() -> None:
    during = MONDAY_9 + HOUR
    window = monday(6, "a", node="n1", phase=ACTIVE)
    claim = bound("h100", 6, "n1", name="a")  # the claim the window made at its start
    snap = world("n1", claims=(claim,))
    bookings = booked(snap, window)
    assert snap.free("n1", H100) == 2
    assert order_headroom(snap, bookings, "n1", H100, during) == 0
    assert budget_headroom(snap, bookings, "tenant-a", quota_key("h100"), during) == 0
    # The next window on the node starts as this one ends, when its claim is deleted.
    evening = reservation("h100", 8, MONDAY_18, MONDAY_18 + HOUR, name="b")
    assert check_booking(snap, bookings, evening, during) == Placement("n1")
    # A claim that is not the window's (another name) holds for good.
    other = world("n1", claims=(replace(claim, name="not-a"),))
    assert refusal(check_booking(other, booked(other, window), evening, during)).earliest is None


def test_a_window_claim_that_outlives_its_end_is_counted_as_a_hold() -> None:
    # The controller is late: the window has ended but its claim still holds the units.
    window = monday(6, "a", node="n1", phase=ACTIVE)
    snap = world("n1", claims=(bound("h100", 6, "n1", name="a"),))
    bookings = booked(snap, window)
    late = MONDAY_18 + 60
    assert order_headroom(snap, bookings, "n1", H100, late) == 0
    assert snap.free("n1", H100) - order_headroom(snap, bookings, "n1", H100, late) == 2
    evening = reservation("h100", 8, MONDAY_18 + HOUR, MONDAY_18 + 2 * HOUR, name="b")
    assert (
        refusal(check_booking(snap, bookings, evening, late)).reason is Reason.INSUFFICIENT_CAPACITY
    )


def test_bookings_follow_a_namespace_that_moves_in_the_tenant_tree() -> None:
    namespaces = [*TREE, tenant("tenant-b", "tenant-root")]
    snap = world("n1", namespaces=namespaces)
    bookings = booked(snap, monday(3, "a", ns="tenant-b", node="n1", phase=BOOKED))
    key = quota_key("h100")
    assert bookings.budget_peak("tenant-root", key, NOW) == 3
    snap.upsert_namespace(tenant("tenant-b", "tenant-other"))
    bookings.recharge(snap, namespace="tenant-b")
    assert bookings.budget_peak("tenant-root", key, NOW) == 0
    assert bookings.budget_peak("tenant-other", key, NOW) == 3
    assert bookings.tables() == Bookings.build(snap, bookings).tables()


def test_a_pending_or_ended_window_holds_nothing() -> None:
    snap = world("n1")
    for phase in (ReservationPhase.PENDING, ReservationPhase.ENDED):
        bookings = booked(snap, monday(8, "a", node="n1", phase=phase))
        assert bookings.peak("n1", H100, NOW) == 0
        assert bookings.budget_peak("tenant-a", QUOTA_KEY_TOTAL, NOW) == 0
        assert not bookings.on_node("n1")


# --- orders beside the windows, through the snapshot's own decisions ------------------------


def order_of(count: int, name: str = "o", ns: str = "tenant-a") -> ClaimInfo:
    return ClaimInfo(ns, name, "h100", count, created=NOW)


def test_an_order_that_would_eat_into_a_booked_window_is_refused_saying_so() -> None:
    # One node of 8: Monday's window holds 6 of them, so an order for good may take 2.
    snap = world("n1")
    snap.windows.upsert(monday(6, "a", node="n1", phase=BOOKED))
    assert check_order(snap, order_of(2), NOW) == Placement("n1")
    decision = check_order(snap, order_of(3), NOW)
    assert isinstance(decision, Refusal) and decision.reason is Reason.INSUFFICIENT_CAPACITY
    assert "the largest has 2" in decision.message
    assert "reservations booked for their windows are not free to orders" in decision.message
    # The class's free units are what an order may take.
    assert snap.class_status("h100").free == 2
    # Cancelling the window gives the units back to orders at once.
    snap.windows.remove(ClaimKey("tenant-a", "a"))
    assert check_order(snap, order_of(3), NOW) == Placement("n1")
    assert snap.class_status("h100").free == 8


def test_an_order_goes_to_a_node_whose_windows_leave_it_room() -> None:
    snap = world("n1", "n2")
    snap.windows.upsert(monday(7, "a", node="n1", phase=BOOKED))
    # n1 would be the best fit by free units alone (both have 8); its window leaves 1.
    assert check_order(snap, order_of(2), NOW) == Placement("n2")
    assert check_order(snap, order_of(1), NOW) == Placement("n1"), "best fit counts the window"


def test_an_order_under_a_budget_leaves_the_booked_units_and_says_how_many() -> None:
    snap = world("n1", "n2", namespaces=TREE)  # tenant-a: 10 H100, the root: 12
    snap.windows.upsert(monday(8, "a", node="n1", phase=BOOKED))
    assert check_order(snap, order_of(2), NOW) == Placement("n2")
    decision = check_order(snap, order_of(3), NOW)
    assert isinstance(decision, Refusal) and decision.reason is Reason.BUDGET_EXCEEDED
    assert "0 in use and 8 booked by reservations at their busiest moment" in decision.message
    # A tenant beside it under the same root shares the root's 12.
    snap.upsert_namespace(tenant("tenant-b", "tenant-root"))
    decision = check_order(snap, order_of(5, ns="tenant-b"), NOW)
    assert isinstance(decision, Refusal) and "budget gpu.cozystack.io/h100 of tenant-root" in (
        decision.message
    )


def test_an_active_window_is_held_back_once_beside_its_claim() -> None:
    window = monday(6, "a", node="n1", phase=ACTIVE)
    snap = world("n1", claims=(bound("h100", 6, "n1", name="a"),))
    snap.windows.upsert(window)
    assert snap.held_back("n1", H100) == 0, "its claim holds the units already"
    assert check_order(snap, order_of(2), MONDAY_9 + HOUR) == Placement("n1")
    # Its claim deleted (the window is ending): the window alone holds them back.
    snap.remove_claim(ClaimKey("tenant-a", "a"))
    assert snap.held_back("n1", H100) == 6


def test_held_back_units_follow_a_class_and_a_namespace_that_change() -> None:
    namespaces = [*TREE, tenant("tenant-b", "tenant-root")]
    snap = world("n1", namespaces=namespaces)
    snap.windows.upsert(monday(3, "a", ns="tenant-b", node="n1", phase=BOOKED))
    assert snap._ledger.booked("tenant-root", quota_key("h100")) == 3
    snap.upsert_namespace(tenant("tenant-b", "tenant-other"))
    assert snap._ledger.booked("tenant-root", quota_key("h100")) == 0
    assert snap._ledger.booked("tenant-other", quota_key("h100")) == 3
    assert snap.held_back("n1", H100) == 3
    snap.remove_class("h100")
    assert snap.held_back("n1", H100) == 0, "a window of no class holds no node"
    snap.upsert_class(passthrough())
    assert snap.held_back("n1", H100) == 3


def test_a_booking_is_judged_again_when_its_node_goes_is_cordoned_or_loses_capacity() -> None:
    window = monday(6, "a", node="n1", phase=BOOKED)
    snap = world("n1", "n2")
    snap.windows.upsert(window)
    assert why_move(snap, window) is None
    # NotReady keeps it: the node may be back before the window.
    snap.upsert_node(node("n1", 8, ready=False))
    assert why_move(snap, window) is None
    snap.upsert_node(node("n1", 8, unschedulable=True))
    assert why_move(snap, window) == "its node n1 is cordoned"
    # A class that stays on cordon keeps its bookings there too.
    snap.upsert_class(passthrough(on_cordon=OnCordon.STAY))
    assert why_move(snap, window) is None
    snap.upsert_node(node("n1", 4))
    assert why_move(snap, window) == (
        "its node n1 lost capacity: its windows need more than it has"
    )
    # Judged again, it goes where the window fits.
    assert check_booking(snap, snap.bookings, window, NOW) == Placement("n2")
    snap.remove_node("n1")
    assert why_move(snap, window) == "its node n1 is gone"
    # Pending, Lost and Active ones are not this rule's.
    assert why_move(snap, replace(window, phase=ReservationPhase.LOST, node=None)) is None


# --- what changes under a booked window (the bad input) ----------------------------


def test_a_window_keeps_its_units_and_budget_when_its_class_is_being_deleted() -> None:
    """As a held claim keeps its unit: the class, being deleted, stays (its finalizer waits
    for its windows too), the window is not moved or lost, and orders still leave it."""
    window = monday(6, "a", node="n1", phase=BOOKED)
    snap = world("n1", namespaces=TREE)
    snap.windows.upsert(window)
    snap.upsert_class(passthrough(deleting=True))
    assert why_move(snap, window) is None, "a class being deleted keeps its windows"
    assert snap.held_back("n1", H100) == 6
    assert snap._ledger.booked("tenant-a", quota_key("h100")) == 6
    assert snap.windows.of_class("h100") == 1, "it keeps the class from going"


def test_a_window_keeps_its_place_when_its_namespace_loses_the_vgpu_entitlement() -> None:
    window = reservation("l40s-24c", 2, MONDAY_9, MONDAY_18, name="v", node="n1", phase=BOOKED)
    snap = Snapshot.build(
        nodes=[node("n1", 8, L40S_24C)],
        classes=[vgpu()],
        namespaces=[tenant("tenant-root"), tenant("tenant-a", "tenant-root", vgpu=True)],
    )
    snap.windows.upsert(window)
    snap.upsert_namespace(tenant("tenant-a", "tenant-root"))  # the entitlement label gone
    assert why_move(snap, window) is None
    assert snap.held_back("n1", L40S_24C) == 2
    # A new booking of the class is refused for the entitlement; the booked one stays.
    new = reservation("l40s-24c", 1, MONDAY_9, MONDAY_18, name="w")
    again = check_booking(snap, snap.bookings, new, NOW)
    assert refusal(again).reason is Reason.VGPU_NOT_ENTITLED


def test_a_budget_cut_below_a_booked_window_keeps_the_window_and_refuses_new_orders() -> None:
    window = monday(8, "a", node="n1", phase=BOOKED)
    snap = world("n1", "n2", namespaces=TREE)
    snap.windows.upsert(window)
    snap.upsert_namespace(tenant("tenant-a", "tenant-root", quota={quota_key("h100"): 4}))
    assert why_move(snap, window) is None, "a budget cut never revokes a booking"
    assert snap._ledger.booked("tenant-a", quota_key("h100")) == 8
    decision = check_order(snap, order_of(1), NOW)
    assert isinstance(decision, Refusal) and decision.reason is Reason.BUDGET_EXCEEDED
    assert "8 booked by reservations" in decision.message
