"""check_order and place_set: refusals with a machine reason and a message naming what is
missing, budgets along the tenant chain, and best-fit placement."""

from __future__ import annotations

from model_builders import (
    H100,
    L40S,
    L40S_24C,
    NOW,
    bound,
    claim,
    node,
    passthrough,
    record_bind,
    tenant,
    vgpu,
)

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, OnCordon, Phase, quota_key
from cozystack_gpu.model import (
    ClaimKey,
    NodeInfo,
    Placement,
    Reason,
    Refusal,
    RejectedNode,
    Snapshot,
    set_placement,
)

TREE = [tenant("tenant-root"), tenant("tenant-a", "tenant-root")]


def reason(decision: object) -> Reason:
    assert isinstance(decision, Refusal), decision
    return decision.reason


def test_order_of_a_missing_class_is_refused() -> None:
    snap = Snapshot.build(nodes=[node("n1")])
    assert set_placement.check_order(snap, claim("a100"), NOW) == Refusal(
        Reason.CLASS_MISSING, "class a100 does not exist"
    )


def test_class_being_deleted_refuses_pending_orders_but_serves_held_claims() -> None:
    snap = Snapshot.build(nodes=[node("n1"), node("n2")], classes=[passthrough(deleting=True)])
    assert reason(set_placement.check_order(snap, claim(), NOW)) is Reason.CLASS_DELETING
    held = bound("h100", 1, "n1")
    assert set_placement.place_set(snap, [held], NOW, exclude=["n1"]) == Placement("n2")


def test_max_count_is_one_for_vgpu_and_the_largest_node_for_passthrough_when_unset() -> None:
    nodes = [node("n1", 4), node("n2", 2), node("v1", 8, L40S_24C)]
    snap = Snapshot.build(
        nodes=nodes,
        classes=[passthrough(), vgpu(), passthrough("l40s", L40S, max_count=1)],
        namespaces=[tenant("tenant-a", vgpu=True)],
    )
    assert snap.max_count("h100") == 4
    assert snap.max_count("l40s-24c") == 1
    assert snap.max_count("l40s") == 1
    assert set_placement.check_order(snap, claim("l40s-24c", 2), NOW) == Refusal(
        Reason.MAX_COUNT_EXCEEDED,
        "class l40s-24c allows at most 1 unit per VM; the set asks for 2",
    )
    assert (
        reason(set_placement.check_order(snap, claim("h100", 5), NOW)) is Reason.MAX_COUNT_EXCEEDED
    )
    assert set_placement.check_order(snap, claim("h100", 4), NOW) == Placement("n1")


def test_vgpu_class_needs_the_entitlement_label_on_the_namespace() -> None:
    nodes = [node("v1", 8, L40S_24C)]
    snap = Snapshot.build(nodes=nodes, classes=[vgpu()], namespaces=[tenant("tenant-a")])
    refusal = set_placement.check_order(snap, claim("l40s-24c"), NOW)
    assert reason(refusal) is Reason.VGPU_NOT_ENTITLED
    assert isinstance(refusal, Refusal) and "gpu.cozystack.io/vgpu" in refusal.message
    snap.upsert_namespace(tenant("tenant-a", vgpu=True))
    assert set_placement.check_order(snap, claim("l40s-24c"), NOW) == Placement("v1")


def test_budget_key_on_an_ancestor_limits_the_sum_over_its_subtree() -> None:
    namespaces = [
        tenant("tenant-root", quota={quota_key("h100"): 3}),
        tenant("tenant-a", "tenant-root"),
        tenant("tenant-b", "tenant-root"),
    ]
    claims = [bound("h100", 2, "n1", "tenant-a")]
    snap = Snapshot.build(
        nodes=[node("n1")], classes=[passthrough()], claims=claims, namespaces=namespaces
    )
    assert snap.budget_used("tenant-root", quota_key("h100")) == 2
    assert set_placement.check_order(snap, claim("h100", 1, "tenant-b"), NOW) == Placement("n1")
    assert set_placement.check_order(snap, claim("h100", 2, "tenant-b"), NOW) == Refusal(
        Reason.BUDGET_EXCEEDED,
        "budget gpu.cozystack.io/h100 of tenant-root (1 level above tenant-b) allows 3: "
        "2 in use, the order asks 2 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)",
    )


