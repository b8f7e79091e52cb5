"""Random GPU clusters, operations on them, and an oracle that checks the model's answers
from the raw objects alone (no index), for the property tests and the stress command.

An operation is a tuple of small integers, so hypothesis can shrink a failing sequence and
the stress command can draw millions of them from a seeded ``random.Random``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from model_builders import commit, record_bind
from model_digest import digest

from cozystack_gpu.keys import (
    LABEL_NODE_LAYOUT_STATE,
    LABEL_VGPU_ENTITLEMENT,
    QUOTA_KEY_TOTAL,
    TENANT_LABEL_PREFIX,
    LayoutState,
    Mode,
    OnCordon,
    Phase,
    quota_key,
    raw_quota_keys,
)
from cozystack_gpu.model import (
    MAX_MOVES,
    Action,
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    Decision,
    Device,
    NamespaceInfo,
    NodeInfo,
    NodeRequirement,
    Placement,
    Plan,
    Reason,
    Refusal,
    RejectedNode,
    Snapshot,
    Step,
    Taint,
    Toleration,
    VolumeAffinity,
    plan,
    serves,
    set_placement,
)
from cozystack_gpu.model.eligibility import kept_by_volumes, why_not_placeable
from cozystack_gpu.model.packing import may_move

RES_A = "nvidia.com/GA100"
RES_B = "nvidia.com/AD102GL_L40S"
RES_V = "nvidia.com/NVIDIA_L40S-24C"
GPU_TAINT = Taint("gpu", "NoSchedule", "true")

TENANTS = {
    "tenant-root": (),
    "tenant-a": ("tenant-root",),
    "tenant-b": ("tenant-root",),
    "tenant-a-x": ("tenant-root", "tenant-a"),
    "tenant-a-y": ("tenant-root", "tenant-a"),
}
QUOTA_KEYS = (
    quota_key("pa"),
    quota_key("pb"),
    quota_key("va"),
    QUOTA_KEY_TOTAL,
    raw_quota_keys(RES_A)[0],
)


def tenant_labels(name: str, ancestors: Iterable[str], entitled: bool = False) -> dict[str, str]:
    labels = {TENANT_LABEL_PREFIX + a: "" for a in (*ancestors, name)}
    if entitled:
        labels[LABEL_VGPU_ENTITLEMENT] = "true"
    return labels


@dataclass
class World:
    """The objects themselves, the source of truth the snapshot must agree with."""

    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    claims: dict[ClaimKey, ClaimInfo] = field(default_factory=dict)
    namespaces: dict[str, NamespaceInfo] = field(default_factory=dict)
    serial: int = 0
    now: float = 1000.0

    def snapshot(self) -> Snapshot:
        return Snapshot.build(
            nodes=self.nodes.values(),
            classes=self.classes.values(),
            claims=self.claims.values(),
            namespaces=self.namespaces.values(),
        )


def make_node(i: int, r: random.Random) -> NodeInfo:
    kind = r.randrange(4)
    devices: list[Device] = []
    alloc: dict[str, int] = {}
    if kind in (0, 3):
        units = r.choice((1, 2, 4, 8))
        devices += [Device(RES_A, 1)] * units
        alloc[RES_A] = units if r.random() < 0.9 else max(0, units - 1)
    if kind in (1, 3):
        units = r.choice((2, 4))
        devices += [Device(RES_B, 1)] * units
        alloc[RES_B] = units
    if kind == 2:
        devices += [Device(RES_V, 4), Device(RES_V, 4)]
        alloc[RES_V] = 8
    labels = {"zone": r.choice(("z1", "z2"))}
    if r.random() < 0.1:
        labels[LABEL_NODE_LAYOUT_STATE] = LayoutState.PENDING.value
    taints = (GPU_TAINT,) if r.random() < 0.2 else ()
    if r.random() < 0.1:
        taints += (Taint("soft", "PreferNoSchedule"),)
    raw = {RES_A: 1} if RES_A in alloc and r.random() < 0.1 else {}
    stale = r.random() < 0.05
    return NodeInfo(
        name=f"n{i}",
        labels=labels,
        taints=taints,
        ready=r.random() < 0.9,
        unschedulable=r.random() < 0.1,
        allocatable=alloc,
        devices=tuple(devices),
        raw_used=raw,
        inventory_stale=stale,
    )


def vm_volumes(a: int, set_id: str | None) -> tuple[VolumeAffinity, ...]:
    """Some VMs have a disk bound to a zone or to one node (a local PV), the same for every
    member of a set; most have none."""
    seed = a if set_id is None else sum(map(ord, set_id))
    kind = seed % 7
    if kind == 0:
        return (VolumeAffinity("pv-zone", ((NodeRequirement("zone", "In", ("z1",)),),)),)
    if kind == 1:
        name = f"n{(seed // 7) % 8}"
        return (VolumeAffinity("pv-" + name, ((NodeRequirement("", "In", (name,), True),),)),)
    return ()


def make_class(name: str, r: random.Random) -> ClassInfo:
    tolerations: tuple[Toleration, ...] = ()
    if r.random() < 0.5:
        tolerations = (r.choice((Toleration("gpu", "Exists"), Toleration("gpu", "Equal", "true"))),)
    on_cordon = r.choice((OnCordon.MOVE, OnCordon.STAY))
    if name == "pa":
        return ClassInfo("pa", Mode.PASSTHROUGH, RES_A, None, {}, tolerations, on_cordon)
    if name == "pa2":
        # Shares pa's resource name; only z2 nodes, so it overlaps pa everywhere it selects.
        return ClassInfo("pa2", Mode.PASSTHROUGH, RES_A, None, {"zone": "z2"}, tolerations)
    if name == "pb":
        selector = {"zone": r.choice(("z1", "z2"))} if r.random() < 0.5 else {}
        return ClassInfo("pb", Mode.PASSTHROUGH, RES_B, r.choice((None, 2, 4)), selector)
    return ClassInfo("va", Mode.VGPU, RES_V, r.choice((None, 1, 2)), {}, tolerations, on_cordon)


def make_namespace(name: str, r: random.Random) -> NamespaceInfo:
    quota = {k: r.choice((0, 2, 4, 8, 16, 32)) for k in QUOTA_KEYS if r.random() < 0.25}
    raw = {RES_A: 1} if r.random() < 0.1 else {}
    return NamespaceInfo(name, tenant_labels(name, TENANTS[name], r.random() < 0.6), quota, raw)


def random_world(r: random.Random, nodes: int = 6) -> World:
    world = World()
    for i in range(nodes):
        node = make_node(i, r)
        world.nodes[node.name] = node
    for name in ("pa", "pb", "va") + (("pa2",) if r.random() < 0.2 else ()):
        world.classes[name] = make_class(name, r)
    for name in TENANTS:
        world.namespaces[name] = make_namespace(name, r)
    return world


# --- operations --------------------------------------------------------------------------

Op = tuple[int, int, int, int]
N_OPS = 11


@dataclass
class Checker:
    """Applies operations to a world and its snapshot, checking every decision made."""

    world: World
    snap: Snapshot
    decisions: int = 0
    plans: int = 0
    cordon_rules_judged: int = 0  # sets that left a node where only Ready or cordon could say
    packing_judged: int = 0  # orders left waiting for capacity, judged by the packing oracle
    packing_moves: int = 0  # moves made to free a node for an order

    @classmethod
    def of(cls, world: World, orders: int = 0, seed: int = 0) -> Checker:
        """A checker over ``world``; with ``orders``, that many claims are ordered and bound
        by a first pass, so operations start on a cluster that already holds GPUs."""
        checker = cls(world, world.snapshot())
        if orders:
            r = random.Random(seed)
            for _order in range(orders):
                checker.put(checker.new_claim(r.randrange(1000), r.randrange(1000)))
            checker.plan_and_commit()
        return checker

    def apply(self, op: Op) -> None:
        kind, a, b, c = op
        w = self.world
        w.now += 1.0
        kind %= N_OPS
        if kind == 0:
            self.change_node(a, b, c)
        elif kind == 1:
            name = f"n{a % 8}"
            w.nodes.pop(name, None)
            self.snap.remove_node(name)
        elif kind in (2, 3):
            self.order(a, b, c)
        elif kind == 4:
            self.remove_claim(a)
        elif kind == 5:
            self.change_claim(a, b)
        elif kind in (6, 7):
            self.plan_and_commit()
        elif kind == 8:
            ns_name = sorted(TENANTS)[a % len(TENANTS)]
            ns = make_namespace(ns_name, random.Random(b * 31 + c))
            if c % 4 == 0 and ns_name != "tenant-root":
                # The tenant moves in the tree: its claims now count under other ancestors.
                parents = ("tenant-root", "tenant-b") if ns_name != "tenant-b" else ()
                ns = replace(ns, labels=tenant_labels(ns_name, parents, ns.vgpu_entitled))
            w.namespaces[ns_name] = ns
            self.snap.upsert_namespace(ns)
        elif kind == 9:
            self.change_class(a, b)
        else:
            self.template_set(a, b, c)

    # nodes
    def change_node(self, a: int, b: int, c: int) -> None:
        name = f"n{a % 8}"
        old = self.world.nodes.get(name)
        r = random.Random(a * 7919 + b * 31 + c)
        if old is None or b % 4 == 0:
            node = replace(make_node(a % 8, r), name=name)
        elif b % 4 == 1:
            node = replace(old, ready=not old.ready)
        elif b % 4 == 2:
            node = replace(old, unschedulable=not old.unschedulable)
        else:
            # kubelet loses a device, or a raw-name pod starts: capacity shrinks under holds.
            alloc = {k: max(0, v - 1 - c % 2) for k, v in old.allocatable.items()}
            raw = {k: 1 + c % 2 for k in old.allocatable} if c % 3 == 0 else dict(old.raw_used)
            node = replace(old, allocatable=alloc, raw_used=raw)
        self.world.nodes[name] = node
        self.snap.upsert_node(node)

    # claims
    def new_claim(
        self, a: int, b: int, template: bool = False, set_id: str | None = None
    ) -> ClaimInfo:
        w = self.world
        w.serial += 1
        ns = sorted(TENANTS)[a % len(TENANTS)]
        class_name = sorted(w.classes)[b % len(w.classes)] if w.classes else "pa"
        count = (1, 1, 2, 4, 8)[(a // 7 + b) % 5]
        rejected: tuple[RejectedNode, ...] = ()
        if b % 5 == 0:
            rejected = (RejectedNode(f"n{b % 8}", w.now + (b % 3) - 1),)
        return ClaimInfo(
            volumes=vm_volumes(a, set_id),
            namespace=ns,
            name=f"c{w.serial}",
            class_name=class_name,
            count=count,
            created=w.now,
            rejected=rejected,
            set_id=set_id,
            template=template,
        )

    def order(self, a: int, b: int, c: int) -> None:
        """An order judged by check_order and bound at once (the admission + binder path),
        or left Pending for the next plan."""
        claim = self.new_claim(a, b)
        if c % 2 == 0:
            self.put(claim)
            return
        before = self.snapshot_view()
        decision = set_placement.check_order(self.snap, claim, self.world.now)
        self.check_decision(before, [claim], decision)
        if isinstance(decision, Placement):
            self.put(record_bind(self.snap, claim, decision.node, self.world.now))
            self.check_placed([claim.key], decision.node)
            check_budgets_after(self.world, [claim])
        else:
            self.put(claim)

    def template_set(self, a: int, b: int, c: int) -> None:
        """A VMI's template claims placed together when its launcher pod is gated."""
        set_id = f"vm{self.world.serial}"
        members = [self.new_claim(a, b + i, True, set_id) for i in range(1 + c % 2)]
        before = self.snapshot_view()
        decision = set_placement.place_set(self.snap, members, self.world.now)
        self.check_decision(before, members, decision)
        for claim in members:
            self.put(claim)
        if isinstance(decision, Placement):
            for claim in members:
                self.put(record_bind(self.snap, claim, decision.node, self.world.now))
            self.check_placed([m.key for m in members], decision.node)
            check_budgets_after(self.world, members)

    def put(self, claim: ClaimInfo) -> None:
        self.world.claims[claim.key] = claim
        self.snap.upsert_claim(claim)

    def remove_claim(self, a: int) -> None:
        if not self.world.claims:
            return
        key = sorted(self.world.claims)[a % len(self.world.claims)]
        del self.world.claims[key]
        self.snap.remove_claim(key)

    def change_claim(self, a: int, b: int) -> None:
        """A VMI starts on a Bound claim, stops, or its VMI ends while the claim is Lost."""
        if not self.world.claims:
            return
        key = sorted(self.world.claims)[a % len(self.world.claims)]
        claim = self.world.claims[key]
        if claim.phase is Phase.BOUND and b % 2 == 0:
            claim = replace(
                claim, phase=Phase.ATTACHED, attached_to="vmi-" + claim.name, vmi_live=True
            )
        elif claim.phase is Phase.ATTACHED:
            claim = replace(claim, phase=Phase.BOUND, attached_to=None, vmi_live=False)
        elif claim.phase is Phase.LOST and claim.vmi_live:
            claim = replace(claim, vmi_live=False)
        else:
            return
        self.put(claim)

    def change_class(self, a: int, b: int) -> None:
        name = ("pa", "pb", "va", "pa2")[a % 4]
        if b % 7 == 0 and name == "pa2":
            self.world.classes.pop(name, None)
            self.snap.remove_class(name)
            return
        klass = make_class(name, random.Random(a * 13 + b))
        if b % 11 == 0:
            klass = replace(klass, deleting=True)
        self.world.classes[name] = klass
        self.snap.upsert_class(klass)

    # plans
    def plan_and_commit(self) -> Plan:
        before = self.snapshot_view()
        unplanned = digest(self.snap)
        result = plan(self.snap, self.world.now)
        assert digest(self.snap) == unplanned, "plan changed the snapshot"
        commit(self.snap, result)
        self.world.claims.update(result.updates)
        self.plans += 1
        for action in result.actions:
            self.check_action(before, action)
        check_every_step(before, result)
        again = plan(self.snap, self.world.now)
        assert again.changes == (), f"plan is not idempotent: {again.changes}"
        check_holds(self.world)
        # Liveness: a Lost claim left waiting has nowhere to go.
        after = self.snapshot_view()
        for claim in self.world.claims.values():
            waiting = claim.phase is Phase.LOST and not claim.vmi_live and claim.set_id is None
            if waiting and claim.class_name in self.world.classes:
                assert oracle_best_fit(after, claim) is None, f"{claim.key} could rebind"
        # Liveness of packing: an order left waiting for capacity has no plan of moves.
        for claim in self.world.claims.values():
            if claim.phase is not Phase.PENDING or claim.template:
                continue
            decision = set_placement.check_order(self.snap, claim, self.world.now)
            if isinstance(decision, Refusal) and decision.reason is Reason.INSUFFICIENT_CAPACITY:
                self.packing_judged += 1
                assert not oracle_room(after, claim, MAX_MOVES), f"{claim.key} could have room"
        return result

    # oracle checks
    def snapshot_view(self) -> View:
        return View(
            dict(self.world.nodes),
            dict(self.world.classes),
            dict(self.world.claims),
            dict(self.world.namespaces),
            self.world.now,
        )

    def check_decision(
        self, before: View, members: Sequence[ClaimInfo], decision: Decision
    ) -> None:
        self.decisions += 1
        if isinstance(decision, Placement):
            check_set_placement(before, members, decision.node)
        elif len(members) == 1 and decision.reason.value in (
            "InsufficientCapacity",
            "NoNodeServesClass",
        ):
            assert oracle_best_fit(before, members[0]) is None, decision
        if len(members) == 1 and isinstance(decision, Placement):
            assert decision.node == oracle_best_fit(before, members[0]), "not the best fit"

    def check_action(self, before: View, action: Action) -> None:
        if action.step in (Step.BIND, Step.MOVE, Step.REBIND):
            assert action.node is not None
            self.decisions += 1
            members = [before.claims[k] for k in action.claims]
            cls_names = {m.class_name for m in members}
            node = before.nodes[action.node]
            for name in cls_names:
                assert serves(node, before.classes[name], before.classes.values()), (action, name)
            self.check_placed(list(action.claims), action.node)
            if action.step is Step.BIND:
                assert not before.classes[members[0].class_name].deleting
                check_budgets_after(self.world, members)
        if action.step is Step.MOVE and action.why.startswith("makes room"):
            # Not a set that must leave: the node still serves it, and packing frees it.
            self.packing_moves += 1
            check_packing_move(before, action)
        elif action.step in (Step.MOVE, Step.LOSE) and check_leaving_respects_cordon_and_stay(
            before, action
        ):
            self.cordon_rules_judged += 1

    def check_placed(self, keys: list[ClaimKey], node: str) -> None:
        """After a placement, the node holds no more than its capacity of those resources."""
        w = self.world
        resources = {
            w.classes[w.claims[k].class_name].resource_name
            for k in keys
            if w.claims[k].class_name in w.classes
        }
        used = oracle_used(w)
        info = w.nodes[node]
        cap = info.capacity()
        for res in resources:
            held = used.get((node, res), 0) + info.raw_used.get(res, 0)
            assert held <= cap.get(res, 0), f"{node} holds {held} of {cap.get(res, 0)} {res}"


