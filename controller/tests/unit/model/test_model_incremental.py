"""The incremental API: one watch event at a time gives what a full rebuild gives."""

from __future__ import annotations

from dataclasses import replace

from model_builders import H100, NOW, bound, claim, node, passthrough, record_bind, tenant
from model_digest import digest

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, Phase, quota_key
from cozystack_gpu.model import MigrationTarget, Placement, Snapshot, set_placement
from cozystack_gpu.model._index import ClassIndex


def rebuilt(snap: Snapshot) -> Snapshot:
    return Snapshot.build(
        nodes=list(snap.nodes()),
        classes=list(snap.classes()),
        claims=list(snap.claims()),
        namespaces=list(snap.namespaces()),
    )


def test_every_kind_of_event_leaves_the_snapshot_equal_to_a_rebuild() -> None:
    snap = Snapshot()
    c1 = bound("h100", 2, "n1", name="c1")
    events = [
        lambda: snap.upsert_class(passthrough()),
        lambda: snap.upsert_namespace(tenant("tenant-root", quota={QUOTA_KEY_TOTAL: 6})),
        lambda: snap.upsert_namespace(tenant("tenant-a", "tenant-root")),
        lambda: snap.upsert_node(node("n1", 4)),
        lambda: snap.upsert_node(node("n2", 8)),
        lambda: snap.upsert_claim(c1),
        lambda: snap.upsert_claim(claim("h100", 1, name="c2")),
        lambda: snap.upsert_claim(bound("h100", 3, "n2", name="c2")),  # c2 binds
        # c1's VM migrates to n2: its target holds c1's units there too.
        lambda: snap.upsert_claim(replace(c1, migration=MigrationTarget("n2", "m1", NOW))),
        lambda: snap.upsert_node(node("n1", 4, ready=False)),
        lambda: snap.upsert_class(passthrough(selector={"pool": "x"})),
        lambda: snap.upsert_class(passthrough()),
        lambda: snap.upsert_namespace(tenant("tenant-a")),  # leaves the tree
        lambda: snap.upsert_claim(c1),  # the migration failed: its target is free
        lambda: snap.remove_claim(c1.key),
        lambda: snap.remove_node("n2"),
        lambda: snap.remove_namespace("tenant-root"),
        lambda: snap.remove_class("h100"),
    ]
    for event in events:
        event()
        assert digest(snap) == digest(rebuilt(snap))


def test_claims_with_migrations_leave_the_snapshot_equal_to_a_rebuild() -> None:
    vm = claim("h100", 2, name="c1", phase=Phase.ATTACHED, node="n1", attached_to="vm")
    vm = replace(vm, vmi_live=True)
    nodes = [node("n1", 4), node("n2", 4)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[vm])
    events = [
        lambda: snap.upsert_claim(replace(vm, migration=MigrationTarget("n2", "m1", NOW))),
        lambda: snap.upsert_node(node("n2", 4, unschedulable=True)),  # the target is cordoned
        lambda: snap.upsert_class(passthrough(res="nvidia.com/OTHER")),  # a new resource name
        lambda: snap.upsert_class(passthrough()),
        lambda: snap.remove_node("n2"),  # the target node goes under the migration
        lambda: snap.upsert_node(node("n2", 1)),  # and comes back smaller: over capacity
        lambda: snap.upsert_claim(replace(vm, node="n2")),  # succeeded
        lambda: snap.remove_claim(vm.key),
    ]
    for event in events:
        event()
        assert digest(snap) == digest(rebuilt(snap))


def test_namespace_ancestry_change_moves_its_claims_budget_usage() -> None:
    snap = Snapshot.build(
        nodes=[node("n1")],
        classes=[passthrough()],
        claims=[bound("h100", 2, "n1", "tenant-a")],
        namespaces=[tenant("tenant-root"), tenant("tenant-b"), tenant("tenant-a", "tenant-root")],
    )
    assert snap.budget_used("tenant-root", quota_key("h100")) == 2
    snap.upsert_namespace(tenant("tenant-a", "tenant-b"))
    assert snap.budget_used("tenant-root", quota_key("h100")) == 0
    assert snap.budget_used("tenant-b", quota_key("h100")) == 2
    assert digest(snap) == digest(rebuilt(snap))


def test_class_resource_change_moves_its_claims_to_the_new_resource() -> None:
    other = "nvidia.com/OTHER"
    snap = Snapshot.build(
        nodes=[node("n1", 4, extra={other: 4})],
        classes=[passthrough()],
        claims=[bound("h100", 3, "n1")],
    )
    assert snap.used("n1", H100) == 3
    snap.upsert_class(passthrough(res=other))
    assert snap.used("n1", H100) == 0 and snap.used("n1", other) == 3
    assert snap.class_status("h100").free == 1


def test_binder_writes_recorded_with_bind_are_seen_by_the_next_decision() -> None:
    snap = Snapshot.build(nodes=[node("n1", 2)], classes=[passthrough()])
    first = claim("h100", 2)
    assert set_placement.check_order(snap, first, NOW) == Placement("n1")
    written = record_bind(snap, first, "n1", NOW)
    assert written.phase is Phase.BOUND and written.bound_at == NOW
    assert set_placement.check_order(snap, claim("h100", 1), NOW) != Placement("n1")
    # The watch event of the same write changes nothing more.
    before = digest(snap)
    snap.upsert_claim(replace(written))
    assert digest(snap) == before


def test_free_index_best_fit_skips_rejected_names_and_survives_churn() -> None:
    idx = ClassIndex()
    for i in range(100):
        idx.put(f"n{i:03}", i % 5, 8)
    assert idx.best(3) == "n003"
    assert idx.best(3, lambda n: n != "n003") == "n008"
    assert idx.best(5) is None
    assert idx.largest() == 4
    # Nodes hop between buckets many times; stale heap entries must never be returned.
    for round_ in range(50):
        for i in range(100):
            idx.put(f"n{i:03}", (i + round_) % 5, 8)
    assert idx.total_free == sum(idx.free.values())
    expected = min((f, n) for n, f in idx.free.items() if f >= 2)
    assert idx.best(2) == expected[1]
    for i in range(100):
        idx.remove(f"n{i:03}")
    assert idx.best(0) is None and idx.max_free() == 0 and idx.max_cap() == 0
