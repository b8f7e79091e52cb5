"""Random clusters with reservations, operations on them in time, and oracles that check the
windows and the budgets from the raw objects alone (no index), for the reservation
properties.

Operations are tuples of small integers, as in ``model_world``, so hypothesis can shrink a
failing sequence. Bookings are accepted only through ``check_booking``, orders only where
the snapshot's own order decision (``set_placement.check_order``) places them, which must
agree with ``order_headroom`` and ``budget_headroom`` read with the clock; and the clock
moves windows through their lives: at ``start`` a Booked window becomes Active with its
claim Bound on its node, at ``end`` both go.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace

from cozystack_gpu.keys import (
    LABEL_VGPU_ENTITLEMENT,
    QUOTA_KEY_TOTAL,
    TENANT_LABEL_PREFIX,
    Mode,
    Phase,
    quota_key,
    raw_quota_keys,
)
from cozystack_gpu.model import (
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    Device,
    NamespaceInfo,
    NodeInfo,
    Placement,
    Refusal,
    Snapshot,
    set_placement,
)
from cozystack_gpu.model.booking import (
    budget_headroom,
    check_booking,
    order_headroom,
)
from cozystack_gpu.model.reservations import (
    BookingRefusal,
    Bookings,
    BookingSettings,
    ReservationInfo,
    ReservationPhase,
)
from cozystack_gpu.model.types import Reason

MINUTE = 60
HOUR = 3600
T0 = 1_800_000_000  # 2027-01-15T08:00:00Z, a whole hour
SETTINGS = BookingSettings(max_lead=2 * 24 * HOUR, max_length=12 * HOUR)
RES = {"pa": "nvidia.com/GA100", "pb": "nvidia.com/AD102GL_L40S", "va": "nvidia.com/L40S-24C"}
CLASSES = {
    "pa": ClassInfo("pa", Mode.PASSTHROUGH, RES["pa"]),
    "pb": ClassInfo("pb", Mode.PASSTHROUGH, RES["pb"]),
    "va": ClassInfo("va", Mode.VGPU, RES["va"], max_count=2),
}
TENANTS = {
    "tenant-root": (),
    "tenant-a": ("tenant-root",),
    "tenant-b": ("tenant-root",),
    "tenant-a-x": ("tenant-root", "tenant-a"),
}
QUOTA_KEYS = (quota_key("pa"), quota_key("pb"), quota_key("va"), QUOTA_KEY_TOTAL)
CAPACITY_SHORT = (Reason.INSUFFICIENT_CAPACITY, Reason.BUDGET_EXCEEDED)
ORDER_JUDGED = (*CAPACITY_SHORT, Reason.NO_NODE_SERVES)

Op = tuple[int, int, int, int]
N_OPS = 10


def reservation(
    cls: str,
    count: int,
    start: int,
    end: int,
    ns: str = "tenant-a",
    *,
    name: str = "r",
    node: str | None = None,
    phase: ReservationPhase = ReservationPhase.PENDING,
    created: float = 0.0,
) -> ReservationInfo:
    return ReservationInfo(
        ns, name, f"uid-{ns}-{name}", cls, count, start, end, node, phase, created
    )


def make_node(name: str, r: random.Random) -> NodeInfo:
    class_name = r.choice(("pa", "pa", "pb", "va"))
    units = {"pa": r.choice((2, 4, 8)), "pb": 4, "va": 8}[class_name]
    res = RES[class_name]
    return NodeInfo(name=name, allocatable={res: units}, devices=(Device(res, 1),) * units)


def make_namespace(name: str, r: random.Random) -> NamespaceInfo:
    labels = {TENANT_LABEL_PREFIX + a: "" for a in (*TENANTS[name], name)}
    if r.random() < 0.7:
        labels[LABEL_VGPU_ENTITLEMENT] = "true"
    quota = {key: r.randrange(2, 17) for key in QUOTA_KEYS if r.random() < 0.35}
    if "gpu.cozystack.io/pa" in quota and r.random() < 0.5:
        quota[raw_quota_keys(RES["pa"])[0]] = r.randrange(2, 17)
    return NamespaceInfo(name, labels, quota)


def charges(class_name: str, key: str) -> bool:
    """Whether a unit of the class counts against the budget key (the oracle's own rule)."""
    return key in (QUOTA_KEY_TOTAL, quota_key(class_name), *raw_quota_keys(RES[class_name]))


@dataclass
class Sim:
    """The objects (the source of truth), the snapshot and the bookings fed from them, the
    clock, and what the run did (``seen``), so tests can tell it exercised the rules."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    claims: dict[ClaimKey, ClaimInfo] = field(default_factory=dict)  # orders, and windows'
    windows: dict[ClaimKey, ReservationInfo] = field(default_factory=dict)
    snap: Snapshot = field(default_factory=Snapshot)
    now: float = float(T0)
    serial: int = 0
    seen: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, seed: int) -> Sim:
        r = random.Random(seed)
        sim = cls()
        for klass in CLASSES.values():
            sim.snap.upsert_class(klass)
        for name in TENANTS:
            sim.namespaces[name] = make_namespace(name, r)
            sim.snap.upsert_namespace(sim.namespaces[name])
        for _node in range(r.randrange(3, 7)):
            sim.add_node(r.randrange(1000))
        for _step in range(r.randrange(0, 6)):
            sim.order(r.randrange(1000), r.randrange(1000), r.randrange(1000))
        return sim

    @property
    def bookings(self) -> Bookings:
        return self.snap.bookings

    def rebuilt(self) -> tuple[Snapshot, Bookings]:
        """A snapshot and bookings built afresh from the objects (reservations in reverse)."""
        snap = Snapshot.build(
            nodes=self.nodes.values(),
            classes=CLASSES.values(),
            claims=self.claims.values(),
            namespaces=self.namespaces.values(),
            reservations=sorted(self.windows.values(), key=_order)[::-1],
        )
        return snap, snap.bookings

    # --- operations ------------------------------------------------------------------------

    def apply(self, op: Op, check: bool = True) -> None:
        kind, a, b, c = op
        kind %= N_OPS
        if kind in (0, 1, 2):
            self.book(self.new_window(a, b, c))
        elif kind == 3:
            self.cancel(a)
        elif kind == 4:
            self.lose_node(a) if a % 2 else self.add_node(a)
        elif kind in (5, 6):
            self.step(a)
        elif kind in (7, 8):
            self.order(a, b, c)
        else:
            self.release(a)
        if check:
            self.check_windows()
            self.check_budgets()

    def new_window(self, a: int, b: int, c: int) -> ReservationInfo:
        self.serial += 1
        half_hours = -(-int(self.now) // (30 * MINUTE))
        start = (half_hours + (a // 3) % 60) * 30 * MINUTE
        if a % 23 == 0:
            start -= 60 * MINUTE  # in the past
        length = (1 + (c // 4) % 16) * 30 * MINUTE + (13 * HOUR if c % 29 == 0 else 0)
        return reservation(
            sorted(CLASSES)[a % 3],
            1 + c % 3,
            start,
            start + length,
            sorted(TENANTS)[b % len(TENANTS)],
            name=f"w{self.serial}",
            created=self.now,
        )

    def book(self, window: ReservationInfo) -> None:
        decision = check_booking(self.snap, self.bookings, window, self.now, SETTINGS)
        self.seen["judged"] += 1
        if isinstance(decision, Placement):
            self.put_window(replace(window, node=decision.node, phase=ReservationPhase.BOOKED))
            self.seen["booked"] += 1
            return
        assert isinstance(decision, BookingRefusal)
        self.seen[str(decision.reason)] += 1
        if decision.earliest is not None:
            self.seen["offered"] += 1

    def cancel(self, a: int) -> None:
        if self.windows:
            self.drop_window(sorted(self.windows)[a % len(self.windows)])

    def add_node(self, a: int) -> None:
        self.serial += 1
        node = make_node(f"n{self.serial}", random.Random(a))
        self.nodes[node.name] = node
        self.snap.upsert_node(node)
        self.place_lost()

    def lose_node(self, a: int) -> None:
        """A node goes: its orders go with it, its windows are placed again or Lost."""
        if not self.nodes:
            return
        name = sorted(self.nodes)[a % len(self.nodes)]
        del self.nodes[name]
        self.snap.remove_node(name)
        for key in [k for k, c in self.claims.items() if c.node == name]:
            if key not in self.windows:
                self.drop_claim(key)
        for key in sorted(self.bookings.on_node(name), key=lambda k: _order(self.windows[k])):
            self.seen["moved"] += 1
            self.place_again(self.windows[key])

    def place_lost(self) -> None:
        for window in sorted(self.windows.values(), key=_order):
            if window.phase is ReservationPhase.LOST:
                self.place_again(window)

    def place_again(self, window: ReservationInfo) -> None:
        decision = check_booking(self.snap, self.bookings, window, self.now, SETTINGS)
        claim = self.claims.get(window.key)
        if isinstance(decision, Placement):
            begun = window.start <= self.now
            phase = ReservationPhase.ACTIVE if begun else ReservationPhase.BOOKED
            self.put_window(replace(window, node=decision.node, phase=phase))
            if begun:
                self.put_claim(self.window_claim(self.windows[window.key]))
            elif claim is not None:
                self.drop_claim(window.key)
            return
        self.seen["lost"] += 1
        self.put_window(replace(window, node=None, phase=ReservationPhase.LOST))
        if claim is not None:
            self.drop_claim(window.key)

    def step(self, a: int) -> None:
        """The clock moves: windows end and start in time order (ends first at one time)."""
        until = self.now + (1 + a % 32) * 15 * MINUTE
        moments = sorted(
            {w.start for w in self.windows.values() if self.now < w.start <= until}
            | {w.end for w in self.windows.values() if self.now < w.end <= until}
        )
        for t in moments:
            self.now = float(t)
            for window in sorted(self.windows.values(), key=_order):
                if window.end == t:
                    self.drop_window(window.key)
                    self.seen["ended"] += 1
            for window in sorted(self.windows.values(), key=_order):
                if window.start == t and window.phase is ReservationPhase.BOOKED:
                    self.check_window_starts_whole(window)
                    self.put_window(replace(window, phase=ReservationPhase.ACTIVE))
                    self.put_claim(self.window_claim(self.windows[window.key]))
                    self.seen["started"] += 1
        self.now = until
        self.place_lost()

    def order(self, a: int, b: int, c: int) -> None:
        """An on-demand order, bound where the snapshot's order decision places it. With
        the clock, the booking model says where it may go (every booked window keeps its
        units and every budget its room at every moment from now on): the decision must
        be that best fit, and a refusal must mean there is none."""
        self.serial += 1
        class_name = sorted(CLASSES)[a % 3]
        ns = sorted(TENANTS)[b % len(TENANTS)]
        order = ClaimInfo(ns, f"c{self.serial}", class_name, 1 + c % 3, created=self.now)
        decision = set_placement.check_order(self.snap, order, self.now)
        expected = self.where_an_order_fits(order)
        if expected is None:
            assert not isinstance(decision, Placement), (order, decision)
            return
        if isinstance(decision, Refusal) and decision.reason not in ORDER_JUDGED:
            return  # shape or entitlement: the oracle reads capacity and budgets only
        assert isinstance(decision, Placement), (order, decision, expected)
        assert decision.node == expected, (order, decision, expected)
        self.put_claim(replace(order, phase=Phase.BOUND, node=decision.node, bound_at=self.now))
        self.seen["ordered"] += 1

    def where_an_order_fits(self, order: ClaimInfo) -> str | None:
        """The best-fit node an order may take beside the booked windows, judged with the
        clock by the booking model; None when a budget or every node is short."""
        klass = CLASSES[order.class_name]
        limits, uncovered = self.snap._ledger.budget_checks(order.namespace, klass)
        if uncovered is not None:
            return None
        for limit in limits:
            room = budget_headroom(self.snap, self.bookings, limit.tenant, limit.key, self.now)
            if self.snap.budget_used(limit.tenant, limit.key) + room + order.count > limit.limit:
                self.seen["order kept out by a budget's windows"] += 1
                return None
        res = klass.resource_name
        fits = [
            (left, name)
            for name in sorted(self.nodes)
            if self.snap.serves(name, order.class_name)
            and (
                left := self.snap.free(name, res)
                - order_headroom(self.snap, self.bookings, name, res, self.now)
            )
            >= order.count
        ]
        if not fits:
            self.seen["order kept out by a node's windows"] += 1
            return None
        return min(fits)[1]

    def release(self, a: int) -> None:
        orders = sorted(k for k in self.claims if k not in self.windows)
        if orders:
            self.drop_claim(orders[a % len(orders)])

    # --- objects ---------------------------------------------------------------------------

    def window_claim(self, window: ReservationInfo) -> ClaimInfo:
        """The claim a window makes at its start: its name, Bound on its node."""
        return ClaimInfo(
            window.namespace,
            window.name,
            window.class_name,
            window.count,
            created=self.now,
            phase=Phase.BOUND,
            node=window.node,
            bound_at=self.now,
        )

    def put_window(self, window: ReservationInfo) -> None:
        self.windows[window.key] = window
        self.snap.windows.upsert(window)

    def drop_window(self, key: ClaimKey) -> None:
        del self.windows[key]
        self.snap.windows.remove(key)
        if key in self.claims:
            self.drop_claim(key)

    def put_claim(self, claim: ClaimInfo) -> None:
        self.claims[claim.key] = claim
        self.snap.upsert_claim(claim)

    def drop_claim(self, key: ClaimKey) -> None:
        del self.claims[key]
        self.snap.remove_claim(key)

    # --- oracles ---------------------------------------------------------------------------

    def moments(self) -> list[float]:
        """Now and every later moment a window starts or ends: where held units change."""
        later = {t for w in self.windows.values() for t in (w.start, w.end) if t > self.now}
        return [self.now, *sorted(later)]

    def held_on(self, node: str, res: str, t: float, but: ClaimKey | None = None) -> int:
        """Units held on the node at ``t``: orders (from now on), and the windows booked
        there that cover ``t`` (a window's claim is the window's, counted once)."""
        orders = sum(
            c.count
            for k, c in self.claims.items()
            if k not in self.windows
            and c.node == node
            and CLASSES[c.class_name].resource_name == res
        )
        windows = sum(
            w.count
            for w in self.windows.values()
            if w.holds_node
            and w.node == node
            and RES[w.class_name] == res
            and w.start <= t < w.end
            and w.key != but
        )
        return orders + windows

    def check_window_starts_whole(self, window: ReservationInfo) -> None:
        assert window.node is not None
        node = self.nodes.get(window.node)
        assert node is not None, f"{window.key} starts on node {window.node}, which is gone"
        res = RES[window.class_name]
        others = self.held_on(window.node, res, self.now, but=window.key)
        assert node.capacity().get(res, 0) - others >= window.count, (
            f"{window.key} starts short on {window.node}: {others} held beside it"
        )

    def check_windows(self) -> None:
        """No node holds more than its capacity at any moment from now on."""
        moments = self.moments()
        for name, node in self.nodes.items():
            for res, capacity in node.capacity().items():
                for t in moments:
                    held = self.held_on(name, res, t)
                    assert held <= capacity, f"{name} holds {held} > {capacity} {res} at {t}"
        for window in self.windows.values():
            if window.holds_node:
                assert window.node in self.nodes, f"{window.key} is booked on a node gone"

    def usage(self, tenant: str, key: str, t: float) -> int:
        """Units counted against the tenant's key at ``t``: orders, and windows that count."""
        under = {n for n, ns in self.namespaces.items() if tenant in ns.ancestors}
        used = sum(
            c.count
            for k, c in self.claims.items()
            if k not in self.windows and c.namespace in under and charges(c.class_name, key)
        )
        return used + sum(
            w.count
            for w in self.windows.values()
            if w.counts_budget
            and w.namespace in under
            and charges(w.class_name, key)
            and w.start <= t < w.end
        )

    def check_budgets(self) -> None:
        """No budget key over its limit at any moment from now on."""
        moments = self.moments()
        for tenant, ns in self.namespaces.items():
            for key, limit in ns.quota.items():
                for t in moments:
                    used = self.usage(tenant, key, t)
                    assert used <= limit, f"{tenant} {key}: {used} > {limit} at {t}"


def _order(window: ReservationInfo) -> tuple[int, float, str, str]:
    return (window.start, window.created, window.namespace, window.name)


def random_sim(seed: int, ops: list[Op], check: bool = True) -> Sim:
    sim = Sim.of(seed)
    for op in ops:
        sim.apply(op, check)
    return sim