@dataclass
class View:
    nodes: dict[str, NodeInfo]
    classes: dict[str, ClassInfo]
    claims: dict[ClaimKey, ClaimInfo]
    namespaces: dict[str, NamespaceInfo]
    now: float


def oracle_used(world: World | View) -> dict[tuple[str, str], int]:
    used: dict[tuple[str, str], int] = {}
    for claim in world.claims.values():
        klass = world.classes.get(claim.class_name)
        if klass is None or not claim.holds_node or claim.node is None:
            continue
        key = (claim.node, klass.resource_name)
        used[key] = used.get(key, 0) + claim.count
    return used


def oracle_free(
    view: View | World, node: NodeInfo, res: str, used: dict[tuple[str, str], int]
) -> int:
    return max(
        0, node.capacity().get(res, 0) - used.get((node.name, res), 0) - node.raw_used.get(res, 0)
    )


def oracle_best_fit(view: View, claim: ClaimInfo) -> str | None:
    """Brute force: among nodes serving the class and not rejected, the fewest free units that
    still fit, then the smallest name."""
    klass = view.classes[claim.class_name]
    used = oracle_used(view)
    skip = {r.node for r in claim.rejected if r.until > view.now}
    best: tuple[int, str] | None = None
    for node in view.nodes.values():
        if node.name in skip or not serves(node, klass, view.classes.values()):
            continue
        free = oracle_free(view, node, klass.resource_name, used)
        if free >= claim.count and (best is None or (free, node.name) < best):
            best = (free, node.name)
    return best[1] if best else None


