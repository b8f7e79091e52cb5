"""plan: the binder's pass over Pending, Bound, Attached and Lost claims."""

from __future__ import annotations

from model_builders import NOW, bound, claim, commit, node, passthrough, tenant
from model_digest import digest

from cozystack_gpu.keys import LABEL_NODE_LAYOUT_STATE, OnCordon, Phase, quota_key
from cozystack_gpu.model import (
    ClaimInfo,
    Plan,
    Reason,
    Snapshot,
    Step,
    plan,
)


def steps(result: Plan) -> list[tuple[Step, list[str], str | None]]:
    return [(a.step, [k.name for k in a.claims], a.node) for a in result.changes]


def phase_and_node(result: Plan, c: ClaimInfo) -> tuple[Phase, str | None]:
    updated = result.updates[c.key]
    return (updated.phase, updated.node)


def test_plan_binds_pending_orders_in_arrival_order() -> None:
    late = claim("h100", 1, name="late", created=20.0)
    early = claim("h100", 1, name="early", created=10.0)
    snap = Snapshot.build(nodes=[node("n1", 1)], classes=[passthrough()], claims=[late, early])
    result = plan(snap, NOW)
    assert steps(result) == [(Step.BIND, ["early"], "n1")]
    waiting = [a for a in result.actions if a.step is Step.WAIT]
    assert [a.claims[0].name for a in waiting] == ["late"]
    assert waiting[0].refusal is not None
    assert waiting[0].refusal.reason is Reason.INSUFFICIENT_CAPACITY


def test_plan_has_no_head_of_line_blocking() -> None:
    big = claim("h100", 8, name="big", created=1.0)
    smalls = [claim("h100", 1, name=f"small{i}", created=2.0 + i) for i in range(3)]
    snap = Snapshot.build(
        nodes=[node("n1", 2), node("n2", 2)],
        classes=[passthrough(max_count=8)],
        claims=[big, *smalls],
    )
    result = plan(snap, NOW)
    assert [s[1][0] for s in steps(result)] == ["small0", "small1", "small2"]


def test_a_backlog_that_does_not_change_is_not_walked_again_by_each_pass() -> None:
    # Behind 2,000 orders that fit no node, each pass reports them as one Wait. Their keys
    # are the snapshot's, kept while the queue does not change: a pass costs what the
    # shapes cost, not what the backlog holds (rebuilding them every pass, several hundred
    # passes a second, held the orders that fit behind the backlog).
    backlog = [claim("h100", 2, name=f"big{i:04d}", created=1.0 + i) for i in range(2000)]
    snap = Snapshot.build(
        nodes=[node("n1", 1), node("n2", 1)], classes=[passthrough(max_count=2)], claims=backlog
    )
    [first] = [a for a in plan(snap, NOW).actions if a.step is Step.WAIT]
    snap.upsert_claim(claim("h100", 1, name="fits", created=5000.0))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.BIND, ["fits"], "n1")]
    [again] = [a for a in result.actions if a.step is Step.WAIT]
    assert again.claims == tuple(c.key for c in backlog)
    assert again.claims is first.claims, "the backlog's keys were built again"


def test_plan_rebinds_lost_claims_before_new_orders() -> None:
    order = claim("h100", 1, name="new", created=1.0)
    lost = claim("h100", 1, name="lost", created=5.0, phase=Phase.LOST)
    snap = Snapshot.build(nodes=[node("n1", 1)], classes=[passthrough()], claims=[order, lost])
    result = plan(snap, NOW)
    assert steps(result) == [(Step.REBIND, ["lost"], "n1")]
    assert result.updates[lost.key].phase is Phase.BOUND


def test_plan_rebinds_lost_claims_without_blocking_smaller_ones_behind_a_large_one() -> None:
    big = claim("h100", 4, name="big", created=1.0, phase=Phase.LOST)
    small = claim("h100", 1, name="small", created=2.0, phase=Phase.LOST)
    snap = Snapshot.build(
        nodes=[node("n1", 2)], classes=[passthrough(max_count=4)], claims=[big, small]
    )
    assert steps(plan(snap, NOW)) == [(Step.REBIND, ["small"], "n1")]


def test_unattached_set_moves_when_its_node_is_gone() -> None:
    held = bound("h100", 2, "n1", name="held")
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[passthrough()], claims=[held])
    snap.remove_node("n1")
    result = plan(snap, NOW)
    assert steps(result) == [(Step.MOVE, ["held"], "n2")]
    assert result.changes[0].why == "node n1 is gone"


def test_unattached_set_moves_when_its_node_no_longer_serves_the_class() -> None:
    cls = passthrough(selector={"pool": "gpu"})
    held = bound("h100", 1, "n1", name="held")
    nodes = [node("n1", labels={"pool": "gpu"}), node("n2", labels={"pool": "gpu"})]
    snap = Snapshot.build(nodes=nodes, classes=[cls], claims=[held])
    snap.upsert_node(node("n1", labels={"pool": "cpu"}))
    assert steps(plan(snap, NOW)) == [(Step.MOVE, ["held"], "n2")]