def test_child_key_only_adds_a_limit_it_never_lifts_the_parents() -> None:
    namespaces = [
        tenant("tenant-root", quota={quota_key("h100"): 2}),
        tenant("tenant-a", "tenant-root", quota={quota_key("h100"): 8}),
    ]
    snap = Snapshot.build(nodes=[node("n1")], classes=[passthrough()], namespaces=namespaces)
    assert reason(set_placement.check_order(snap, claim("h100", 3), NOW)) is Reason.BUDGET_EXCEEDED
    snap.upsert_namespace(tenant("tenant-a", "tenant-root", quota={quota_key("h100"): 1}))
    refusal = set_placement.check_order(snap, claim("h100", 2), NOW)
    assert isinstance(refusal, Refusal) and refusal.message.startswith(
        "budget gpu.cozystack.io/h100 of tenant-a (this namespace's own quota) allows 1: 0 in use"
    )


def test_budget_refusal_names_tenant_key_and_usage() -> None:
    namespaces = [tenant("tenant-a", quota={quota_key("l40s-24c"): 2}, vgpu=True)]
    claims = [bound("l40s-24c", 1, "v1"), bound("l40s-24c", 1, "v1")]
    snap = Snapshot.build(
        nodes=[node("v1", 8, L40S_24C)], classes=[vgpu()], claims=claims, namespaces=namespaces
    )
    refusal = set_placement.check_order(snap, claim("l40s-24c"), NOW)
    assert isinstance(refusal, Refusal)
    assert refusal.message.startswith(
        "budget gpu.cozystack.io/l40s-24c of tenant-a (this namespace's own quota) allows 2: "
        "2 in use, the order asks 1 more"
    )


def test_total_key_counts_every_class() -> None:
    namespaces = [tenant("tenant-a", quota={QUOTA_KEY_TOTAL: 3}, vgpu=True)]
    claims = [bound("h100", 2, "n1"), bound("l40s-24c", 1, "v1")]
    snap = Snapshot.build(
        nodes=[node("n1"), node("v1", 8, L40S_24C)],
        classes=[passthrough(), vgpu()],
        claims=claims,
        namespaces=namespaces,
    )
    assert snap.budget_used("tenant-a", QUOTA_KEY_TOTAL) == 3
    refusal = set_placement.check_order(snap, claim("h100"), NOW)
    assert isinstance(refusal, Refusal)
    assert refusal.message.startswith(
        "budget gpu.cozystack.io/total of tenant-a (this namespace's own quota) allows 3: 3 in use"
    )


def test_passthrough_class_without_a_key_anywhere_above_is_limited_by_capacity_only() -> None:
    namespaces = [
        tenant("tenant-root", quota={quota_key("other"): 0}),
        tenant("tenant-a", "tenant-root"),
    ]
    snap = Snapshot.build(nodes=[node("n1", 8)], classes=[passthrough()], namespaces=namespaces)
    assert set_placement.check_order(snap, claim("h100", 8), NOW) == Placement("n1")
    assert reason(set_placement.check_order(snap, claim("h100", 9, name="big"), NOW)) in (
        Reason.MAX_COUNT_EXCEEDED,
        Reason.INSUFFICIENT_CAPACITY,
    )


def test_vgpu_class_without_a_key_anywhere_above_is_limited_by_entitlement_and_capacity() -> None:
    namespaces = [
        tenant("tenant-root", vgpu=True),
        tenant("tenant-a", "tenant-root", vgpu=True),
        tenant("tenant-b", "tenant-root"),
    ]
    held = [bound("l40s-24c", 1, "v1") for _unit in range(7)]
    snap = Snapshot.build(
        nodes=[node("v1", 8, L40S_24C)], classes=[vgpu()], claims=held, namespaces=namespaces
    )
    assert set_placement.check_order(snap, claim("l40s-24c"), NOW) == Placement("v1")
    assert reason(set_placement.check_order(snap, claim("l40s-24c", ns="tenant-b"), NOW)) is (
        Reason.VGPU_NOT_ENTITLED
    )
    snap.upsert_claim(bound("l40s-24c", 1, "v1"))
    assert (
        reason(set_placement.check_order(snap, claim("l40s-24c"), NOW))
        is Reason.INSUFFICIENT_CAPACITY
    )