def check_set_placement(view: View, members: Sequence[ClaimInfo], node_name: str) -> None:
    node = view.nodes[node_name]
    used = oracle_used(view)
    need: dict[str, int] = {}
    for claim in members:
        klass = view.classes[claim.class_name]
        assert serves(node, klass, view.classes.values()), (node_name, klass.name)
        for r in claim.rejected:
            assert not (r.node == node_name and r.until > view.now), "placed on a rejected node"
        need[klass.resource_name] = need.get(klass.resource_name, 0) + claim.count
    for res, units in need.items():
        assert oracle_free(view, node, res, used) >= units, (node_name, res, units)
    vgpu = {m.class_name for m in members if view.classes[m.class_name].mode is Mode.VGPU}
    assert len(vgpu) <= 1


def oracle_budget(world: World, tenant: str, key: str) -> int:
    total = 0
    for claim in world.claims.values():
        if not claim.counts_budget:
            continue
        ns = world.namespaces.get(claim.namespace)
        ancestors = ns.ancestors if ns is not None else {claim.namespace}
        if tenant not in ancestors:
            continue
        klass = world.classes.get(claim.class_name)
        keys = {QUOTA_KEY_TOTAL, quota_key(claim.class_name)}
        if klass is not None:
            keys.update(raw_quota_keys(klass.resource_name))
        if key in keys:
            total += claim.count
    for ns in world.namespaces.values():
        if tenant in ns.ancestors:
            for res, units in ns.raw_used.items():
                if key in raw_quota_keys(res):
                    total += units
    return total


