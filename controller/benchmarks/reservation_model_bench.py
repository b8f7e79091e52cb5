"""Benchmark booking decisions at cloud scale (prints figures; not a timed test).

    cd controller && ../.venv/bin/python benchmarks/reservation_model_bench.py

Cluster: model_bench's (5,000 nodes x 8 GPUs, 16 classes, 1,000 tenants in 3 levels with
budget keys on every level, 50,000 Bound and Attached claims), then 10,000 reservations
booked through ``check_booking``: windows of 1 hour to 3 days on any minute, half of them
starting within the week (where they meet) and the rest up to 90 days ahead, 1 to 4 units
(vGPU 1 to 8); a fifth of all asks are for one crowded window (one class, next Monday
09:00-18:00), which fills and then refuses with the earliest window that fits. Every
reservation counts under the root tenant's total key, so that timeline holds all 10,000.
Prints:

- the time to book the 10,000 (decision + index update);
- booking decisions (``check_booking``): p50, p99 and max, all decisions and the refused ones
  apart (a refusal for short capacity or budget also searches the earliest window); after
  each booked one (untimed) a random reservation is cancelled, so 10,000 stay booked;
- with ``--root-room N``, the same against a root total key that leaves N units beside the
  claims, so windows are judged, and refused, against every reservation's timeline;
- ``Snapshot.upsert_reservation`` and ``remove_reservation`` per event;
- ``order_headroom`` on random nodes, ``budget_headroom`` on a leaf's key and on the root's
  total key (20,000 change points), and an order's decision (``check_order``) by the
  snapshot holding the 10,000 against the same snapshot without them.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

from model_bench import make_claims, make_classes, make_nodes, make_tenants, percentile, rss_mib

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, Mode
from cozystack_gpu.model import ClaimInfo, ClassInfo, Placement, Snapshot, set_placement
from cozystack_gpu.model.booking import budget_headroom, check_booking, order_headroom
from cozystack_gpu.model.reservations import (
    BookingRefusal,
    Bookings,
    ReservationInfo,
    ReservationPhase,
)

HOUR = 3600
DAY = 24 * HOUR
NOW = 1_800_000_000.0  # Friday 2027-01-15T08:00:00Z
MONDAY_9 = int(NOW) + 3 * DAY + HOUR


class Asks:
    """Random reservations: a class, a tenant, a count, a window on whole hours."""

    def __init__(
        self,
        rng: random.Random,
        classes: list[ClassInfo],
        leaves: list[str],
        near: float,
        crowd: float,
    ) -> None:
        self.rng = rng
        self.near = near
        self.crowd = crowd
        self.classes = classes
        self.leaves = leaves
        self.serial = 0

    def __call__(self, now: float) -> ReservationInfo:
        rng = self.rng
        self.serial += 1
        klass = rng.choice(self.classes)
        crowded = rng.random() < self.crowd
        if crowded:
            klass = self.classes[0]
        counts = (1, 1, 2, 4) if klass.mode is Mode.PASSTHROUGH else (1, 2, 4, 8)
        if crowded:
            # Everyone's favourite: one class next Monday 09:00-18:00, which fills and then
            # refuses with the earliest window that fits.
            start, length = MONDAY_9, 9 * HOUR
        else:
            # Half the windows start within the week, where they meet; any minute.
            ahead = rng.randrange(7 * DAY if rng.random() < self.near else 89 * DAY)
            start = int(now // HOUR + 1) * HOUR + ahead // 60 * 60
            length = rng.choice((1, 2, 4, 9, 24, 72)) * HOUR
        return ReservationInfo(
            namespace=rng.choice(self.leaves),
            name=f"r-{self.serial}",
            uid=f"uid-{self.serial}",
            class_name=klass.name,
            count=rng.choice(counts),
            start=start,
            end=start + length,
            created=now,
        )


def book(snap: Snapshot, bookings: Bookings, ask: ReservationInfo, now: float) -> bool:
    decision = check_booking(snap, bookings, ask, now)
    if isinstance(decision, Placement):
        snap.windows.upsert(replace(ask, node=decision.node, phase=ReservationPhase.BOOKED))
        return True
    return False


def fill(snap: Snapshot, asks: Asks, count: int) -> Bookings:
    bookings = snap.bookings
    start = time.perf_counter()
    tries = 0
    while len(bookings) < count:
        tries += 1
        book(snap, bookings, asks(NOW), NOW)
    took = time.perf_counter() - start
    print(
        f"fill: {count:,} reservations booked through check_booking in {took:.1f} s "
        f"({tries:,} asks, {tries - count:,} refused; {took / tries * 1e6:.0f} us per ask)"
    )
    return bookings


def bench_bookings(snap: Snapshot, bookings: Bookings, asks: Asks, n: int) -> None:
    rng = asks.rng
    keys = sorted(r.key for r in bookings)
    timings: list[int] = []
    refused: list[int] = []
    offered = 0
    reasons: Counter[str] = Counter()
    for _round in range(n):
        ask = asks(NOW)
        start = time.perf_counter_ns()
        decision = check_booking(snap, bookings, ask, NOW)
        took = time.perf_counter_ns() - start
        timings.append(took)
        if isinstance(decision, BookingRefusal):
            refused.append(took)
            offered += decision.earliest is not None
            reasons[str(decision.reason)] += 1
            continue
        snap.windows.upsert(replace(ask, node=decision.node, phase=ReservationPhase.BOOKED))
        j = rng.randrange(len(keys))
        snap.windows.remove(keys[j])
        keys[j] = ask.key
    print(
        f"booking decisions: {n:,} check_booking at {len(bookings):,} reservations "
        f"({n - len(refused):,} booked, {len(refused):,} refused, {offered:,} with an "
        f"earliest window): mean {statistics.fmean(timings) / 1000:.0f} us, "
        f"p50 {percentile(timings, 0.5):.0f} us, p99 {percentile(timings, 0.99):.0f} us, "
        f"max {max(timings) / 1000:.0f} us"
    )
    if refused:
        print(
            f"  refused only: p50 {percentile(refused, 0.5):.0f} us, "
            f"p99 {percentile(refused, 0.99):.0f} us, max {max(refused) / 1000:.0f} us; "
            + ", ".join(f"{reason} {n:,}" for reason, n in reasons.most_common())
        )


def bench_events(snap: Snapshot, bookings: Bookings, asks: Asks, n: int) -> None:
    """Upsert a booked reservation and remove it again: one watch event each (the snapshot's
    held-back units worked out again included)."""
    nodes = [node.name for node in snap.nodes()]
    ups: list[int] = []
    downs: list[int] = []
    for _round in range(n):
        ask = asks(NOW)
        node = asks.rng.choice(nodes)
        booked = replace(ask, node=node, phase=ReservationPhase.BOOKED)
        start = time.perf_counter_ns()
        snap.windows.upsert(booked)
        ups.append(time.perf_counter_ns() - start)
        start = time.perf_counter_ns()
        snap.windows.remove(booked.key)
        downs.append(time.perf_counter_ns() - start)
    print(
        f"events: upsert p50 {percentile(ups, 0.5):.0f} us, p99 {percentile(ups, 0.99):.0f} us; "
        f"remove p50 {percentile(downs, 0.5):.0f} us, p99 {percentile(downs, 0.99):.0f} us"
    )


def timed(call: Callable[[], object], n: int) -> list[int]:
    out = []
    for _round in range(n):
        start = time.perf_counter_ns()
        call()
        out.append(time.perf_counter_ns() - start)
    return out


def bench_headroom(
    snap: Snapshot,
    bare: Snapshot,
    bookings: Bookings,
    classes: list[ClassInfo],
    leaves: list[str],
    n: int,
) -> None:
    rng = random.Random(7)
    nodes = sorted(node.name for node in snap.nodes())
    node_res = {name: next(iter(snap.node(name).allocatable)) for name in nodes}  # type: ignore[union-attr]

    def on_node() -> int:
        name = rng.choice(nodes)
        return order_headroom(snap, bookings, name, node_res[name], NOW)

    def on_leaf() -> int:
        return budget_headroom(snap, bookings, rng.choice(leaves), QUOTA_KEY_TOTAL, NOW)

    def on_root() -> int:
        return budget_headroom(snap, bookings, "tenant-root", QUOTA_KEY_TOTAL, NOW)

    for what, call in (
        ("order_headroom (a node)", on_node),
        ("budget_headroom (a leaf's total)", on_leaf),
        ("budget_headroom (the root's total, every reservation)", on_root),
    ):
        samples = timed(call, n)
        print(
            f"{what}: p50 {percentile(samples, 0.5):.1f} us, p99 {percentile(samples, 0.99):.1f} us"
        )

    # An order judged by the snapshot without reservations (today's), then by the same
    # snapshot with the 10,000 booked: the same orders, the same claims.
    plain: list[int] = []
    beside: list[int] = []
    orders = []
    for i in range(n):
        klass = rng.choice(classes)
        orders.append(ClaimInfo(rng.choice(leaves), f"o-{i}", klass.name, rng.choice((1, 2))))
    for order in orders:
        start = time.perf_counter_ns()
        set_placement.check_order(bare, order, NOW)
        plain.append(time.perf_counter_ns() - start)
    for order in orders:
        start = time.perf_counter_ns()
        set_placement.check_order(snap, order, NOW)
        beside.append(time.perf_counter_ns() - start)
    p99_plain, p99_beside = percentile(plain, 0.99), percentile(beside, 0.99)
    print(
        f"order decision: check_order p99 {p99_plain:.0f} us with no reservation; with "
        f"{len(bookings):,} booked p99 {p99_beside:.0f} us ({p99_beside / p99_plain:.2f}x; mean "
        f"{statistics.fmean(beside) / statistics.fmean(plain):.2f}x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5_000)
    parser.add_argument("--claims", type=int, default=50_000)
    parser.add_argument("--reservations", type=int, default=10_000)
    parser.add_argument("--decisions", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--near", type=float, default=0.5, help="share of windows starting within the week"
    )
    parser.add_argument(
        "--crowd", type=float, default=0.2, help="share of asks for next Monday 09:00-18:00"
    )
    parser.add_argument(
        "--root-room",
        type=int,
        default=None,
        help="units the root's total key leaves beside the claims (default: no limit)",
    )
    args = parser.parse_args()
    rng = random.Random(args.seed)

    classes = make_classes()
    nodes = make_nodes(args.nodes, classes)
    namespaces, leaves = make_tenants(rng, classes)
    claims = make_claims(rng, args.claims, nodes, classes, leaves)
    snap = Snapshot.build(nodes=nodes, classes=classes, claims=claims, namespaces=namespaces)
    bare = Snapshot.build(nodes=nodes, classes=classes, claims=claims, namespaces=namespaces)
    before = rss_mib()
    asks = Asks(rng, classes, leaves, args.near, args.crowd)
    bookings = fill(snap, asks, args.reservations)
    # As the controller's SurvivorFreezer does: what survived a full collection is kept out
    # of the next ones, so they do not walk the snapshot and the bookings.
    gc.collect()
    gc.freeze()
    root = bookings.budget_timeline("tenant-root", QUOTA_KEY_TOTAL)
    points = len(root.points()) if root is not None else 0
    print(
        f"cluster: {args.nodes:,} nodes, {len(claims):,} claims, {len(bookings):,} "
        f"reservations; the root's total timeline has {points:,} change points; bookings "
        f"+{rss_mib() - before:.0f} MiB RSS"
    )
    if args.root_room is not None:
        # The root's total key leaves this many units beside the claims: a window is then
        # judged against the timeline of every reservation, and refused where they crowd.
        root = snap.namespace("tenant-root")
        assert root is not None
        limit = snap.budget_used("tenant-root", QUOTA_KEY_TOTAL) + args.root_room
        snap.upsert_namespace(replace(root, quota={**root.quota, QUOTA_KEY_TOTAL: limit}))
        print(f"the root's total key now allows {args.root_room:,} units beside the claims")
    bench_bookings(snap, bookings, asks, args.decisions)
    bench_events(snap, bookings, asks, args.decisions)
    bench_headroom(snap, bare, bookings, classes, leaves, args.decisions)


if __name__ == "__main__":
    main()