def test_lost_claims_keep_counting_so_rebind_never_fails_budget() -> None:
    namespaces = [tenant("tenant-a", quota={quota_key("h100"): 2})]
    lost = claim("h100", 2, phase=Phase.LOST)
    snap = Snapshot.build(
        nodes=[node("n1")], classes=[passthrough()], claims=[lost], namespaces=namespaces
    )
    assert snap.budget_used("tenant-a", quota_key("h100")) == 2
    # A new order cannot take the units the Lost claim is owed...
    assert reason(set_placement.check_order(snap, claim("h100", 1), NOW)) is Reason.BUDGET_EXCEEDED
    # ...and the Lost claim itself rebinds without a budget check, even after the hoster
    # lowered the budget below it.
    snap.upsert_namespace(tenant("tenant-a", quota={quota_key("h100"): 0}))
    assert set_placement.check_order(snap, lost, NOW) == Placement("n1")


def test_raw_key_blocks_a_class_until_its_tenant_also_has_the_class_key_or_total() -> None:
    raw = "requests." + H100
    snap = Snapshot.build(
        nodes=[node("n1")],
        classes=[passthrough()],
        namespaces=[tenant("tenant-root", quota={raw: 4}), tenant("tenant-a", "tenant-root")],
    )
    assert set_placement.check_order(snap, claim("h100"), NOW) == Refusal(
        Reason.RAW_KEY_UNCOVERED,
        f"tenant-root limits {H100} by quota key {raw} and has no gpu.cozystack.io/h100 "
        "or gpu.cozystack.io/total key for class h100",
    )
    snap.upsert_namespace(tenant("tenant-root", quota={raw: 4, QUOTA_KEY_TOTAL: 10}))
    assert set_placement.check_order(snap, claim("h100"), NOW) == Placement("n1")


def test_raw_key_caps_claims_together_with_raw_name_pods_of_the_subtree() -> None:
    raw = "requests." + H100
    namespaces = [
        tenant("tenant-root", quota={raw: 4, quota_key("h100"): 10}),
        tenant("tenant-a", "tenant-root", raw_used={H100: 2}),
    ]
    claims = [bound("h100", 1, "n1")]
    snap = Snapshot.build(
        nodes=[node("n1")], classes=[passthrough()], claims=claims, namespaces=namespaces
    )
    assert snap.budget_used("tenant-root", raw) == 3
    assert set_placement.check_order(snap, claim("h100", 1), NOW) == Placement("n1")
    assert set_placement.check_order(snap, claim("h100", 2), NOW) == Refusal(
        Reason.BUDGET_EXCEEDED,
        f"budget {raw} of tenant-root (1 level above tenant-a) allows 4: 3 in use, the order "
        "asks 2 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)",
    )


def test_capacity_refusal_names_the_class_the_need_and_the_largest_free() -> None:
    nodes = [node("n1", 2), node("n2", 1)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough(max_count=8)])
    assert set_placement.check_order(snap, claim("h100", 4), NOW) == Refusal(
        Reason.INSUFFICIENT_CAPACITY,
        "no node serving class h100 has 4 free units; the largest has 2",
    )


def test_best_fit_picks_the_node_with_the_fewest_free_units_that_suffice() -> None:
    nodes = [node("n1", 8), node("n2", 2), node("n3", 4)]
    claims = [bound("h100", 1, "n3")]  # n3: 3 free
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=claims)
    assert set_placement.check_order(snap, claim("h100", 1), NOW) == Placement("n2")
    assert set_placement.check_order(snap, claim("h100", 3), NOW) == Placement("n3")
    assert set_placement.check_order(snap, claim("h100", 4), NOW) == Placement("n1")


def test_best_fit_breaks_ties_by_node_name() -> None:
    nodes = [node("n3", 4), node("n1", 4), node("n2", 4)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()])
    assert set_placement.check_order(snap, claim("h100", 2), NOW) == Placement("n1")