def check_budgets_after(world: World, bound: Sequence[ClaimInfo]) -> None:
    """A new bind never leaves a budget key over its limit on the tenant or any ancestor."""
    for claim in bound:
        ns = world.namespaces.get(claim.namespace)
        ancestors = ns.ancestors if ns is not None else {claim.namespace}
        klass = world.classes[claim.class_name]
        keys = {quota_key(klass.name), QUOTA_KEY_TOTAL, *raw_quota_keys(klass.resource_name)}
        if klass.mode is Mode.VGPU:
            assert ns is not None and ns.vgpu_entitled, "vGPU bound without entitlement"
        for tenant in ancestors:
            quota = world.namespaces[tenant].quota if tenant in world.namespaces else {}
            for key in keys & set(quota):
                used = oracle_budget(world, tenant, key)
                assert used <= quota[key], f"{tenant} {key}: {used} > {quota[key]}"


def over_capacity(view: View, node: NodeInfo) -> set[str]:
    used = oracle_used(view)
    cap = node.capacity()
    return {
        res
        for (name, res), units in used.items()
        if name == node.name and units + node.raw_used.get(res, 0) > cap.get(res, 0)
    }


def check_leaving_respects_cordon_and_stay(view: View, action: Action) -> bool:
    """Seed 000's rules for an unattached set leaving its node (a Move, or a Lose for want of
    room elsewhere), judged on the state the pass started from:

    - cordon alone never loses a hold: on a Ready node that still serves the set and has
      not lost capacity, a cordon can move the set (onCordon: Move, with room elsewhere) but
      never make it Lost;
    - a Stay pin holds through NotReady: on a cordoned node whose set has a Stay class, the
      set leaves only when the node no longer serves it or has lost capacity.
    """
    if action.from_node is None:
        return False
    node = view.nodes.get(action.from_node)
    members = [view.claims[k] for k in action.claims if k in view.claims]
    if node is None or not members or any(m.phase is not Phase.BOUND for m in members):
        return False  # the node is gone, or attached claims going Lost on a NotReady node
    assert not any(kept_by_volumes(m, node) for m in members), f"a set left its disk: {action}"
    classes = [view.classes.get(m.class_name) for m in members]
    if any(c is None for c in classes):
        return False
    known = [c for c in classes if c is not None]
    if any(why_not_placeable(node, c, view.classes.values()) is not None for c in known):
        return False  # a reason to leave besides Ready and cordon
    if {c.resource_name for c in known} & over_capacity(view, node):
        return False  # the node lost capacity: every pin gives way
    stay = any(c.on_cordon is OnCordon.STAY for c in known)
    assert not (node.unschedulable and stay), f"a Stay pin gave way: {action}"
    if node.ready:
        assert node.unschedulable, f"a set left a Ready node that serves it: {action}"
        assert action.step is Step.MOVE, f"cordon alone lost a hold: {action}"
    return True