def test_unattached_set_moves_off_a_node_whose_layout_is_changing() -> None:
    held = bound("h100", 1, "n1", name="held", created=1.0)
    cls = passthrough(on_cordon=OnCordon.STAY)
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[cls], claims=[held])
    snap.upsert_node(node("n1", labels={LABEL_NODE_LAYOUT_STATE: "pending"}, unschedulable=True))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.MOVE, ["held"], "n2")]
    assert result.changes[0].why == "node n1 has a pending layout change"


def test_unattached_set_goes_lost_when_nowhere_has_room() -> None:
    held = bound("h100", 4, "n1", name="held")
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 2)], classes=[passthrough()], claims=[held]
    )
    snap.upsert_node(node("n1", 4, ready=False))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.LOSE, ["held"], None)]
    assert result.changes[0].refusal is not None
    assert result.changes[0].refusal.message == (
        "no node serving class h100 (apart from 1 node its claims skip) has 4 free units; "
        "the largest has 2"
    )
    assert phase_and_node(result, held) == (Phase.LOST, None)


def test_node_losing_capacity_moves_the_most_recently_bound_set_first() -> None:
    old = bound("h100", 2, "n1", name="old", bound_at=1.0)
    new = bound("h100", 2, "n1", name="new", bound_at=2.0)
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 4)], classes=[passthrough()], claims=[old, new]
    )
    snap.upsert_node(node("n1", 4, allocatable=3))  # kubelet lost a device
    result = plan(snap, NOW)
    assert steps(result) == [(Step.MOVE, ["new"], "n2")]
    assert "lost capacity" in result.changes[0].why


def test_attached_claims_never_move() -> None:
    running = claim(
        "h100", 4, name="running", phase=Phase.ATTACHED, node="n1", attached_to="vm", vmi_live=True
    )
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 4)], classes=[passthrough()], claims=[running]
    )
    snap.upsert_node(node("n1", 4, allocatable=2))
    snap.upsert_node(node("n1", 4, allocatable=2, unschedulable=True))
    assert plan(snap, NOW).changes == ()


def test_cordon_with_on_cordon_move_moves_the_set_when_another_node_has_room() -> None:
    held = bound("h100", 2, "n1", name="held")
    snap = Snapshot.build(nodes=[node("n1"), node("n2", 2)], classes=[passthrough()], claims=[held])
    snap.upsert_node(node("n1", unschedulable=True))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.MOVE, ["held"], "n2")]
    assert result.changes[0].why == "node n1 is cordoned"


def test_cordon_with_on_cordon_move_keeps_the_set_when_no_other_node_has_room() -> None:
    held = bound("h100", 2, "n1", name="held")
    snap = Snapshot.build(nodes=[node("n1"), node("n2", 1)], classes=[passthrough()], claims=[held])
    snap.upsert_node(node("n1", unschedulable=True))
    assert plan(snap, NOW).changes == ()


def test_cordon_with_on_cordon_stay_keeps_the_set() -> None:
    held = bound("h100", 2, "n1", name="held")
    cls = passthrough(on_cordon=OnCordon.STAY)
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[cls], claims=[held])
    snap.upsert_node(node("n1", unschedulable=True))
    assert plan(snap, NOW).changes == ()


def test_stay_pin_holds_through_not_ready() -> None:
    held = bound("h100", 2, "n1", name="held")
    cls = passthrough(on_cordon=OnCordon.STAY)
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[cls], claims=[held])
    snap.upsert_node(node("n1", unschedulable=True, ready=False))
    assert plan(snap, NOW).changes == ()
    # Without the cordon there is no pin, and NotReady moves the set.
    snap.upsert_node(node("n1", ready=False))
    assert steps(plan(snap, NOW)) == [(Step.MOVE, ["held"], "n2")]


def test_stay_pin_gives_way_once_the_node_has_lost_capacity() -> None:
    held = bound("h100", 2, "n1", name="held")
    cls = passthrough(on_cordon=OnCordon.STAY)
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[cls], claims=[held])
    snap.upsert_node(node("n1", unschedulable=True, ready=False, allocatable=1))
    assert steps(plan(snap, NOW)) == [(Step.MOVE, ["held"], "n2")]


def test_not_ready_node_makes_attached_claims_lost_and_they_keep_its_capacity() -> None:
    running = claim(
        "h100", 2, name="running", phase=Phase.ATTACHED, node="n1", attached_to="vm", vmi_live=True
    )
    snap = Snapshot.build(
        nodes=[node("n1", 2), node("n2", 2)], classes=[passthrough()], claims=[running]
    )
    snap.upsert_node(node("n1", 2, ready=False))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.LOSE, ["running"], None)]
    assert phase_and_node(result, running) == (Phase.LOST, "n1")
    wait = [a for a in result.actions if a.step is Step.WAIT]
    assert wait and wait[0].refusal is not None
    assert wait[0].refusal.reason is Reason.VMI_STILL_RUNNING
    commit(snap, result)
    assert snap.used("n1", running_res()) == 2  # the VMI may still run there


