"""Live migration keeps the hold (SPEC §12): a migration's target holds the set's units on
its node beside the source's while it runs, budgets count the set once, nothing moves the
set meanwhile, and ``place_migration`` puts the target where a start would put the set,
on another node. Examples; the random-sequence properties are in
``test_model_migration_properties``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from model_builders import H100, L40S, NOW, bound, claim, commit, node, passthrough, tenant

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, Phase, quota_key
from cozystack_gpu.model import (
    ClaimInfo,
    MigrationTarget,
    Placement,
    Reason,
    Refusal,
    RejectedNode,
    Snapshot,
    Step,
    Taint,
    place_migration,
    plan,
)
from cozystack_gpu.model.packing import may_move


def running(
    cls: str, count: int, node_name: str, name: str, set_id: str = "vm/a", **kw: object
) -> ClaimInfo:
    """An Attached claim of a running VMI of the VM ``set_id``."""
    return claim(
        cls,
        count,
        name=name,
        phase=Phase.ATTACHED,
        node=node_name,
        attached_to=set_id.removeprefix("vm/"),
        vmi_live=True,
        set_id=set_id,
        **kw,  # type: ignore[arg-type]
    )


def migrating(c: ClaimInfo, target: str, uid: str = "mig-1") -> ClaimInfo:
    return replace(c, migration=MigrationTarget(target, uid, NOW))


def refusal_of(decision: object) -> Refusal:
    assert isinstance(decision, Refusal), decision
    return decision


# --- the counters ------------------------------------------------------------------------


def test_a_migration_target_holds_the_units_on_its_node_until_the_migration_is_cleared() -> None:
    vm = running("h100", 2, "n1", "c1")
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 4)], classes=[passthrough()], claims=[vm]
    )
    snap.upsert_claim(migrating(vm, "n2"))
    assert (snap.used("n1", H100), snap.used("n2", H100)) == (2, 2)
    assert snap.free("n2", H100) == 2 and snap.class_status("h100").free == 4
    assert snap.pinned("n2", H100) == 2  # packing never takes the target's units
    assert snap.claims_on("n2") == frozenset()  # the claim is still bound to n1
    # Failed, cancelled or its target pod gone: the target's units are free again.
    snap.upsert_claim(vm)
    assert (snap.used("n1", H100), snap.used("n2", H100)) == (2, 0)


def test_a_migration_that_succeeds_frees_the_source_units() -> None:
    vm = migrating(running("h100", 3, "n1", "c1"), "n2")
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 4)], classes=[passthrough()], claims=[vm]
    )
    snap.upsert_claim(replace(vm, node="n2", migration=None))  # one write per claim
    assert (snap.used("n1", H100), snap.used("n2", H100)) == (0, 3)
    assert snap.free("n1", H100) == 4


def test_a_migrating_set_counts_once_against_the_tenant_budgets() -> None:
    tree = [tenant("tenant-root", quota={QUOTA_KEY_TOTAL: 4}), tenant("tenant-a", "tenant-root")]
    vm = running("h100", 4, "n1", "c1")
    snap = Snapshot.build(
        nodes=[node("n1"), node("n2")], classes=[passthrough()], claims=[vm], namespaces=tree
    )
    snap.upsert_claim(migrating(vm, "n2"))
    for tenant_name in ("tenant-a", "tenant-root"):
        assert snap.budget_used(tenant_name, quota_key("h100")) == 4
        assert snap.budget_used(tenant_name, QUOTA_KEY_TOTAL) == 4


def test_a_target_counts_only_while_its_claim_holds_a_node() -> None:
    # A Lost claim whose VMI is gone holds nothing, and neither does its stale target; one
    # whose VMI may still run holds both. A target on the claim's own node adds nothing.
    lost = replace(migrating(running("h100", 2, "n1", "c1"), "n2"), phase=Phase.LOST)
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[passthrough()], claims=[lost])
    assert snap.used("n2", H100) == 2
    snap.upsert_claim(replace(lost, vmi_live=False))
    assert (snap.used("n1", H100), snap.used("n2", H100)) == (0, 0)
    snap.upsert_claim(migrating(running("h100", 2, "n1", "c1"), "n1"))
    assert (snap.used("n1", H100), snap.used("n2", H100)) == (2, 0)


# --- placing the target ------------------------------------------------------------------


def test_the_target_goes_to_the_best_fit_other_node_serving_every_class_of_the_set() -> None:
    nodes = [
        node("n1", 4, extra={L40S: 2}),
        node("n2", 4),  # no L40S
        node("n3", 8, extra={L40S: 2}),
        node("n4", 4, extra={L40S: 2}),
    ]
    classes = [passthrough(), passthrough("l40s", L40S)]
    vm = [running("h100", 2, "n1", "a"), running("l40s", 1, "n1", "b")]
    snap = Snapshot.build(nodes=nodes, classes=classes, claims=vm)
    assert place_migration(snap, vm, NOW) == Placement("n4")


def test_the_target_skips_rejected_nodes_selectors_and_untolerated_taints() -> None:
    cls = passthrough(selector={"pool": "gpu"})
    nodes = [
        node("n1", labels={"pool": "gpu"}),
        node("n2", labels={"pool": "gpu"}, taints=(Taint("gpu", "NoSchedule"),)),
        node("n3", labels={"pool": "cpu"}),
        node("n4", labels={"pool": "gpu"}),
        node("n5", labels={"pool": "gpu"}, unschedulable=True),
        node("n6", labels={"pool": "gpu"}),
    ]
    vm = [running("h100", 2, "n1", "a", rejected=(RejectedNode("n4", NOW + 60),))]
    snap = Snapshot.build(nodes=nodes, classes=[cls], claims=vm)
    assert place_migration(snap, vm, NOW) == Placement("n6")
    assert place_migration(snap, vm, NOW + 61) == Placement("n4")  # the rejection expired
    assert isinstance(place_migration(snap, vm, NOW, nodes=("n2", "n3", "n5")), Refusal)


def test_the_target_is_judged_by_capacity_alone_as_a_move_is() -> None:
    # The set already counts against the budget, which it fills: the target adds nothing.
    tree = [tenant("tenant-a", quota={quota_key("h100"): 4})]
    vm = [running("h100", 4, "n1", "a")]
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 4)], classes=[passthrough()], claims=vm, namespaces=tree
    )
    assert place_migration(snap, vm, NOW) == Placement("n2")


def test_a_set_with_no_room_elsewhere_is_refused_in_words_that_name_the_missing_units() -> None:
    vm = [running("h100", 4, "n1", "a")]
    snap = Snapshot.build(
        nodes=[node("n1", 8), node("n2", 8)],
        classes=[passthrough()],
        claims=[*vm, bound("h100", 5, "n2", name="other")],
    )
    refusal = refusal_of(place_migration(snap, vm, NOW))
    assert refusal.reason is Reason.INSUFFICIENT_CAPACITY
    assert refusal.message == (
        "the live migration needs another node for the VM's GPUs: no node serving class h100 "
        "(apart from 1 node its claims skip) has 4 free units; the largest has 3"
    )
    alone = Snapshot.build(nodes=[node("n1", 8)], classes=[passthrough()], claims=vm)
    assert refusal_of(place_migration(alone, vm, NOW)).reason is Reason.NO_NODE_SERVES


def test_a_target_already_recorded_is_kept_while_it_still_takes_the_set() -> None:
    # The leader recorded the target and went before it pinned the pod: the next leader
    # places it again, and the units the target already holds are the set's own there.
    vm = [running("h100", 2, "n1", "a"), running("h100", 2, "n1", "b")]
    nodes = [node("n1", 4), node("n2", 4), node("n3", 8)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=vm)
    assert place_migration(snap, vm, NOW) == Placement("n2")
    recorded = [migrating(c, "n3") for c in vm]
    for c in recorded:
        snap.upsert_claim(c)
    assert place_migration(snap, recorded, NOW) == Placement("n3")
    # One member recorded: its units on n2 count as the set's, so n2 still takes the set.
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[migrating(vm[0], "n2")])
    snap.upsert_claim(vm[1])
    assert snap.free("n2", H100) == 2
    assert place_migration(snap, [migrating(vm[0], "n2"), vm[1]], NOW) == Placement("n2")


def test_only_a_set_held_whole_on_one_node_has_a_migration_target() -> None:
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[passthrough()])
    for claims in (
        [],
        [claim("h100", 1)],
        [running("h100", 1, "n1", "a"), running("h100", 1, "n2", "b")],
    ):
        with pytest.raises(ValueError, match="held whole on one node"):
            place_migration(snap, claims, NOW)


# --- nothing moves a migrating set -------------------------------------------------------


def test_packing_never_moves_a_migrating_set() -> None:
    # An unattached hold with a target recorded (its VM started and migrates before its
    # attachment is seen) gives way to no order, nor does the target's units.
    hold = migrating(bound("h100", 2, "n1", name="hold", set_id="vm/a"), "n3")
    assert not may_move(hold, node("n1"), ())
    nodes = [node("n1", 8), node("n2", 8), node("n3", 8)]
    others = [running("h100", 4, "n2", "x", set_id="vm/x"), bound("h100", 2, "n3", name="y")]
    big = claim("h100", 8, name="big")
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[hold, *others, big])
    result = plan(snap, NOW)
    assert all(hold.key not in a.claims for a in result.changes)
    assert all(a.from_node != "n3" for a in result.changes if a.step is Step.MOVE)
    (wait,) = [a for a in result.actions if a.step is Step.WAIT]
    assert wait.refusal is not None and wait.refusal.reason is Reason.CAPACITY_FRAGMENTED
    # Without the migration the hold moves and the order binds.
    snap.upsert_claim(replace(hold, migration=None))
    assert [a.step for a in plan(snap, NOW).changes][-1] is Step.BIND


def test_a_migrating_set_stays_on_a_cordoned_node_and_on_one_that_no_longer_serves_it() -> None:
    a = migrating(bound("h100", 2, "n1", name="a", set_id="vm/a"), "n3")
    b = migrating(bound("h100", 1, "n1", name="b", set_id="vm/a"), "n3")
    cls = passthrough(selector={"pool": "gpu"})
    gpu = {"pool": "gpu"}
    nodes = [node("n1", labels=gpu), node("n2", labels=gpu), node("n3", labels=gpu)]
    snap = Snapshot.build(nodes=nodes, classes=[cls], claims=[a, b])
    snap.upsert_node(node("n1", labels=gpu, unschedulable=True))
    assert plan(snap, NOW).changes == ()
    snap.upsert_node(node("n1", labels={"pool": "cpu"}))
    assert plan(snap, NOW).changes == ()
    snap.remove_node("n1")
    assert plan(snap, NOW).changes == ()
    # The migration ends without the set moving: now the set leaves the node that is gone.
    for c in (a, b):
        snap.upsert_claim(replace(c, migration=None))
    assert [(x.step, x.node) for x in plan(snap, NOW).changes] == [(Step.MOVE, "n2")]


def test_a_target_node_that_loses_capacity_moves_unattached_holds_not_the_target() -> None:
    vm = migrating(running("h100", 2, "n1", "vm"), "n2")
    held = bound("h100", 2, "n2", name="held")
    nodes = [node("n1", 4), node("n2", 4), node("n3", 4)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[vm, held])
    snap.upsert_node(node("n2", 4, allocatable=3))
    result = plan(snap, NOW)
    assert [(x.step, x.claims, x.node) for x in result.changes] == [(Step.MOVE, (held.key,), "n1")]
    commit(snap, result)
    assert snap.over_capacity("n2") == {} and plan(snap, NOW).changes == ()


def test_a_lost_claim_whose_vmi_is_gone_rebinds_without_its_migration() -> None:
    lost = replace(migrating(running("h100", 2, "n1", "c1"), "n2"), phase=Phase.LOST)
    snap = Snapshot.build(
        nodes=[node("n1", ready=False), node("n2"), node("n3", 2)],
        classes=[passthrough()],
        claims=[replace(lost, vmi_live=False)],
    )
    result = plan(snap, NOW)
    assert [(x.step, x.node) for x in result.changes] == [(Step.REBIND, "n3")]
    assert result.updates[lost.key].migration is None
    commit(snap, result)
    assert (snap.used("n2", H100), snap.used("n3", H100)) == (0, 2)
