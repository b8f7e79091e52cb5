"""Capacity of a node for a class, whether a node serves a class, and class status."""

from __future__ import annotations

from model_builders import H100, L40S, NOW, bound, claim, node, passthrough, record_bind

from cozystack_gpu.keys import LABEL_NODE_LAYOUT_STATE, Phase
from cozystack_gpu.model import (
    ClassStatus,
    Device,
    NodeInfo,
    Placement,
    Reason,
    Refusal,
    Snapshot,
    Taint,
    Toleration,
    set_placement,
)


def test_capacity_sums_device_allocatable_over_every_function_of_the_resource_name() -> None:
    # An mdev parent serves several units from one function; two functions of the name add up.
    info = NodeInfo(
        "n1",
        allocatable={L40S: 12, H100: 1},
        devices=(Device(L40S, 4), Device(L40S, 4), Device(H100, 1), Device(L40S, 2)),
    )
    assert info.capacity() == {L40S: 10, H100: 1}


def test_capacity_is_capped_at_the_node_allocatable() -> None:
    # kubelet lost a device the agent still lists: the Node's allocatable wins.
    snap = Snapshot.build(nodes=[node("n1", 4, allocatable=3)], classes=[passthrough()])
    assert snap.capacity("n1", H100) == 3
    assert snap.class_status("h100") == ClassStatus(free=3, max_free_per_node=3)


def test_resource_missing_from_node_allocatable_has_no_capacity() -> None:
    info = NodeInfo("n1", allocatable={}, devices=(Device(H100, 1),))
    assert info.capacity() == {H100: 0}


def test_bound_and_attached_claims_take_capacity_pending_ones_do_not() -> None:
    claims = [
        bound("h100", 2, "n1"),
        claim("h100", 1, phase=Phase.ATTACHED, node="n1", attached_to="vm", vmi_live=True),
        claim("h100", 4),  # Pending: judged when it binds, holds nothing yet
    ]
    snap = Snapshot.build(nodes=[node("n1", 8)], classes=[passthrough()], claims=claims)
    assert snap.free("n1", H100) == 5


def test_lost_claim_takes_capacity_while_its_vmi_still_runs_there() -> None:
    live = claim("h100", 2, phase=Phase.LOST, node="n1", attached_to="vm", vmi_live=True)
    gone = claim("h100", 3, phase=Phase.LOST, node="n1", attached_to="vm2", vmi_live=False)
    snap = Snapshot.build(nodes=[node("n1", 8)], classes=[passthrough()], claims=[live, gone])
    assert snap.free("n1", H100) == 6


def test_raw_name_pods_take_capacity() -> None:
    snap = Snapshot.build(nodes=[node("n1", 4, raw_used=3)], classes=[passthrough()])
    assert snap.class_status("h100").free == 1
    refusal = set_placement.check_order(snap, claim("h100", 2), NOW)
    assert isinstance(refusal, Refusal) and refusal.reason is Reason.INSUFFICIENT_CAPACITY


def test_node_with_a_pending_layout_change_is_left_out() -> None:
    changing = node("n1", 8, labels={LABEL_NODE_LAYOUT_STATE: "pending"})
    applied = node("n2", 2, labels={LABEL_NODE_LAYOUT_STATE: "applied"})
    snap = Snapshot.build(nodes=[changing, applied], classes=[passthrough()])
    assert not snap.serves("n1", "h100")
    assert snap.class_status("h100") == ClassStatus(free=2, max_free_per_node=2)


def test_node_serves_a_class_only_when_it_matches_the_node_selector() -> None:
    cls = passthrough(selector={"gpu.cozystack.io/layout": "pt"})
    snap = Snapshot.build(
        nodes=[node("n1", labels={"gpu.cozystack.io/layout": "pt"}), node("n2")], classes=[cls]
    )
    assert snap.serves("n1", "h100")
    assert not snap.serves("n2", "h100")


def test_not_ready_node_serves_no_class() -> None:
    snap = Snapshot.build(nodes=[node("n1", ready=False)], classes=[passthrough()])
    assert not snap.serves("n1", "h100")
    assert set_placement.check_order(snap, claim(), NOW) == Refusal(
        Reason.NO_NODE_SERVES, "no node serves class h100: of 1 node, 1 is NotReady"
    )