def running_res() -> str:
    return passthrough().resource_name


def test_lost_attached_claim_returns_to_attached_when_its_node_comes_back() -> None:
    lost = claim(
        "h100", 2, name="lost", phase=Phase.LOST, node="n1", attached_to="vm", vmi_live=True
    )
    snap = Snapshot.build(
        nodes=[node("n1", 2, ready=False)], classes=[passthrough()], claims=[lost]
    )
    assert plan(snap, NOW).changes == ()
    snap.upsert_node(node("n1", 2))
    result = plan(snap, NOW)
    assert steps(result) == [(Step.REATTACH, ["lost"], "n1")]
    assert phase_and_node(result, lost) == (Phase.ATTACHED, "n1")


def test_lost_claim_rebinds_once_its_vmi_is_final_or_gone() -> None:
    lost = claim(
        "h100", 2, name="lost", phase=Phase.LOST, node="n1", attached_to="vm", vmi_live=True
    )
    nodes = [node("n1", 2, ready=False), node("n2", 2)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[lost])
    assert plan(snap, NOW).changes == ()
    gone = ClaimInfo(**{**lost.__dict__, "vmi_live": False})
    snap.upsert_claim(gone)
    result = plan(snap, NOW)
    assert steps(result) == [(Step.REBIND, ["lost"], "n2")]
    assert result.updates[lost.key].attached_to is None


def test_claims_of_one_vm_move_together() -> None:
    a = bound("h100", 2, "n1", name="a", set_id="vm")
    b = bound("h100", 2, "n1", name="b", set_id="vm")
    nodes = [node("n1", 4), node("n2", 3), node("n3", 4)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[a, b])
    snap.remove_node("n1")
    assert steps(plan(snap, NOW)) == [(Step.MOVE, ["a", "b"], "n3")]


def test_plan_leaves_pending_template_claims_to_place_set() -> None:
    templ = claim("h100", 1, name="templ", template=True, set_id="vm")
    snap = Snapshot.build(nodes=[node("n1")], classes=[passthrough()], claims=[templ])
    assert plan(snap, NOW).actions == ()


def test_plan_binds_within_budget_and_leaves_the_rest_waiting() -> None:
    orders = [claim("h100", 1, name=f"o{i}", created=float(i)) for i in range(3)]
    snap = Snapshot.build(
        nodes=[node("n1")],
        classes=[passthrough()],
        claims=orders,
        namespaces=[tenant("tenant-a", quota={quota_key("h100"): 2})],
    )
    result = plan(snap, NOW)
    assert [s[1][0] for s in steps(result)] == ["o0", "o1"]
    refusal = result.actions[-1].refusal
    assert refusal is not None and refusal.reason is Reason.BUDGET_EXCEEDED


def test_plan_leaves_the_snapshot_unchanged_and_commit_applies_it() -> None:
    orders = [claim("h100", 1) for _i in range(3)]
    snap = Snapshot.build(nodes=[node("n1", 2)], classes=[passthrough()], claims=orders)
    before = digest(snap)
    result = plan(snap, NOW)
    assert digest(snap) == before
    commit(snap, result)
    assert snap.class_status("h100").free == 0
    assert plan(snap, NOW).changes == ()


def test_plan_is_deterministic_for_the_same_input() -> None:
    def build() -> Snapshot:
        orders = [claim("h100", c, name=f"o{i}", created=1.0) for i, c in enumerate((1, 2, 4, 1))]
        return Snapshot.build(
            nodes=[node(f"n{i}", 4) for i in range(3)], classes=[passthrough()], claims=orders
        )

    assert plan(build(), NOW) == plan(build(), NOW)


def test_a_pass_that_bound_its_limit_leaves_the_younger_orders_to_the_next() -> None:
    """``max_binds`` ends the binds of a pass, oldest first; the passes after it bind the
    rest where one unlimited pass would have put them, and a waiting order met before the
    limit is still told why it waits."""
    big = claim("h100", 8, name="big", created=0.0)
    orders = [big, *(claim("h100", 1, name=f"o{i:02}", created=1.0 + i) for i in range(10))]

    def snapshot() -> Snapshot:
        nodes = [node(f"n{i}", 4) for i in range(3)]
        return Snapshot.build(nodes=nodes, classes=[passthrough(max_count=8)], claims=orders)

    unlimited = plan(snapshot(), NOW)
    snap = snapshot()
    first = plan(snap, NOW, max_binds=4)
    assert [a.claims[0].name for a in first.changes] == ["o00", "o01", "o02", "o03"]
    assert [a.claims[0].name for a in first.actions if a.step is Step.WAIT] == ["big"]
    assert first.unjudged == 6
    placed = dict(first.updates)
    commit(snap, first)
    passes = 1
    while True:
        more = plan(snap, NOW, max_binds=4)
        commit(snap, more)
        placed.update(more.updates)
        passes += 1
        if not more.unjudged:
            break
    assert passes == 3
    assert {k: c.node for k, c in placed.items()} == {
        k: c.node for k, c in unlimited.updates.items()
    }
    assert plan(snap, NOW).changes == ()
