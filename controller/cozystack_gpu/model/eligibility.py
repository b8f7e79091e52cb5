"""Does a node serve a class? The rule alone, without indexes, so the snapshot, the tests'
oracle and anyone explaining a refusal apply the same words.

A node serves a class when it matches the class's nodeSelector, is Ready, is not cordoned,
has no pending layout change and a fresh GPU inventory, and carries no NoSchedule or
NoExecute taint the class does not tolerate (PreferNoSchedule only steers the scheduler, so
it is ignored). Two classes that share a resource name must live on disjoint nodes; where
their selectors both match a node, neither is served there, since the node's units could not
be told apart.

A stale inventory (the node agent stopped reporting) is a reason to place nothing new on the
node, not to take holds away: kubelet still reports what the node has, and a silent agent
says nothing about the devices' health. So ``why_not_placeable``, which says why holds must
leave, does not count it; ``serves``, which says where new placements may go, does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from cozystack_gpu.model.types import (
    HARD_TAINT_EFFECTS,
    NODE_STATE_TAINTS,
    ClaimInfo,
    ClassInfo,
    NodeInfo,
)


def selector_matches(node: NodeInfo, cls: ClassInfo) -> bool:
    labels = node.labels
    return all(labels.get(key) == value for key, value in cls.node_selector.items())


def untolerated_taint(node: NodeInfo, cls: ClassInfo) -> str | None:
    """The key of the first hard taint the class does not tolerate, or None."""
    for taint in node.taints:
        if taint.effect not in HARD_TAINT_EFFECTS or taint.key in NODE_STATE_TAINTS:
            continue
        if not cls.tolerates(taint):
            return taint.key
    return None


def shares_resource_on(node: NodeInfo, cls: ClassInfo, classes: Iterable[ClassInfo]) -> bool:
    """Another class with the same resource name also selects this node, or (a ``dra``
    class) another class selecting it matches one of its devices there."""
    if cls.resource_name in node.dra_shared:
        return True
    return any(
        other.name != cls.name
        and other.resource_name == cls.resource_name
        and selector_matches(node, other)
        for other in classes
    )


def why_not_placeable(node: NodeInfo, cls: ClassInfo, classes: Iterable[ClassInfo]) -> str | None:
    """Why the node can never take the class while it stays as it is (Ready, cordon and a
    stale inventory aside), or None when only its state could keep it from serving."""
    if node.layout_pending:
        return f"node {node.name} has a pending layout change"
    if not selector_matches(node, cls):
        return f"node {node.name} does not match the nodeSelector of class {cls.name}"
    taint = untolerated_taint(node, cls)
    if taint is not None:
        return f"node {node.name} has taint {taint}, which class {cls.name} does not tolerate"
    if cls.resource_name in node.dra_shared:
        return (
            f"node {node.name} has devices that another dra class also matches; give the "
            f"classes selectors that no device matches twice"
        )
    if shares_resource_on(node, cls, classes):
        return (
            f"node {node.name} is selected by another class with resource name {cls.resource_name}"
        )
    return None


def takes_new(node: NodeInfo) -> bool:
    """The node may take new placements as far as its own state goes: Ready, not cordoned,
    and its agent reports (a stale report keeps holds, but nothing new goes there)."""
    return node.ready and not node.unschedulable and not node.inventory_stale


def serves(node: NodeInfo, cls: ClassInfo, classes: Iterable[ClassInfo]) -> bool:
    """The full rule: Ready, not cordoned, a fresh inventory, and placeable."""
    return takes_new(node) and why_not_placeable(node, cls, classes) is None


def kept_by_volumes(claim: ClaimInfo, node: NodeInfo | None) -> bool:
    """The claim's VM has volumes with node affinity, all usable from ``node``: the claim's
    set stays there (its VM's disk is there, so its next start can only be there)."""
    return (
        node is not None
        and bool(claim.volumes)
        and all(v.admits(node.name, node.labels) for v in claim.volumes)
    )


class LeftOut(StrEnum):
    """The rule that keeps a node from serving a class, for refusals a tenant reads: they
    count nodes by rule and name none (tenants cannot read Nodes or GPUNodes). The order
    is the order of the words, most telling first: a node that is not for this class at
    all reads as that, not as NotReady."""

    SELECTOR = "selector"
    TAINT = "taint"
    LAYOUT = "layout"
    STALE = "stale"
    NOT_ADVERTISED = "not-advertised"
    SHARED = "shared"
    CORDONED = "cordoned"
    NOT_READY = "not-ready"


def left_out_by(
    node: NodeInfo, cls: ClassInfo, classes: Iterable[ClassInfo], capacity: int
) -> LeftOut | None:
    """The first rule that leaves the node out for the class, or None when it serves it
    with units of the class's resource name (``capacity``)."""
    if not selector_matches(node, cls):
        return LeftOut.SELECTOR
    if untolerated_taint(node, cls) is not None:
        return LeftOut.TAINT
    if node.layout_pending:
        return LeftOut.LAYOUT
    if node.inventory_stale:
        return LeftOut.STALE
    if capacity <= 0:
        return LeftOut.NOT_ADVERTISED
    if shares_resource_on(node, cls, classes):
        return LeftOut.SHARED
    if node.unschedulable:
        return LeftOut.CORDONED
    if not node.ready:
        return LeftOut.NOT_READY
    return None


def _said(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def left_out_words(counts: Mapping[LeftOut | None, int], cls: ClassInfo) -> str:
    """``counts`` of nodes per rule in words: "of 7 nodes, 2 do not match its nodeSelector,
    …". Nodes that serve the class (rule None) are, in a refusal, kept from this order (its
    rejected nodes, its own node when it must leave, the VM's volume)."""
    res = cls.resource_name
    words = {
        LeftOut.SELECTOR: ("does not match its nodeSelector", "do not match its nodeSelector"),
        LeftOut.TAINT: ("has a taint it does not tolerate", "have a taint it does not tolerate"),
        LeftOut.LAYOUT: ("has a pending layout change", "have a pending layout change"),
        LeftOut.STALE: ("has a stale GPU inventory", "have a stale GPU inventory"),
        LeftOut.NOT_ADVERTISED: (f"advertises no {res}", f"advertise no {res}"),
        LeftOut.SHARED: (
            f"is selected by another class with resource name {res}",
            f"are selected by another class with resource name {res}",
        ),
        LeftOut.CORDONED: ("is cordoned", "are cordoned"),
        LeftOut.NOT_READY: ("is NotReady", "are NotReady"),
    }
    total = sum(counts.values())
    parts = [f"of {_said(total, 'node', 'nodes')}"]
    for rule in LeftOut:
        count = counts.get(rule, 0)
        if count:
            one, many = words[rule]
            parts.append(_said(count, one, many))
    kept = counts.get(None, 0)
    if kept:
        parts.append(_said(kept, "serves it but not this order", "serve it but not this order"))
    return ", ".join(parts)
