"""Refusals a tenant reads say what to do and to whom: who grants vGPU and how, which level
of the tenant tree set a budget and who can raise it, and why no node serves a class, in
counts (tenants cannot read Nodes or GPUNodes, so no node is named)."""

from __future__ import annotations

from model_builders import L40S_24C, NOW, bound, claim, node, passthrough, tenant, vgpu

from cozystack_gpu.keys import LABEL_NODE_LAYOUT_STATE, LayoutState, quota_key
from cozystack_gpu.model import Reason, Refusal, Snapshot, Taint, set_placement
from cozystack_gpu.model.budgets import vgpu_not_entitled

TREE = [
    tenant("tenant-root", quota={quota_key("h100"): 3}),
    tenant("tenant-a", "tenant-root", quota={quota_key("h100"): 8}),
    tenant("tenant-a-dev", "tenant-root", "tenant-a", quota={quota_key("h100"): 1}),
]


def refusal_of(decision: object) -> Refusal:
    assert isinstance(decision, Refusal), decision
    return decision


def test_vgpu_refusal_says_the_parent_grants_it_not_the_tenant() -> None:
    snap = Snapshot.build(
        nodes=[node("v1", 8, L40S_24C)],
        classes=[vgpu()],
        namespaces=[tenant("tenant-root"), tenant("tenant-a", "tenant-root")],
    )
    refusal = refusal_of(set_placement.check_order(snap, claim("l40s-24c"), NOW))
    assert refusal.reason is Reason.VGPU_NOT_ENTITLED
    assert refusal.message == vgpu_not_entitled("tenant-a", "l40s-24c")
    assert refusal.message == (
        "vGPU class l40s-24c needs the vGPU entitlement, which namespace tenant-a does not "
        "have; a tenant cannot grant it to itself: the parent tenant's administrator (the "
        "platform administrator for the root tenant) grants vGPU on the Tenant, and Cozystack "
        'then labels the namespace gpu.cozystack.io/vgpu: "true"'
    )
    assert "label your" not in refusal.message


def test_budget_refusal_on_the_own_tenant_names_the_parent_as_who_raises_it() -> None:
    snap = Snapshot.build(nodes=[node("n1")], classes=[passthrough()], namespaces=TREE)
    refusal = refusal_of(set_placement.check_order(snap, claim("h100", 2, "tenant-a-dev"), NOW))
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert refusal.message == (
        "budget gpu.cozystack.io/h100 of tenant-a-dev (this namespace's own quota) allows 1: "
        "0 in use, the order asks 2 more; the hoster can raise it (on "
        "Cozystack, the administrator of its parent tenant tenant-a, on the Tenant)"
    )


def test_budget_refusal_set_above_names_the_level_and_the_platform_administrator() -> None:
    claims = [bound("h100", 3, "n1", "tenant-a")]
    snap = Snapshot.build(
        nodes=[node("n1")], classes=[passthrough()], claims=claims, namespaces=TREE
    )
    refusal = refusal_of(set_placement.check_order(snap, claim("h100", 1, "tenant-a"), NOW))
    assert refusal.message == (
        "budget gpu.cozystack.io/h100 of tenant-root (1 level above tenant-a) allows 3: "
        "3 in use, the order asks 1 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)"
    )
    deep = refusal_of(set_placement.check_order(snap, claim("h100", 1, "tenant-a-dev"), NOW))
    assert "of tenant-root (2 levels above tenant-a-dev) allows 3" in deep.message, deep


def test_no_node_serves_says_which_rule_leaves_each_kind_of_node_out_in_counts() -> None:
    selector = {"gpu": "h100"}
    h100 = {"gpu": "h100"}
    nodes = [
        node("gpu-1"),
        node("gpu-2"),
        node("gpu-3", labels=h100, taints=(Taint("dedicated", "NoSchedule"),)),
        node("gpu-4", labels=h100, unschedulable=True),
        node("gpu-5", labels=h100, ready=False),
        node("gpu-6", labels={**h100, LABEL_NODE_LAYOUT_STATE: LayoutState.PENDING.value}),
        node("gpu-7", 0, labels=h100),
    ]
    snap = Snapshot.build(nodes=nodes, classes=[passthrough(selector=selector)])
    refusal = refusal_of(set_placement.check_order(snap, claim("h100"), NOW))
    assert refusal.reason is Reason.NO_NODE_SERVES
    assert refusal.message == (
        "no node serves class h100: of 7 nodes, 2 do not match its nodeSelector, 1 has a "
        "taint it does not tolerate, 1 has a pending layout change, 1 advertises no "
        "nvidia.com/GH100_H100, 1 is cordoned, 1 is NotReady"
    )
    assert "gpu-" not in refusal.message, "a tenant reads no node's name"


def test_a_stale_inventory_is_named_as_the_rule_that_leaves_the_node_out() -> None:
    from dataclasses import replace

    snap = Snapshot.build(
        nodes=[replace(node("n1"), inventory_stale=True)], classes=[passthrough()]
    )
    refusal = refusal_of(set_placement.check_order(snap, claim("h100"), NOW))
    assert refusal.message == ("no node serves class h100: of 1 node, 1 has a stale GPU inventory")


def test_the_counts_follow_every_node_and_class_change() -> None:
    snap = Snapshot.build(nodes=[node("n1", ready=False)], classes=[passthrough()])
    assert refusal_of(set_placement.check_order(snap, claim("h100"), NOW)).message.endswith(
        "1 is NotReady"
    )
    snap.upsert_node(node("n1", unschedulable=True))
    assert refusal_of(set_placement.check_order(snap, claim("h100"), NOW)).message.endswith(
        "1 is cordoned"
    )
    snap.upsert_node(node("n2", ready=False))
    assert refusal_of(set_placement.check_order(snap, claim("h100"), NOW)).message.endswith(
        "of 2 nodes, 1 is cordoned, 1 is NotReady"
    )
    snap.upsert_class(passthrough(selector={"gpu": "h100"}))
    assert refusal_of(set_placement.check_order(snap, claim("h100"), NOW)).message.endswith(
        "of 2 nodes, 2 do not match its nodeSelector"
    )
    snap.remove_node("n2")
    assert refusal_of(set_placement.check_order(snap, claim("h100"), NOW)).message.endswith(
        "of 1 node, 1 does not match its nodeSelector"
    )