def test_best_fit_keeps_whole_nodes_free_for_large_sets() -> None:
    # Fragmentation: eight 1-GPU orders on four 8-GPU nodes. Spreading (worst fit) would
    # leave no node with 8 free; best fit packs them onto one node and keeps three whole.
    snap = Snapshot.build(nodes=[node(f"n{i}", 8) for i in range(4)], classes=[passthrough()])
    for _i in range(8):
        order = claim("h100", 1)
        decision = set_placement.check_order(snap, order, NOW)
        assert decision == Placement("n0")
        record_bind(snap, order, decision.node, NOW)
    for _i in range(3):
        order = claim("h100", 8)
        decision = set_placement.check_order(snap, order, NOW)
        assert isinstance(decision, Placement)
        record_bind(snap, order, decision.node, NOW)
    assert snap.class_status("h100").free == 0


def test_set_goes_whole_onto_one_node_that_serves_every_class_of_the_set() -> None:
    nodes = [
        node("n1", 8, H100),
        node("n2", 2, L40S),
        node("n3", 2, H100, extra={L40S: 1}),
        node("n4", 4, H100, extra={L40S: 2}),
    ]
    classes = [passthrough(), passthrough("l40s", L40S)]
    snap = Snapshot.build(nodes=nodes, classes=classes)
    members = [claim("h100", 2, set_id="vm1"), claim("l40s", 2, set_id="vm1")]
    assert set_placement.place_set(snap, members, NOW) == Placement("n4")
    # n1 has the H100s but no L40S; n3 and n4 have an L40S but too few H100s.
    too_big = [claim("h100", 5, set_id="vm2"), claim("l40s", 1, set_id="vm2")]
    assert set_placement.place_set(snap, too_big, NOW) == Refusal(
        Reason.INSUFFICIENT_CAPACITY,
        "no node serving classes h100, l40s has room for the set (h100: 5, l40s: 1)",
    )


def test_set_takes_one_vgpu_class_only() -> None:
    classes = [vgpu("a-24c", "nvidia.com/A"), vgpu("b-12c", "nvidia.com/B")]
    snap = Snapshot.build(classes=classes, namespaces=[tenant("tenant-a", vgpu=True)])
    members = [claim("a-24c", set_id="vm"), claim("b-12c", set_id="vm")]
    assert set_placement.place_set(snap, members, NOW) == Refusal(
        Reason.VGPU_CLASSES_MIXED, "a VM takes one vGPU class; the set asks for a-24c, b-12c"
    )


def test_set_is_judged_by_adding_each_claim_as_bound_before_the_next() -> None:
    namespaces = [tenant("tenant-a", quota={quota_key("h100"): 3})]
    snap = Snapshot.build(nodes=[node("n1")], classes=[passthrough()], namespaces=namespaces)
    first, second = claim("h100", 2, set_id="vm"), claim("h100", 2, set_id="vm")
    assert set_placement.check_order(snap, first, NOW) == Placement("n1")
    assert set_placement.check_order(snap, second, NOW) == Placement("n1")
    assert set_placement.place_set(snap, [first, second], NOW) == Refusal(
        Reason.BUDGET_EXCEEDED,
        "budget gpu.cozystack.io/h100 of tenant-a (this namespace's own quota) allows 3: "
        "2 in use, the order asks 2 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)",
    )


def test_place_set_skips_unexpired_rejected_nodes() -> None:
    snap = Snapshot.build(nodes=[node("n1", 2), node("n2", 4)], classes=[passthrough()])
    rejected = claim("h100", 1, rejected=(RejectedNode("n1", NOW + 60),))
    assert set_placement.check_order(snap, rejected, NOW) == Placement("n2")
    assert set_placement.check_order(snap, rejected, NOW + 61) == Placement("n1")
    only = Snapshot.build(nodes=[node("n1", 2)], classes=[passthrough()])
    assert set_placement.check_order(only, rejected, NOW) == Refusal(
        Reason.NO_NODE_SERVES,
        "no node serves class h100 (apart from 1 node its claims skip): of 1 node, "
        "1 serves it but not this order",
    )