def test_cordoned_node_serves_no_class() -> None:
    snap = Snapshot.build(nodes=[node("n1", unschedulable=True)], classes=[passthrough()])
    assert not snap.serves("n1", "h100")


def test_untolerated_noschedule_and_noexecute_taints_exclude_the_node() -> None:
    nodes = [
        node("n1", taints=(Taint("dedicated", "NoSchedule", "gpu"),)),
        node("n2", taints=(Taint("maintenance", "NoExecute"),)),
    ]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()])
    assert not snap.serves("n1", "h100")
    assert not snap.serves("n2", "h100")


def test_prefer_no_schedule_taint_is_ignored() -> None:
    snap = Snapshot.build(
        nodes=[node("n1", taints=(Taint("dedicated", "PreferNoSchedule", "gpu"),))],
        classes=[passthrough()],
    )
    assert snap.serves("n1", "h100")


def test_node_state_taints_are_judged_by_ready_and_cordon_not_by_tolerations() -> None:
    # kubectl cordon also adds node.kubernetes.io/unschedulable; once uncordoned and Ready
    # a leftover state taint must not make the class look untolerated.
    info = node("n1", taints=(Taint("node.kubernetes.io/unschedulable", "NoSchedule"),))
    snap = Snapshot.build(nodes=[info], classes=[passthrough()])
    assert snap.serves("n1", "h100")


def test_toleration_exists_matches_any_value_and_equal_needs_the_same_value() -> None:
    taint = Taint("dedicated", "NoSchedule", "gpu")
    assert Toleration("dedicated", "Exists").tolerates(taint)
    assert Toleration("", "Exists").tolerates(taint)  # empty key: every taint
    assert Toleration("dedicated", "Equal", "gpu").tolerates(taint)
    assert not Toleration("dedicated", "Equal", "cpu").tolerates(taint)
    assert not Toleration("other", "Exists").tolerates(taint)
    assert Toleration("dedicated", "Exists", effect="NoSchedule").tolerates(taint)
    assert not Toleration("dedicated", "Exists", effect="NoExecute").tolerates(taint)
    tolerant = passthrough(tolerations=(Toleration("dedicated", "Equal", "gpu"),))
    snap = Snapshot.build(nodes=[node("n1", taints=(taint,))], classes=[tolerant])
    assert snap.serves("n1", "h100")


def test_classes_sharing_a_resource_name_are_served_only_on_disjoint_nodes() -> None:
    a = passthrough("h100-a", selector={"pool": "a"})
    b = passthrough("h100-b", selector={"pool": "b"})
    overlap = passthrough("h100-any")
    nodes = [node("n1", labels={"pool": "a"}), node("n2", labels={"pool": "b"})]
    snap = Snapshot.build(nodes=nodes, classes=[a, b])
    assert snap.serves("n1", "h100-a") and not snap.serves("n1", "h100-b")
    assert snap.serves("n2", "h100-b")
    # A third class over the same name selects every node: nobody can tell whose units
    # those are, so no class sharing the name is served there.
    snap.upsert_class(overlap)
    assert not any(
        snap.serves(n, c) for n in ("n1", "n2") for c in ("h100-a", "h100-b", "h100-any")
    )
    snap.remove_class("h100-any")
    assert snap.serves("n1", "h100-a") and snap.serves("n2", "h100-b")


def test_class_status_counts_free_units_over_serving_nodes_only() -> None:
    nodes = [
        node("n1", 8),
        node("n2", 4),
        node("n3", 8, ready=False),
        node("n4", 8, unschedulable=True),
    ]
    claims = [bound("h100", 3, "n1"), bound("h100", 1, "n2")]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=claims)
    assert snap.class_status("h100") == ClassStatus(free=8, max_free_per_node=5)
    assert snap.class_status("missing") == ClassStatus(free=0, max_free_per_node=0)


def test_class_status_follows_each_bind() -> None:
    snap = Snapshot.build(nodes=[node("n1", 2), node("n2", 1)], classes=[passthrough()])
    order = claim("h100", 2)
    decision = set_placement.check_order(snap, order, NOW)
    assert decision == Placement("n1")
    record_bind(snap, order, decision.node, NOW)
    assert snap.class_status("h100") == ClassStatus(free=1, max_free_per_node=1)
