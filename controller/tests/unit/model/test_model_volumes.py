"""A stopped VM's hold stays with its local disk: a set whose VM has a volume with node
affinity usable from the set's node is not moved off it, but for the node being gone."""

from __future__ import annotations

from dataclasses import replace

from model_builders import H100, NOW, bound, claim, node, passthrough

from cozystack_gpu.keys import LABEL_NODE_LAYOUT_STATE, OnCordon
from cozystack_gpu.model import (
    ClaimInfo,
    NodeRequirement,
    Placement,
    Refusal,
    Snapshot,
    Step,
    Taint,
    VolumeAffinity,
    make_room,
    plan,
    set_placement,
)
from cozystack_gpu.model.packing import may_move

HOSTNAME = "kubernetes.io/hostname"


def local_disk(node_name: str) -> VolumeAffinity:
    """A local PV as the local-path provisioner writes it: the node's hostname label."""
    return VolumeAffinity("pv-" + node_name, ((NodeRequirement(HOSTNAME, "In", (node_name,)),),))


def host(name: str, gpus: int = 8, **kw: object) -> object:
    made = node(name, gpus, **kw)  # type: ignore[arg-type]
    return replace(made, labels={**made.labels, HOSTNAME: name})


def on_disk(c: ClaimInfo, node_name: str) -> ClaimInfo:
    return replace(c, volumes=(local_disk(node_name),))


def test_a_set_on_its_local_disk_stays_on_a_cordoned_node_under_on_cordon_move() -> None:
    held = on_disk(bound("h100", 2, "n1", name="held", set_id="vm/a"), "n1")
    snap = Snapshot.build(
        nodes=[host("n1", unschedulable=True), host("n2")],
        classes=[passthrough(on_cordon=OnCordon.MOVE)],
        claims=[held],
    )
    assert plan(snap, NOW).changes == ()


def test_a_set_on_its_local_disk_is_not_moved_for_a_node_that_stopped_serving() -> None:
    held = on_disk(bound("h100", 2, "n1", name="held", set_id="vm/a"), "n1")
    for changed in (
        {"ready": False},
        {"labels": {HOSTNAME: "n1", LABEL_NODE_LAYOUT_STATE: "pending"}},
        {"taints": (Taint("gpu", "NoSchedule", "true"),)},
        {"inventory_stale": True, "allocatable": {H100: 8}},
    ):
        n1 = replace(host("n1"), **changed)  # type: ignore[arg-type]
        snap = Snapshot.build(nodes=[n1, host("n2")], classes=[passthrough()], claims=[held])
        assert plan(snap, NOW).changes == (), changed
    # Another class's selector no longer matches: it stays too.
    snap = Snapshot.build(
        nodes=[host("n1"), host("n2", labels={"pool": "gpu"})],
        classes=[passthrough(selector={"pool": "gpu"})],
        claims=[held],
    )
    assert plan(snap, NOW).changes == ()


def test_a_set_on_its_local_disk_leaves_when_its_node_is_gone() -> None:
    held = on_disk(bound("h100", 2, "n1", name="held", set_id="vm/a"), "n1")
    snap = Snapshot.build(nodes=[host("n1"), host("n2")], classes=[passthrough()], claims=[held])
    snap.remove_node("n1")
    assert [(a.step, a.node) for a in plan(snap, NOW).changes] == [(Step.MOVE, "n2")]


def test_lost_capacity_moves_the_other_sets_first_and_never_the_one_on_its_disk() -> None:
    kept = on_disk(bound("h100", 2, "n1", name="kept", bound_at=5.0), "n1")
    other = bound("h100", 2, "n1", name="other", bound_at=1.0)
    snap = Snapshot.build(
        nodes=[host("n1", 4, allocatable=2), host("n2")],
        classes=[passthrough()],
        claims=[kept, other],
    )
    result = plan(snap, NOW)
    assert [([k.name for k in a.claims], a.step, a.node) for a in result.changes] == [
        (["other"], Step.MOVE, "n2")
    ]


def test_a_set_whose_disk_is_elsewhere_moves_as_any_other() -> None:
    held = on_disk(bound("h100", 2, "n1", name="held"), "n2")
    snap = Snapshot.build(
        nodes=[host("n1", unschedulable=True), host("n2")],
        classes=[passthrough()],
        claims=[held],
    )
    assert [(a.step, a.node) for a in plan(snap, NOW).changes] == [(Step.MOVE, "n2")]


def test_packing_never_moves_a_set_off_its_local_disk() -> None:
    # 2 free units on each node; the order of 4 fits n1 only if the 2-unit hold on its disk
    # moves: it may not, so the order waits as fragmented rather than take the disk's node.
    kept = on_disk(bound("h100", 2, "n1", name="kept"), "n1")
    plain = bound("h100", 2, "n2", name="plain")
    order = claim("h100", 4, name="order")
    snap = Snapshot.build(
        nodes=[host("n1", 4), host("n2", 4)],
        classes=[passthrough()],
        claims=[kept, plain, order],
    )
    assert not may_move(kept, snap.node("n1"), ())
    assert may_move(plain, snap.node("n2"), ())
    assert snap.pinned("n1", H100) == 2
    refusal = set_placement.check_order(snap, order, NOW)
    assert isinstance(refusal, Refusal)
    room = make_room(snap, order, NOW, refusal)
    assert room is not None and not isinstance(room, Refusal)
    assert room.node == "n2" and [m.claims[0].name for m in room.moves] == ["plain"]
    result = plan(snap, NOW)
    moved = [a for a in result.changes if a.step is Step.MOVE]
    assert [k.name for a in moved for k in a.claims] == ["plain"]
    bind = [a for a in result.changes if a.step is Step.BIND]
    assert [(a.claims[0].name, a.node) for a in bind] == [("order", "n2")]


def test_a_disk_node_relabelled_away_from_the_volume_frees_the_set() -> None:
    kept = on_disk(bound("h100", 2, "n1", name="kept"), "n1")
    snap = Snapshot.build(nodes=[host("n1"), host("n2")], classes=[passthrough()], claims=[kept])
    assert snap.pinned("n1", H100) == 2
    snap.upsert_node(replace(host("n1"), labels={HOSTNAME: "elsewhere"}))
    assert snap.pinned("n1", H100) == 0
    rebuilt = Snapshot.build(
        nodes=list(snap.nodes()), classes=list(snap.classes()), claims=list(snap.claims())
    )
    assert rebuilt.pinned("n1", H100) == 0


def test_a_start_of_a_set_on_its_disk_still_goes_where_it_is_held() -> None:
    kept = on_disk(bound("h100", 2, "n1", name="kept", set_id="vm/a"), "n1")
    snap = Snapshot.build(nodes=[host("n1"), host("n2")], classes=[passthrough()], claims=[kept])
    assert set_placement.place_for_start(snap, [kept], NOW, {"n1"}) == Placement("n1")