def test_place_set_stays_within_the_nodes_a_volume_allows() -> None:
    nodes = [node("n1", 1), node("n2", 4), node("n3", 8)]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()])
    assert set_placement.place_set(snap, [claim("h100", 1)], NOW, nodes={"n2", "n3"}) == Placement(
        "n2"
    )
    assert set_placement.place_set(snap, [claim("h100", 6)], NOW, nodes={"n1", "n2"}) == Refusal(
        Reason.INSUFFICIENT_CAPACITY,
        "no node serving class h100 among the nodes the VM may use has 6 free units; "
        "the largest has 4",
    )


def test_set_already_held_on_a_node_that_still_fits_stays_there() -> None:
    nodes = [node("n1", 2), node("n2", 8)]
    held = bound("h100", 2, "n2", set_id="vm")
    snap = Snapshot.build(nodes=nodes, classes=[passthrough()], claims=[held])
    # n1 would be the tighter fit, but moving a hold that fits costs the tenant its node.
    assert set_placement.place_set(snap, [held], NOW) == Placement("n2")
    # A template claim joining the held one goes where the set is.
    assert set_placement.place_set(snap, [held, claim("h100", 1, set_id="vm")], NOW) == Placement(
        "n2"
    )


# --- where a starting VM's set is pinned (seed 000) ---------------------------------------


def _cordoned(name: str, gpus: int = 4, *, ready: bool = True) -> NodeInfo:
    return node(name, gpus, unschedulable=True, ready=ready)


def test_start_pins_a_set_to_the_node_that_serves_it() -> None:
    snap = Snapshot.build(
        nodes=[node("n1", 4), node("n2", 8)],
        classes=[passthrough()],
        claims=[bound("h100", 2, "n1", name="held")],
        namespaces=[tenant("tenant-a")],
    )
    held = snap.claim(ClaimKey("tenant-a", "held"))
    assert held is not None
    assert set_placement.place_for_start(snap, [held], NOW) == Placement("n1")


def test_a_stay_pin_keeps_a_starting_set_on_its_cordoned_node_even_when_not_ready() -> None:
    for ready in (True, False):
        snap = Snapshot.build(
            nodes=[_cordoned("n1", ready=ready), node("n2", 8)],
            classes=[passthrough(on_cordon=OnCordon.STAY)],
            claims=[bound("h100", 2, "n1", name="held")],
            namespaces=[tenant("tenant-a")],
        )
        held = snap.claim(ClaimKey("tenant-a", "held"))
        assert held is not None
        template = claim("h100", 1, name="tpl", template=True)
        assert set_placement.place_for_start(snap, [held, template], NOW) == Placement("n1"), ready


def test_cordon_alone_pins_a_move_set_where_it_is_only_when_no_other_node_has_room() -> None:
    snap = Snapshot.build(
        nodes=[_cordoned("n1"), node("n2", 1)],
        classes=[passthrough()],
        claims=[bound("h100", 2, "n1", name="held")],
        namespaces=[tenant("tenant-a")],
    )
    held = snap.claim(ClaimKey("tenant-a", "held"))
    assert held is not None
    assert set_placement.place_for_start(snap, [held], NOW) == Placement("n1"), "no room elsewhere"
    snap.upsert_node(node("n2", 4))
    assert set_placement.place_for_start(snap, [held], NOW) == Placement("n2"), (
        "room elsewhere: Move"
    )


def test_a_pin_gives_way_when_the_cordoned_node_has_lost_capacity_or_is_not_ready() -> None:
    snap = Snapshot.build(
        nodes=[_cordoned("n1", ready=False), node("n2", 4)],
        classes=[passthrough()],
        claims=[bound("h100", 2, "n1", name="held")],
        namespaces=[tenant("tenant-a")],
    )
    held = snap.claim(ClaimKey("tenant-a", "held"))
    assert held is not None
    assert set_placement.place_for_start(snap, [held], NOW) == Placement("n2"), (
        "Move class, NotReady node"
    )
    stay = Snapshot.build(
        nodes=[_cordoned("n1", gpus=1), node("n2", 4)],
        classes=[passthrough(on_cordon=OnCordon.STAY)],
        claims=[bound("h100", 2, "n1", name="held")],
        namespaces=[tenant("tenant-a")],
    )
    assert set_placement.place_for_start(stay, [held], NOW) == Placement("n2"), (
        "lost capacity breaks a Stay pin"
    )
