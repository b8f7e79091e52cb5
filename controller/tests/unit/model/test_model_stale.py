"""A node whose agent report is stale: nothing new is placed there, and its holds stay
(only the Node gone, NotReady or lost capacity as kubelet reports it takes them away)."""

from __future__ import annotations

from dataclasses import replace

from model_builders import NOW, bound, claim, node, passthrough

from cozystack_gpu.keys import OnCordon, Phase
from cozystack_gpu.model import Placement, Reason, Refusal, Snapshot, Step, plan, set_placement


def stale(name: str, gpus: int = 8, **kw: object) -> object:
    return replace(node(name, gpus, **kw), inventory_stale=True)  # type: ignore[arg-type]


def test_stale_report_keeps_unattached_holds_in_place() -> None:
    for on_cordon in (OnCordon.STAY, OnCordon.MOVE):
        held = bound("h100", 2, "n1", name="held", set_id="vm/a")
        snap = Snapshot.build(
            nodes=[stale("n1"), node("n2")],
            classes=[passthrough(on_cordon=on_cordon)],
            claims=[held],
        )
        assert plan(snap, NOW).changes == ()
        assert snap.unsettled_nodes() == frozenset()


def test_stale_report_keeps_lost_claims_from_rebinding_there() -> None:
    lost = claim("h100", 1, name="lost", phase=Phase.LOST)
    snap = Snapshot.build(nodes=[stale("n1")], classes=[passthrough()], claims=[lost])
    result = plan(snap, NOW)
    assert result.changes == ()


def test_stale_report_takes_no_new_order_and_no_move() -> None:
    order = claim("h100", 1, name="order")
    leaving = bound("h100", 1, "n2", name="leaving")
    snap = Snapshot.build(
        nodes=[stale("n1"), node("n2", unschedulable=True)],
        classes=[passthrough()],
        claims=[order, leaving],
    )
    result = plan(snap, NOW)
    assert result.changes == ()
    decision = set_placement.check_order(snap, order, NOW)
    assert isinstance(decision, Refusal) and decision.reason is Reason.NO_NODE_SERVES
    assert snap.class_status("h100").free == 0


def test_stale_report_gives_way_to_lost_capacity_as_kubelet_reports_it() -> None:
    held = bound("h100", 2, "n1", name="held")
    snap = Snapshot.build(
        nodes=[stale("n1", allocatable=1), node("n2")], classes=[passthrough()], claims=[held]
    )
    result = plan(snap, NOW)
    assert [(a.step, a.node) for a in result.changes] == [(Step.MOVE, "n2")]
    assert "lost capacity" in result.changes[0].why


def test_stale_report_gives_way_to_not_ready_and_to_the_node_gone() -> None:
    held = bound("h100", 2, "n1", name="held")
    snap = Snapshot.build(
        nodes=[stale("n1", ready=False), node("n2")], classes=[passthrough()], claims=[held]
    )
    assert [(a.step, a.node) for a in plan(snap, NOW).changes] == [(Step.MOVE, "n2")]
    snap.remove_node("n1")
    assert [(a.step, a.node) for a in plan(snap, NOW).changes] == [(Step.MOVE, "n2")]


def test_start_of_a_set_held_whole_on_a_stale_node_pins_there() -> None:
    members = [
        bound("h100", 1, "n1", name="a", set_id="vm/x"),
        bound("h100", 2, "n1", name="b", set_id="vm/x"),
    ]
    snap = Snapshot.build(nodes=[stale("n1"), node("n2")], classes=[passthrough()], claims=members)
    assert set_placement.place_for_start(snap, members, NOW) == Placement("n1")


def test_start_on_a_stale_node_adds_no_new_units_there() -> None:
    held = bound("h100", 1, "n1", name="a", set_id="vm/x")
    template = claim("h100", 1, name="t", set_id="vm/x", template=True)
    snap = Snapshot.build(
        nodes=[stale("n1"), node("n2")], classes=[passthrough()], claims=[held, template]
    )
    assert set_placement.place_for_start(snap, [held, template], NOW) == Placement("n2")


def test_packing_makes_no_room_on_a_stale_node_and_moves_nothing_onto_it() -> None:
    # n1 is stale with 1 free unit; n2 and n3 have 1 free unit each. An order of 2 fits
    # only by packing: n1 takes nothing new, so neither the order nor a moved hold goes there.
    holds = [
        bound("h100", 1, "n1", name="on-stale"),
        bound("h100", 1, "n2", name="on-n2"),
        bound("h100", 1, "n3", name="on-n3"),
    ]
    order = claim("h100", 2, name="order")
    snap = Snapshot.build(
        nodes=[stale("n1", 2), node("n2", 2), node("n3", 2)],
        classes=[passthrough()],
        claims=[*holds, order],
    )
    result = plan(snap, NOW)
    placed = [(a.step, a.node) for a in result.changes]
    assert placed and all(n != "n1" for _step, n in placed), placed
    assert (Step.BIND, "n2") in placed or (Step.BIND, "n3") in placed
    assert all(a.from_node != "n1" for a in result.changes)
