"""Benchmark the placement model at cloud scale (prints figures; not a timed test).

    cd controller && ../.venv/bin/python benchmarks/model_bench.py

Cluster: 5,000 nodes x 8 GPUs, 16 classes (8 passthrough with 8 units a node, 8 vGPU with
32 units a node, every node tainted and every class tolerating it), 1,000 tenants in 3
levels with budget keys on every level, 50,000 existing claims (Bound and Attached).
Orders are 1, 2, 4 or 8 units. Prints:

- check_order + bind decisions per second on one core, mean and p99;
- the cost of a decision at 50,000 nodes against 500 nodes;
- full snapshot build time and resident memory;
- the time of one incremental event, per kind;
- head-of-line: 10,000 orders that cannot fit ahead of 1,000 that can, one ``plan`` pass;
- a pass behind a backlog: what every pass costs while 10,000 orders that fit no node wait
  and one new order arrives (the binder's steady state in peer_bench's head-of-line phase).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from cozystack_gpu.keys import (
    LABEL_NODE_LAYOUT,
    LABEL_VGPU_ENTITLEMENT,
    QUOTA_KEY_TOTAL,
    TENANT_LABEL_PREFIX,
    Mode,
    Phase,
    quota_key,
)
from cozystack_gpu.model import (
    ClaimInfo,
    ClassInfo,
    Device,
    NamespaceInfo,
    NodeInfo,
    Placement,
    Snapshot,
    Step,
    Taint,
    Toleration,
    plan,
    set_placement,
)

TAINT = Taint("gpu.cozystack.io/dedicated", "NoSchedule", "true")
TOLERATION = Toleration("gpu.cozystack.io/dedicated", "Exists")
COUNTS = (1, 2, 4, 8)
_serial = itertools.count()


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_classes() -> list[ClassInfo]:
    classes = []
    for k in range(8):
        for mode, prefix in ((Mode.PASSTHROUGH, "pt"), (Mode.VGPU, "vg")):
            classes.append(
                ClassInfo(
                    name=f"{prefix}{k}",
                    mode=mode,
                    resource_name=f"nvidia.com/{prefix.upper()}{k}",
                    max_count=8,
                    node_selector={LABEL_NODE_LAYOUT: f"{prefix}{k}"},
                    tolerations=(TOLERATION,),
                )
            )
    return classes


def make_nodes(count: int, classes: list[ClassInfo]) -> list[NodeInfo]:
    nodes = []
    for i in range(count):
        klass = classes[i % len(classes)]
        per_gpu = 1 if klass.mode is Mode.PASSTHROUGH else 4
        device = Device(klass.resource_name, per_gpu)
        nodes.append(
            NodeInfo(
                name=f"node-{i:05}",
                labels={LABEL_NODE_LAYOUT: klass.node_selector[LABEL_NODE_LAYOUT], "zone": "a"},
                taints=(TAINT,),
                allocatable={klass.resource_name: 8 * per_gpu},
                devices=(device,) * 8,
            )
        )
    return nodes


def make_tenants(
    rng: random.Random, classes: list[ClassInfo]
) -> tuple[list[NamespaceInfo], list[str]]:
    """1 root, 30 second-level tenants, 969 third-level ones: 1,000 in 3 levels."""

    def labels(name: str, *ancestors: str) -> dict[str, str]:
        out = {TENANT_LABEL_PREFIX + a: "" for a in (*ancestors, name)}
        out[LABEL_VGPU_ENTITLEMENT] = "true"
        return out

    namespaces = [NamespaceInfo("tenant-root", labels("tenant-root"), {QUOTA_KEY_TOTAL: 10**7})]
    leaves = []
    for j in range(30):
        mid = f"tenant-t{j}"
        quota = {quota_key(c.name): 10**6 for c in rng.sample(classes, 4)}
        namespaces.append(NamespaceInfo(mid, labels(mid, "tenant-root"), quota))
        for m in range(969 // 30 + (1 if j < 969 % 30 else 0)):
            leaf = f"tenant-t{j}-{m}"
            namespaces.append(
                NamespaceInfo(leaf, labels(leaf, "tenant-root", mid), {QUOTA_KEY_TOTAL: 10**5})
            )
            leaves.append(leaf)
    return namespaces, leaves


def make_claims(
    rng: random.Random,
    count: int,
    nodes: list[NodeInfo],
    classes: list[ClassInfo],
    leaves: list[str],
    fill: float = 0.75,
) -> list[ClaimInfo]:
    """Bound and Attached claims on random nodes, each node filled up to ``fill``: a vGPU
    node (32 units) takes more claims than a passthrough one (8)."""
    class_of = {c.resource_name: c for c in classes}
    room = {}
    for node in nodes:
        res = next(iter(node.allocatable))
        room[node.name] = int(node.allocatable[res] * fill)
    if sum(room.values()) < count:
        raise ValueError("not enough room for the claims")
    claims = []
    serial = 0
    open_nodes = [n for n in nodes if room[n.name] > 0]
    while len(claims) < count:
        if not open_nodes:
            raise ValueError("nodes filled before the claims were placed")
        j = rng.randrange(len(open_nodes))
        info = open_nodes[j]
        node = info.name
        klass = class_of[next(iter(info.allocatable))]
        units = min(rng.choices(COUNTS, (80, 15, 4, 1))[0], room[node])
        room[node] -= units
        if not room[node]:
            open_nodes[j] = open_nodes[-1]
            open_nodes.pop()
        serial += 1
        attached = rng.random() < 0.3
        claims.append(
            ClaimInfo(
                namespace=rng.choice(leaves),
                name=f"claim-{serial}",
                class_name=klass.name,
                count=units,
                created=float(serial),
                phase=Phase.ATTACHED if attached else Phase.BOUND,
                node=node,
                attached_to=f"vm-{serial}" if attached else None,
                vmi_live=attached,
                bound_at=float(serial),
            )
        )
    return claims


def percentile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def decide_and_bind(
    snap: Snapshot,
    rng: random.Random,
    classes: list[ClassInfo],
    leaves: list[str],
    decisions: int,
    held: list[ClaimInfo],
) -> tuple[list[int], int]:
    """Time ``decisions`` check_order (+ bind when placed); after each bind (untimed),
    release random held claims while more units are held than at the start, so the cluster
    stays as full as it began."""
    timings = []
    placed = 0
    now = 1e9
    target = sum(c.count for c in held)
    units = target
    for _decision in range(decisions):
        order = ClaimInfo(
            namespace=rng.choice(leaves),
            name=f"order-{next(_serial)}",
            class_name=rng.choice(classes).name,
            count=rng.choice(COUNTS),
            created=now,
        )
        start = time.perf_counter_ns()
        decision = set_placement.check_order(snap, order, now)
        if isinstance(decision, Placement):
            bound = replace(order, phase=Phase.BOUND, node=decision.node, bound_at=now)
            snap.upsert_claim(bound)
        timings.append(time.perf_counter_ns() - start)
        if isinstance(decision, Placement):
            placed += 1
            held.append(bound)
            units += bound.count
            while units > target:
                j = rng.randrange(len(held))
                held[j], held[-1] = held[-1], held[j]
                gone = held.pop()
                snap.remove_claim(gone.key)
                units -= gone.count
    return timings, placed


def bench_decisions(snap: Snapshot, rng: random.Random, classes, leaves, claims, n: int) -> None:
    held = list(claims)
    decide_and_bind(snap, rng, classes, leaves, 2_000, held)  # warm up
    gc.collect()
    start = time.perf_counter()
    timings, placed = decide_and_bind(snap, rng, classes, leaves, n, held)
    wall = time.perf_counter() - start
    decided = sum(timings) / 1e9
    print(
        f"decisions: {n:,} check_order+bind ({placed:,} placed, {n - placed:,} refused) "
        f"-> {n / decided:,.0f}/s timed, {n / wall:,.0f}/s incl. releases; "
        f"mean {statistics.fmean(timings) / 1000:.1f} us, p50 {percentile(timings, 0.5):.1f} us, "
        f"p99 {percentile(timings, 0.99):.1f} us, max {max(timings) / 1000:.0f} us; "
        f"{len(held):,} claims held after the run"
    )


def bench_scaling(rng: random.Random, n: int) -> None:
    classes = make_classes()
    namespaces, leaves = make_tenants(rng, classes)
    means = {}
    for count in (500, 50_000):
        nodes = make_nodes(count, classes)
        claims = make_claims(rng, count * 2, nodes, classes, leaves)
        snap = Snapshot.build(nodes=nodes, classes=classes, claims=claims, namespaces=namespaces)
        held = list(claims)
        decide_and_bind(snap, rng, classes, leaves, 2_000, held)
        gc.collect()
        timings, _placed = decide_and_bind(snap, rng, classes, leaves, n, held)
        means[count] = statistics.fmean(timings) / 1000
        print(
            f"scaling: {count:>6,} nodes, {len(claims):,} claims: mean {means[count]:.1f} us, "
            f"p99 {percentile(timings, 0.99):.1f} us per decision"
        )
        del snap, nodes, claims, held
        gc.collect()
    print(f"scaling: cost at 50,000 nodes / cost at 500 nodes = {means[50_000] / means[500]:.2f}x")


def bench_events(
    snap: Snapshot, rng: random.Random, nodes: list[NodeInfo], claims, namespaces, n: int
) -> None:
    now = 1e9

    def timed(label: str, make: Callable[[int], Callable[[], None]]) -> None:
        samples = []
        for i in range(n):
            event = make(i)
            start = time.perf_counter_ns()
            event()
            samples.append(time.perf_counter_ns() - start)
        print(
            f"event: {label:<38} mean {statistics.fmean(samples) / 1000:5.1f} us, "
            f"p99 {percentile(samples, 0.99):5.1f} us"
        )

    def node_changed(i: int) -> Callable[[], None]:
        current = snap.node(f"node-{rng.randrange(len(nodes)):05}")
        assert current is not None
        res = next(iter(current.allocatable))
        changed = replace(current, raw_used={} if current.raw_used else {res: 1})
        return lambda: snap.upsert_node(changed)

    def node_ready_flip(i: int) -> Callable[[], None]:
        name = f"node-{rng.randrange(len(nodes)):05}"
        current = snap.node(name)
        assert current is not None
        return lambda: snap.upsert_node(replace(current, ready=not current.ready))

    pool = [c for c in snap.claims() if c.phase is Phase.BOUND][:n]

    def claim_attached(i: int) -> Callable[[], None]:
        claim = pool[i % len(pool)]
        current = snap.claim(claim.key)
        assert current is not None
        if current.phase is Phase.BOUND:
            new = replace(current, phase=Phase.ATTACHED, attached_to="vm", vmi_live=True)
        else:
            new = replace(current, phase=Phase.BOUND, attached_to=None, vmi_live=False)
        return lambda: snap.upsert_claim(new)

    added: list[ClaimInfo] = []

    def claim_added(i: int) -> Callable[[], None]:
        base = pool[i % len(pool)]
        new = replace(base, name=f"extra-{i}", count=1, created=now, bound_at=now)
        added.append(new)
        return lambda: snap.upsert_claim(new)

    def claim_removed(i: int) -> Callable[[], None]:
        key = added[i].key
        return lambda: snap.remove_claim(key)

    def quota_changed(i: int) -> Callable[[], None]:
        ns = namespaces[1 + rng.randrange(len(namespaces) - 1)]
        new = replace(ns, quota={**ns.quota, QUOTA_KEY_TOTAL: 10**5 + i})
        return lambda: snap.upsert_namespace(new)

    timed("node changed (raw-name pod usage)", node_changed)
    timed("node Ready flipped", node_ready_flip)
    timed("claim Bound <-> Attached", claim_attached)
    timed("claim added (Bound)", claim_added)
    timed("claim removed", claim_removed)
    timed("namespace quota changed", quota_changed)


def bench_head_of_line(rng: random.Random) -> None:
    """5,000 nodes of one class, each with 6 of 8 units free; 10,000 8-unit orders (none can
    fit) arrive before 1,000 1-unit orders (all can). The held units are attached: unattached
    ones packing would move to make room for the 8-unit orders (packing_bench.py measures
    that)."""
    klass = ClassInfo(
        "h100", Mode.PASSTHROUGH, "nvidia.com/GH100_H100", 8, tolerations=(TOLERATION,)
    )
    nodes = [
        NodeInfo(
            f"node-{i:05}",
            taints=(TAINT,),
            allocatable={klass.resource_name: 8},
            devices=(Device(klass.resource_name, 1),) * 8,
        )
        for i in range(5_000)
    ]
    claims = [
        ClaimInfo(
            "tenant-a",
            f"held-{i}",
            "h100",
            2,
            0.0,
            Phase.ATTACHED,
            node=n.name,
            attached_to=f"vm-{i}",
            vmi_live=True,
            bound_at=0.0,
        )
        for i, n in enumerate(nodes)
    ]
    claims += [ClaimInfo("tenant-a", f"big-{i}", "h100", 8, 1.0 + i) for i in range(10_000)]
    claims += [ClaimInfo("tenant-b", f"small-{i}", "h100", 1, 20_000.0 + i) for i in range(1_000)]
    snap = Snapshot.build(nodes=nodes, classes=[klass], claims=claims)
    gc.collect()
    start = time.perf_counter()
    result = plan(snap, 1e9)
    elapsed = time.perf_counter() - start
    binds = [a for a in result.actions if a.step is Step.BIND]
    waits = [a for a in result.actions if a.step is Step.WAIT]
    print(
        f"head-of-line: one plan pass over 10,000 unsatisfiable + 1,000 satisfiable orders: "
        f"{len(binds):,} bound, {len(waits):,} wait, in {elapsed * 1000:.0f} ms"
    )


def bench_pass_behind_backlog(passes: int = 30) -> None:
    """200 nodes of 64 units, as peer_bench's plane; 10,000 orders of 65 units (larger than
    any node) wait. Each pass meets one new 1-unit order, is planned, and its order leaves
    again: the median pass is what every order that fits waits on behind the backlog."""
    klass = ClassInfo("bench", Mode.PASSTHROUGH, "nvidia.com/BENCH", 130)
    nodes = [
        NodeInfo(
            f"node-{i:03}",
            allocatable={klass.resource_name: 64},
            devices=(Device(klass.resource_name, 64),),
        )
        for i in range(200)
    ]
    claims = [ClaimInfo("tenant-a", f"x{i:05}", "bench", 65, 1.0 + i) for i in range(10_000)]
    snap = Snapshot.build(nodes=nodes, classes=[klass], claims=claims)
    gc.collect()
    times = []
    for i in range(passes):
        order = ClaimInfo("tenant-a", f"ok{i:04}", "bench", 1, 20_000.0 + i)
        snap.upsert_claim(order)
        start = time.perf_counter()
        result = plan(snap, 1e9)
        times.append(time.perf_counter() - start)
        assert [a.step for a in result.actions].count(Step.BIND) == 1
        snap.remove_claim(order.key)
    print(
        f"a pass behind a backlog: 10,000 orders fitting no node (200 nodes) and one new "
        f"order: median {statistics.median(times) * 1000:.1f} ms, "
        f"max {max(times) * 1000:.1f} ms over {passes} passes"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--only-backlog", action="store_true", help="only the pass behind a backlog"
    )
    args = parser.parse_args()
    if args.only_backlog:
        bench_pass_behind_backlog()
        return
    rng = random.Random(args.seed)

    base_rss = rss_mib()
    classes = make_classes()
    nodes = make_nodes(5_000, classes)
    namespaces, leaves = make_tenants(rng, classes)
    claims = make_claims(rng, 50_000, nodes, classes, leaves)
    inputs_rss = rss_mib()
    gc.collect()
    start = time.perf_counter()
    snap = Snapshot.build(nodes=nodes, classes=classes, claims=claims, namespaces=namespaces)
    build = time.perf_counter() - start
    built_rss = rss_mib()
    print(
        f"build: Snapshot.build of 5,000 nodes, 16 classes, {len(namespaces):,} namespaces, "
        f"{len(claims):,} claims in {build * 1000:.0f} ms; RSS {built_rss:.0f} MiB "
        f"(interpreter {base_rss:.0f}, input objects +{inputs_rss - base_rss:.0f}, "
        f"snapshot indexes +{built_rss - inputs_rss:.0f})"
    )
    bench_decisions(snap, rng, classes, leaves, claims, args.decisions)
    bench_events(snap, rng, nodes, claims, namespaces, args.events)
    del snap
    gc.collect()
    bench_scaling(rng, min(args.decisions, 20_000))
    bench_head_of_line(rng)


if __name__ == "__main__":
    main()