def check_holds(world: World) -> None:
    """After a pass, no unattached claim sits on a node holding more than its capacity, but
    those kept there by their VM's disk."""
    used = oracle_used(world)
    for claim in world.claims.values():
        klass = world.classes.get(claim.class_name)
        if claim.phase is not Phase.BOUND or klass is None or claim.node is None:
            continue
        node = world.nodes.get(claim.node)
        assert node is not None, f"{claim.key} Bound on a node that is gone"
        if kept_by_volumes(claim, node):
            continue
        res = klass.resource_name
        held = used.get((node.name, res), 0) + node.raw_used.get(res, 0)
        assert held <= node.capacity().get(res, 0), f"{node.name} over capacity for {res}"


# --- packing ---------------------------------------------------------------------------


def movable_sets(view: View, node: str) -> list[list[ClaimInfo]]:
    """Sets every member of which is Bound on ``node``, unattached, no template, not kept
    there by its VM's disk: the holds packing may move off it."""
    sets: dict[tuple[str, str], list[ClaimInfo]] = {}
    for claim in view.claims.values():
        sets.setdefault(claim.set_key, []).append(claim)
    out = []
    for members in sets.values():
        if all(
            m.phase is Phase.BOUND
            and m.node == node
            and m.attached_to is None
            and not m.template
            and not kept_by_volumes(m, view.nodes.get(node))
            and m.class_name in view.classes
            for m in members
        ):
            out.append(sorted(members, key=lambda c: c.key))
    return sorted(out, key=lambda ms: ms[0].key)


