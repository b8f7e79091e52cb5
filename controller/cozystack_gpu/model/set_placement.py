"""Where one VM's set of claims goes: a best fit, or the node it already holds.

``check_order``, ``place_set``, ``place_for_start`` and ``place_migration``: the set's shape
and budgets are judged first, then one node that serves every class of the set is found
(``search``); at a VM's start, a set held whole on a cordoned or stale node may be pinned
where it is; a live migration's target goes to another node than the set's. These
functions read the snapshot's indexes and never change them; they live beside it, not in
it, so the snapshot keeps only the bookkeeping (and never calls back here).

Nothing here does I/O or reads a clock: ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from cozystack_gpu.keys import OnCordon, Phase
from cozystack_gpu.model.search import find_node
from cozystack_gpu.model.set_shape import ClassShape, SetMember, judge_set_shape
from cozystack_gpu.model.types import ClaimInfo, Decision, Placement, Reason, Refusal

if TYPE_CHECKING:
    from cozystack_gpu.model.snapshot import Snapshot


def check_order(
    snap: Snapshot, claim: ClaimInfo, now: float, nodes: Collection[str] | None = None
) -> Decision:
    """Judge one order: class, maxCount, vGPU entitlement, budget chain, then capacity
    on one serving node (best fit, skipping the claim's unexpired rejected nodes).

    A claim that already counts (Bound, Attached, Lost) skips the entitlement and
    budget (and maxCount) checks, so moving or rebinding it never fails on them.
    """
    return place_set(snap, (claim,), now, nodes)


def place_for_start(
    snap: Snapshot,
    claims: Sequence[ClaimInfo],
    now: float,
    nodes: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> Decision:
    """Where a VM's launcher pod is pinned: the node its whole set goes to at start.

    Usually ``place_set``: a set that holds units on a node that still serves it stays
    there, anything else goes to the best fit. Seed 000 adds the cordon rule: a set held
    whole on a cordoned node, whose only reason to leave is the cordon, is pinned where
    it is when a class of the set says ``onCordon: Stay`` (a Stay pin, which also holds
    through NotReady) or when no other node has room for it. A set held whole on a node
    whose agent report is stale starts there too: its holds stay, and nothing new is
    placed there. ``exclude`` leaves out nodes that refused the VM's launcher pod before
    (its template claims' rejections die with their VMI; the binder keeps them against
    the VM).
    """
    pinned = _pinned_node(snap, claims, now, nodes)
    if pinned is not None and pinned in exclude:
        pinned = None
    if pinned is None:
        return place_set(snap, claims, now, nodes, exclude=exclude)
    if not snap._nodes[pinned].unschedulable:
        return Placement(pinned)  # only stale: the set keeps its node
    if any(snap._classes[c.class_name].on_cordon is OnCordon.STAY for c in claims):
        return Placement(pinned)
    elsewhere = place_set(snap, claims, now, nodes, exclude=(pinned, *exclude))
    return Placement(pinned) if isinstance(elsewhere, Refusal) else elsewhere


def _pinned_node(
    snap: Snapshot, claims: Sequence[ClaimInfo], now: float, nodes: Collection[str] | None
) -> str | None:
    """The cordoned (or stale) node a set is held on whole, when nothing but the cordon
    (and, under a Stay class, NotReady) or a stale inventory says it should leave, and
    its other members fit there (on a stale node: the set has no member to add)."""
    held = {c.node for c in claims if c.holds_node and c.node is not None}
    if len(held) != 1 or any(c.counts_budget and not c.holds_node for c in claims):
        return None
    name = next(iter(held))
    node = snap._nodes.get(name)
    if node is None or not (node.unschedulable or node.inventory_stale):
        return None
    if nodes is not None and name not in nodes:
        return None
    if any(r.node == name and r.until > now for c in claims for r in c.rejected):
        return None
    classes = [snap._classes.get(c.class_name) for c in claims]
    if any(k is None or snap.why_not_placeable(node, k) is not None for k in classes):
        return None
    stay = any(k is not None and k.on_cordon is OnCordon.STAY for k in classes)
    if not node.ready and not (node.unschedulable and stay):
        return None
    if snap.over_capacity(name):
        return None  # the node lost capacity: every pin gives way
    need: dict[str, int] = {}
    for claim in claims:
        if not claim.holds_node:
            res = snap._classes[claim.class_name].resource_name
            need[res] = need.get(res, 0) + claim.count
    if need and node.inventory_stale:
        return None  # a stale node takes no new units
    if any(snap.order_free(name, res) < units for res, units in need.items()):
        return None
    waiting = [c for c in claims if not c.counts_budget]
    if snap._ledger.check_orders(waiting, snap._classes) is not None:
        return None
    return name


BOOKED_WORDS = " (units reservations booked for their windows are not free to orders)"


def place_set(
    snap: Snapshot,
    claims: Sequence[ClaimInfo],
    now: float,
    nodes: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> Decision:
    """Place the claims of one VM together on one node serving every class of the set.

    ``nodes`` limits the choice (a WaitForFirstConsumer volume's node affinity);
    ``exclude`` leaves nodes out (a set that must leave its node). Rejected nodes of any
    claim in the set are skipped until their ``until``. Pending claims are judged by
    budget in order, each counted as Bound before the next. A set whose members hold
    units on one node that still takes them all stays there.
    """
    if not claims:
        raise ValueError("place_set needs at least one claim")
    members = [
        SetMember(claim.class_name, claim.count, order=claim.phase is Phase.PENDING)
        for claim in claims
    ]
    shapes = {
        name: ClassShape(klass.mode, klass.deleting, snap.max_count(name))
        for name in {claim.class_name for claim in claims}
        if (klass := snap._classes.get(name)) is not None
    }
    # maxCount judges orders; a move or rebind of units already held is judged by
    # capacity alone (see set_shape).
    ordering = any(not c.counts_budget for c in claims)
    demand, refusal = judge_set_shape(members, shapes, max_count=ordering)
    if refusal is not None:
        return refusal
    refusal = snap._ledger.check_orders([c for c in claims if not c.counts_budget], snap._classes)
    if refusal is not None:
        return refusal
    # By the units orders may take: booked windows' units are left out (SPEC §11).
    decision = find_node(snap._classes, snap._oidx, demand, claims, now, nodes, exclude)
    if isinstance(decision, Refusal) and decision.reason is Reason.INSUFFICIENT_CAPACITY:
        resources = {snap._classes[name].resource_name for name in demand}
        if any(snap.windows.nodes.get(res) for res in resources):
            return Refusal(decision.reason, decision.message + BOOKED_WORDS)
    # A set's classes may each have serving nodes, just none in common: no words then.
    if (
        isinstance(decision, Refusal)
        and decision.reason is Reason.NO_NODE_SERVES
        and len(demand) == 1
        and snap._nodes
    ):
        why = snap.why_no_node_serves(next(iter(demand)))
        return Refusal(Reason.NO_NODE_SERVES, f"{decision.message}: {why}")
    return decision


MIGRATION_WORDS = "the live migration needs another node for the VM's GPUs: "


def place_migration(
    snap: Snapshot,
    claims: Sequence[ClaimInfo],
    now: float,
    nodes: Collection[str] | None = None,
) -> Decision:
    """Where a live migration's target pod goes (SPEC §12): the whole set on one node other
    than the one it is held on, serving every class of the set, by best fit, skipping the
    set's unexpired rejected nodes, ``nodes`` limiting the choice as in ``place_set``.

    Every member already counts against its budgets, so, like a move, the target is judged
    by capacity alone (and by the units orders may take: booked windows are left out). A
    target already recorded on members (the leader placed it and went before it pinned the
    pod) holds their units there: they count as the set's own, so that node is kept while
    it still takes the set. Raises ValueError unless every claim holds units on one node.
    """
    held = {c.node for c in claims if c.node is not None and c.holds_node}
    if not claims or len(held) != 1 or not all(c.holds_node for c in claims):
        raise ValueError("place_migration needs a set held whole on one node")
    source = held.pop()
    # The search credits a set's held units on the node they are held on.
    judged = [replace(c, node=c.migrating_to) if c.migrating_to else c for c in claims]
    decision = place_set(snap, judged, now, nodes, exclude=(source,))
    if isinstance(decision, Refusal):
        return Refusal(decision.reason, MIGRATION_WORDS + decision.message)
    return decision