def oracle_room(view: View, order: ClaimInfo, max_moves: int) -> bool:
    """Brute force: the order fits some node serving its class (not one it rejected), now or
    after moving some of the movable sets off that node (every subset of at most
    ``max_moves`` claims), each set to another node that serves every class of the set, is
    not rejected by it and has room with the sets placed before it (every destination)."""
    klass = view.classes[order.class_name]
    classes = view.classes.values()
    used = oracle_used(view)
    skip = {r.node for r in order.rejected if r.until > view.now}
    for node in sorted(view.nodes.values(), key=lambda n: n.name):
        if node.name in skip or not serves(node, klass, classes):
            continue
        free = oracle_free(view, node, klass.resource_name, used)
        if free >= order.count:
            return True
        sets = movable_sets(view, node.name)
        for size in range(1, len(sets) + 1):
            for subset in itertools.combinations(sets, size):
                if sum(len(s) for s in subset) > max_moves:
                    continue
                freed = sum(
                    m.count
                    for s in subset
                    for m in s
                    if view.classes[m.class_name].resource_name == klass.resource_name
                )
                if free + freed >= order.count and _assignable(view, list(subset), node.name):
                    return True
    return False


def _assignable(view: View, sets: list[list[ClaimInfo]], leaving: str) -> bool:
    """Every set on some node other than ``leaving``, with room for all placed on it."""
    used = oracle_used(view)
    classes = view.classes.values()
    failed: set[tuple[int, tuple[tuple[tuple[str, str], int], ...]]] = set()
    extra: dict[tuple[str, str], int] = {}

    def place(i: int) -> bool:
        if i == len(sets):
            return True
        state = (i, tuple(sorted(extra.items())))
        if state in failed:
            return False
        members = sets[i]
        need: dict[str, int] = {}
        for m in members:
            res = view.classes[m.class_name].resource_name
            need[res] = need.get(res, 0) + m.count
        skip = {r.node for m in members for r in m.rejected if r.until > view.now}
        for node in sorted(view.nodes.values(), key=lambda n: n.name):
            if node.name == leaving or node.name in skip:
                continue
            if not all(serves(node, view.classes[m.class_name], classes) for m in members):
                continue
            room = all(
                oracle_free(view, node, res, used) - extra.get((node.name, res), 0) >= units
                for res, units in need.items()
            )
            if not room:
                continue
            for res, units in need.items():
                extra[(node.name, res)] = extra.get((node.name, res), 0) + units
            if place(i + 1):
                return True
            for res, units in need.items():
                extra[(node.name, res)] -= units
                if not extra[(node.name, res)]:
                    del extra[(node.name, res)]
        failed.add(state)
        return False

    return place(0)


def check_packing_move(view: View, action: Action) -> None:
    """A move that makes room: unattached holds, the set whole, off the node it frees."""
    members = [view.claims[k] for k in action.claims]
    assert action.from_node is not None
    for m in members:
        assert may_move(m, view.nodes[action.from_node], ()), f"packing moved {m}"
    whole = {k for k, c in view.claims.items() if c.set_key == members[0].set_key}
    assert whole == set(action.claims), f"packing split a set: {action}"


def budget_usage(view: View) -> dict[tuple[str, str], int]:
    """Units per (tenant, budget key) over every tenant's subtree, from the claims alone
    (raw-name pods aside: no pass changes them)."""
    usage: dict[tuple[str, str], int] = {}
    for claim in view.claims.values():
        if not claim.counts_budget:
            continue
        ns = view.namespaces.get(claim.namespace)
        ancestors = ns.ancestors if ns is not None else {claim.namespace}
        klass = view.classes.get(claim.class_name)
        keys = {QUOTA_KEY_TOTAL, quota_key(claim.class_name)}
        if klass is not None:
            keys.update(raw_quota_keys(klass.resource_name))
        for tenant in ancestors:
            for key in keys:
                usage[(tenant, key)] = usage.get((tenant, key), 0) + claim.count
    return usage


def check_every_step(before: View, result: Plan) -> None:
    """Replay a pass's actions one at a time from the state it started from: after each,
    the node it placed claims on holds no more than its capacity, a move changed no budget
    key, and no budget key is over its limit unless it already was before the pass (a quota
    lowered under holds). The replay must end where the pass's updates say."""
    last: dict[ClaimKey, int] = {}
    for i, action in enumerate(result.actions):
        for key in action.claims:
            last[key] = i
    state = replace(before, claims=dict(before.claims))
    start_usage = budget_usage(state)
    for i, action in enumerate(result.actions):
        if action.step is Step.WAIT:
            continue
        usage_before = budget_usage(state)
        for key in action.claims:
            if last[key] == i:
                state.claims[key] = result.updates[key]
                continue
            claim = state.claims[key]
            if action.step is Step.LOSE:
                node = None if action.refusal is not None else claim.node
                state.claims[key] = replace(claim, phase=Phase.LOST, node=node)
            else:
                assert action.step in (Step.BIND, Step.MOVE, Step.REBIND), action
                state.claims[key] = replace(claim, phase=Phase.BOUND, node=action.node)
        usage = budget_usage(state)
        if action.step is Step.MOVE:
            assert usage == usage_before, f"a move changed a budget: {action}"
        for (tenant, key), units in usage.items():
            ns = state.namespaces.get(tenant)
            limit = ns.quota.get(key) if ns is not None else None
            if limit is not None and units > limit:
                assert units <= start_usage.get((tenant, key), 0), (
                    f"step {i} ({action.step}) puts {tenant} {key} at {units} of {limit}"
                )
        if action.node is not None and action.step is not Step.REATTACH:
            used = oracle_used(state)
            info = state.nodes[action.node]
            cap = info.capacity()
            for key in action.claims:
                klass = state.classes.get(state.claims[key].class_name)
                if klass is None:
                    continue
                res = klass.resource_name
                held = used.get((info.name, res), 0) + info.raw_used.get(res, 0)
                assert held <= cap.get(res, 0), f"step {i} ({action.step}) overfills {info.name}"
    for key, updated in result.updates.items():
        assert state.claims[key] == updated, f"the replay of {key} ends elsewhere"


def random_op(r: random.Random) -> Op:
    return (r.randrange(N_OPS), r.randrange(1000), r.randrange(1000), r.randrange(1000))


__all__ = [
    "Checker",
    "Op",
    "Refusal",
    "World",
    "check_every_step",
    "oracle_room",
    "random_op",
    "random_world",
]
