"""The binder's pass: from a snapshot, which claims change phase or node, and why.

Order of the pass, each step seeing the ones before it:

1. attached claims on a node that is gone or not Ready go Lost (their VMI may still run
   there, so they keep taking its capacity);
2. Lost claims whose VMI still runs on a node that is Ready again return to Attached;
3. unattached sets that must leave move (node gone, not Ready, no longer serving a class:
   selector, taint, layout change; or the node holds more than its capacity, in which case
   the most recently bound sets leave first), or go Lost where nowhere has room. A set
   whose VM has volumes bound to the node (a local disk) leaves only when the node is gone;
4. Lost claims rebind, as sets, oldest first;
5. unattached sets on a cordoned node move when every class of the set says
   ``onCordon: Move`` and another node has room (and their VM's disk is not there);
   otherwise they stay;
6. Pending orders bind, oldest first. One that does not fit waits and the next is tried,
   so a large order never holds up a smaller one behind it. One that does not fit only
   because free units are scattered gets room made first: at most ``max_moves``
   unattached holds move off one node (``packing``), each a Move whose ``why`` names the
   order, then the order binds there in the same pass.

Holds come before new orders (steps 3-5 before 6) because a tenant already has them.
A set with a live migration recorded (SPEC §12) moves neither in step 3 nor 5 nor for
packing until the migration ends; a Lost one whose VMI is gone rebinds without it.
Planning the result of a plan changes nothing more.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum

from cozystack_gpu.keys import OnCordon, Phase
from cozystack_gpu.model import set_placement
from cozystack_gpu.model.eligibility import kept_by_volumes
from cozystack_gpu.model.packing import MAX_MOVES, Room, make_room
from cozystack_gpu.model.snapshot import Snapshot
from cozystack_gpu.model.types import (
    ClaimInfo,
    ClaimKey,
    Decision,
    NodeInfo,
    OrderShape,
    Placement,
    Reason,
    Refusal,
)


class Step(StrEnum):
    BIND = "Bind"  # Pending -> Bound on ``node``
    MOVE = "Move"  # Bound, unattached -> Bound on ``node``, from ``from_node``
    LOSE = "Lose"  # Bound or Attached -> Lost
    REBIND = "Rebind"  # Lost -> Bound on ``node``
    REATTACH = "Reattach"  # Lost -> Attached on its node, which is Ready again
    WAIT = "Wait"  # no change; ``refusal`` says why


@dataclass(frozen=True, slots=True)
class Action:
    """One decision of a pass, over the claims of one set (or one claim)."""

    step: Step
    claims: tuple[ClaimKey, ...]
    node: str | None = None
    from_node: str | None = None
    why: str = ""
    refusal: Refusal | None = None
    # A bind that packing made room for: the moved claims, whose writes must succeed before
    # this one is sent (a move that fails leaves its hold where the order would go).
    after: tuple[ClaimKey, ...] = ()


@dataclass(frozen=True)
class Plan:
    """A pass's decisions in order, and each changed claim as its status should be written
    (``updates``; a claim changed twice in one pass appears once, in its last state).
    ``unjudged``: orders left for the next pass because this one bound ``max_binds``."""

    actions: tuple[Action, ...]
    updates: Mapping[ClaimKey, ClaimInfo]
    unjudged: int = 0

    @property
    def changes(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions if a.step is not Step.WAIT)


def plan(
    snapshot: Snapshot,
    now: float,
    *,
    max_moves: int = MAX_MOVES,
    max_binds: int | None = None,
) -> Plan:
    """The binder's pass over ``snapshot`` at time ``now``; the snapshot is left unchanged.

    After writing the statuses, feed ``result.updates`` back with ``upsert_claim`` (or let
    the watch events do it) so the next pass starts from them. ``max_moves`` bounds the
    holds packing may move for one order; 0 turns packing off. ``max_binds`` ends step 6
    after that many binds, leaving the younger orders unjudged (``Plan.unjudged``) for the
    next pass: binds only take room, so an order judged a pass later meets what it would
    have met, and the oldest orders' writes go out without waiting on the judgement of
    thousands behind them (a new leader's first pass).
    """
    planner = _Planner(snapshot, now, max_moves, max_binds)
    try:
        planner.run()
    finally:
        planner.revert()
    return Plan(tuple(planner.actions), dict(planner.updates), planner.unjudged)


def _on_its_disk(members: list[ClaimInfo], node: NodeInfo) -> bool:
    """The set's VM has volumes with node affinity usable from ``node`` (one VM's members
    share its volumes)."""
    return any(kept_by_volumes(c, node) for c in members)


def _arrival(claims: list[ClaimInfo]) -> tuple[float, str, str]:
    first = min(claims, key=lambda c: (c.created, c.namespace, c.name))
    return (first.created, first.namespace, first.name)


class _Planner:
    def __init__(
        self, snapshot: Snapshot, now: float, max_moves: int, max_binds: int | None = None
    ) -> None:
        self.snap = snapshot
        self.now = now
        self.max_moves = max_moves
        self.binds_left = max_binds
        self.unjudged = 0
        self.actions: list[Action] = []
        self.updates: dict[ClaimKey, ClaimInfo] = {}
        self._undo: list[tuple[ClaimKey, ClaimInfo]] = []
        # Orders bound by this pass (step 6), by key: where their Bind is in ``actions``.
        # Not written yet, so packing may place one elsewhere instead of moving it later.
        self._fresh_binds: dict[ClaimKey, int] = {}
        # Those alone in their set: a set's member moves only with the others, which would
        # take a Move written after its Bind, so it stays where this pass bound it.
        self._movable_fresh: set[ClaimKey] = set()

    def put(self, claim: ClaimInfo) -> None:
        old = self.snap.claim(claim.key)
        assert old is not None
        self._undo.append((claim.key, old))
        self.snap.upsert_claim(claim)
        self.updates[claim.key] = claim

    def revert(self) -> None:
        for _key, old in reversed(self._undo):
            self.snap.upsert_claim(old)
        self._undo.clear()

    def claims(self, keys: frozenset[ClaimKey] | set[ClaimKey]) -> list[ClaimInfo]:
        out = []
        for key in sorted(keys):
            claim = self.snap.claim(key)
            assert claim is not None
            out.append(claim)
        return out

    def run(self) -> None:
        unsettled = sorted(self.snap.unsettled_nodes())
        self.lose_attached(unsettled)
        self.reattach()
        self.move_mandatory(unsettled)
        self.rebind_lost()
        self.move_cordoned(unsettled)
        self.bind_pending()

    # 1
    def lose_attached(self, unsettled: list[str]) -> None:
        for name in unsettled:
            node = self.snap.node(name)
            if node is not None and node.ready:
                continue
            why = f"node {name} is gone" if node is None else f"node {name} is not Ready"
            by_vmi: dict[str, list[ClaimInfo]] = {}
            for claim in self.claims(self.snap.claims_on(name)):
                if claim.phase is Phase.ATTACHED:
                    by_vmi.setdefault(claim.attached_to or "", []).append(claim)
            for vmi in sorted(by_vmi):
                group = by_vmi[vmi]
                for claim in group:
                    self.put(replace(claim, phase=Phase.LOST))
                self.actions.append(
                    Action(Step.LOSE, tuple(c.key for c in group), from_node=name, why=why)
                )

    # 2
    def reattach(self) -> None:
        for claim in self.claims(self.snap.lost_keys()):
            if not (claim.attached_to and claim.vmi_live and claim.node):
                continue
            node = self.snap.node(claim.node)
            if node is None or not node.ready:
                continue
            self.put(replace(claim, phase=Phase.ATTACHED))
            self.actions.append(
                Action(
                    Step.REATTACH,
                    (claim.key,),
                    node=claim.node,
                    why=f"node {claim.node} is Ready again and VMI {claim.attached_to} runs there",
                )
            )

    def unattached_sets(self, name: str) -> dict[tuple[str, str], list[ClaimInfo]]:
        """The sets with Bound claims on the node, but those with a live migration recorded:
        its target holds units for them elsewhere, and they stay until it ends."""
        sets: dict[tuple[str, str], list[ClaimInfo]] = {}
        migrating: set[tuple[str, str]] = set()
        for claim in self.claims(self.snap.claims_on(name)):
            if claim.phase is Phase.BOUND:
                sets.setdefault(claim.set_key, []).append(claim)
        for set_key in sets:
            for key in self.snap.set_members(set_key):
                member = self.snap.claim(key)
                if member is not None and member.migration is not None:
                    migrating.add(set_key)
        return {k: v for k, v in sets.items() if k not in migrating}

    def must_leave(self, node: NodeInfo | None, name: str, members: list[ClaimInfo]) -> str | None:
        if node is None:
            return f"node {name} is gone"
        if _on_its_disk(members, node):
            return None  # its VM's disk is there: moved, its next start could not follow
        stay = False
        for claim in members:
            klass = self.snap.gpu_class(claim.class_name)
            if klass is None:
                continue
            why = self.snap.why_not_placeable(node, klass)
            if why is not None:
                return why
            stay = stay or klass.on_cordon is OnCordon.STAY
        # A Stay pin holds through NotReady; it only gives way to lost capacity.
        if not node.ready and not (node.unschedulable and stay):
            return f"node {name} is not Ready"
        return None

    # 3
    def move_mandatory(self, unsettled: list[str]) -> None:
        leaving: list[tuple[tuple[float, str, str], tuple[str, str], str, str]] = []
        for name in unsettled:
            node = self.snap.node(name)
            sets = self.unattached_sets(name)
            staying: dict[tuple[str, str], list[ClaimInfo]] = {}
            for set_key, members in sorted(sets.items()):
                why = self.must_leave(node, name, members)
                if why is not None:
                    leaving.append((_arrival(members), set_key, name, why))
                else:
                    staying[set_key] = members
            if node is None:
                continue
            excess = self.snap.over_capacity(name)
            for _arr, set_key, from_node, _why in leaving:
                if from_node != name:
                    continue
                for claim in sets[set_key]:
                    klass = self.snap.gpu_class(claim.class_name)
                    if klass is not None and klass.resource_name in excess:
                        excess[klass.resource_name] -= claim.count

            # The most recently bound sets give way first, so older holds keep their node.
            def latest(item: tuple[tuple[str, str], list[ClaimInfo]]) -> tuple[float, str]:
                members = item[1]
                return (max(c.bound_at or c.created for c in members), str(item[0]))

            for set_key, members in sorted(staying.items(), key=latest, reverse=True):
                if _on_its_disk(members, node):
                    continue  # the other sets give way; this one stays with its disk
                hit = False
                for claim in members:
                    klass = self.snap.gpu_class(claim.class_name)
                    if klass is not None and excess.get(klass.resource_name, 0) > 0:
                        hit = True
                if not hit:
                    continue
                names = sorted(r for r, e in excess.items() if e > 0)
                for claim in members:
                    klass = self.snap.gpu_class(claim.class_name)
                    if klass is not None and klass.resource_name in excess:
                        excess[klass.resource_name] -= claim.count
                why = f"node {name} has lost capacity for {', '.join(names)}"
                leaving.append((_arrival(members), set_key, name, why))
        for _arr, set_key, from_node, why in sorted(leaving):
            members = [
                c
                for c in self.claims(self.snap.set_members(set_key))
                if c.phase is Phase.BOUND and c.node == from_node
            ]
            if not members:
                continue
            decision = set_placement.place_set(self.snap, members, self.now, exclude=(from_node,))
            keys = tuple(c.key for c in members)
            if isinstance(decision, Placement):
                for claim in members:
                    self.put(replace(claim, node=decision.node, bound_at=self.now))
                self.actions.append(
                    Action(Step.MOVE, keys, node=decision.node, from_node=from_node, why=why)
                )
            else:
                for claim in members:
                    self.put(replace(claim, phase=Phase.LOST, node=None))
                self.actions.append(
                    Action(Step.LOSE, keys, from_node=from_node, why=why, refusal=decision)
                )

    # 4
    def rebind_lost(self) -> None:
        sets: dict[tuple[str, str], list[ClaimInfo]] = {}
        for claim in self.claims(self.snap.lost_keys()):
            if claim.attached_to and claim.vmi_live:
                self.actions.append(
                    Action(
                        Step.WAIT,
                        (claim.key,),
                        refusal=Refusal(
                            Reason.VMI_STILL_RUNNING,
                            f"VMI {claim.attached_to} may still run on node {claim.node}; "
                            "the claim rebinds once it is final or gone",
                        ),
                    )
                )
                continue
            sets.setdefault(claim.set_key, []).append(claim)
        for members in sorted(sets.values(), key=_arrival):
            decision = set_placement.place_set(self.snap, members, self.now)
            keys = tuple(c.key for c in members)
            if isinstance(decision, Placement):
                for claim in members:
                    self.put(
                        replace(
                            claim,
                            phase=Phase.BOUND,
                            node=decision.node,
                            bound_at=self.now,
                            attached_to=None,
                            vmi_live=False,
                            migration=None,  # its VMI is gone, and any migration with it
                        )
                    )
                self.actions.append(Action(Step.REBIND, keys, node=decision.node))
            else:
                self.actions.append(Action(Step.WAIT, keys, refusal=decision))

    # 5
    def move_cordoned(self, unsettled: list[str]) -> None:
        candidates: list[tuple[tuple[float, str, str], list[ClaimInfo], str]] = []
        for name in unsettled:
            node = self.snap.node(name)
            if node is None or not node.unschedulable or not node.ready:
                continue
            for members in self.unattached_sets(name).values():
                classes = [self.snap.gpu_class(c.class_name) for c in members]
                if any(k is None or k.on_cordon is not OnCordon.MOVE for k in classes):
                    continue
                if _on_its_disk(members, node):
                    continue
                candidates.append((_arrival(members), members, name))
        for _arr, members, name in sorted(candidates, key=lambda c: (c[0], c[2])):
            current = [self.snap.claim(c.key) for c in members]
            if any(c is None or c.phase is not Phase.BOUND or c.node != name for c in current):
                continue
            decision = set_placement.place_set(self.snap, members, self.now, exclude=(name,))
            if isinstance(decision, Placement):
                for claim in members:
                    self.put(replace(claim, node=decision.node, bound_at=self.now))
                self.actions.append(
                    Action(
                        Step.MOVE,
                        tuple(c.key for c in members),
                        node=decision.node,
                        from_node=name,
                        why=f"node {name} is cordoned",
                    )
                )

    # 6
    def bind_pending(self) -> None:
        # Packing moves holds, which can make room for an order judged earlier in the
        # round: judge the waiting orders again until a round moves nothing, so the pass
        # ends where planning its result changes nothing more. Each further round binds.
        while True:
            waits, packed = self.bind_round()
            if not packed or self.unjudged:
                self.actions.extend(waits)
                return

    def bind_round(self) -> tuple[list[Action], bool]:
        """Judge the waiting orders oldest first (by creation, then key).

        Within a round binds only take capacity and budget, so an order refused here
        refuses every later order of its shape (class, tenant and count) with the same
        words (a round that moves holds is followed by another). So the round walks the
        shapes' queues merged by age, judges a shape's orders until one is refused, and
        reports the rest of that queue as one Wait without looking at them: a pass costs
        what the shapes and the binds cost, not what the thousands waiting behind them
        would, so new orders that fit are not slowed by old ones that do not.
        """
        queues: list[tuple[OrderShape | None, list[tuple[float, ClaimKey]]]] = []
        # Each shape's keys, kept by the snapshot while its queue does not change: behind a
        # backlog, the refused shape is the same 10,000 orders pass after pass.
        keys_of: dict[int, tuple[ClaimKey, ...]] = {}
        for shape, entries, keys in self.snap.orders_by_shape():
            if shape is None:  # orders with rejected nodes: each is judged on its own
                queues.extend((None, [entry]) for entry in entries)
            else:
                keys_of[len(queues)] = keys
                queues.append((shape, entries))
        heads = [(entries[0], q, 0) for q, (_shape, entries) in enumerate(queues)]
        heapq.heapify(heads)
        refused: dict[int, tuple[int, Refusal]] = {}  # queue -> where its refusal is, why
        waits: list[Action] = []
        packed = False
        last_bind: tuple[float, ClaimKey] | None = None
        while heads and self.binds_left != 0:
            entry, q, at = heapq.heappop(heads)
            shape, entries = queues[q]
            claim = self._order(entry[1])
            if claim is not None:
                decision, after, moved = self._judge(claim)
                packed |= moved
                if isinstance(decision, Placement):
                    self._bind(claim, decision, after)
                    last_bind = entry
                elif shape is not None:
                    refused[q] = (at, decision)
                    continue  # the rest of this queue waits with it
                else:
                    waits.append(Action(Step.WAIT, (claim.key,), refusal=decision))
            if at + 1 < len(entries):
                heapq.heappush(heads, (entries[at + 1], q, at + 1))
        if self.binds_left == 0:
            # The orders younger than the last bind are left for the next pass.
            self.unjudged = sum(len(queues[q][1]) - at for _entry, q, at in heads)
        for q, (at, refusal) in refused.items():
            entries = queues[q][1]
            end = len(entries)
            if self.binds_left == 0 and last_bind is not None:
                end = bisect.bisect_right(entries, last_bind, lo=at)
                self.unjudged += len(entries) - end
            waits.append(Action(Step.WAIT, keys_of[q][at:end], refusal=refusal))
        return waits, packed

    def _judge(self, claim: ClaimInfo) -> tuple[Decision, tuple[ClaimKey, ...], bool]:
        """Whether the order fits, moving holds to make room where packing can; with the
        claims its bind must follow, and whether holds were moved."""
        decision = set_placement.check_order(self.snap, claim, self.now)
        if not isinstance(decision, Refusal):
            return decision, (), False
        room = make_room(
            self.snap,
            claim,
            self.now,
            decision,
            max_moves=self.max_moves,
            frozen=self.updates.keys() - self._movable_fresh,
        )
        if isinstance(room, Room):
            placement, after = self.make_room(claim, room)
            return placement, after, True
        return (decision if room is None else room), (), False

    def _bind(self, claim: ClaimInfo, placement: Placement, after: tuple[ClaimKey, ...]) -> None:
        key = claim.key
        self.put(replace(claim, phase=Phase.BOUND, node=placement.node, bound_at=self.now))
        if self.binds_left is not None:
            self.binds_left -= 1
        self._fresh_binds[key] = len(self.actions)
        if claim.set_id is None:
            self._movable_fresh.add(key)
        self.actions.append(Action(Step.BIND, (key,), node=placement.node, after=after))

    def _order(self, key: ClaimKey) -> ClaimInfo | None:
        """The claim if it is an order still waiting; a VM's template claim is placed with
        its set, by the gate, and a window's claim where its window is booked."""
        claim = self.snap.claim(key)
        if claim is None or not claim.ordered or claim.phase is not Phase.PENDING:
            return None
        return claim

    def make_room(self, order: ClaimInfo, room: Room) -> tuple[Placement, tuple[ClaimKey, ...]]:
        """Carry out packing's moves, then place the order on the node they freed; returns
        the placement and the moved claims whose writes its bind must follow. An order this
        pass bound is not moved but bound where the move would take it: nothing was
        written yet, and a bind followed by a move next pass would write it twice."""
        # The moved holds' tenants read this: it names no other tenant's order.
        why = f"makes room on node {room.node} for a larger order"
        after: list[ClaimKey] = []
        for move in room.moves:
            if self._rebind_fresh(move.claims, move.to_node):
                continue
            after.extend(move.claims)
            for key in move.claims:
                held = self.snap.claim(key)
                assert held is not None and held.node == move.from_node
                moved = replace(held, node=move.to_node, bound_at=self.now)
                # A move keeps what a claim is charged by, so no budget key can change.
                assert moved.counts_budget and (
                    moved.namespace,
                    moved.class_name,
                    moved.count,
                    moved.phase,
                ) == (held.namespace, held.class_name, held.count, held.phase)
                self.put(moved)
            self.actions.append(
                Action(Step.MOVE, move.claims, node=move.to_node, from_node=move.from_node, why=why)
            )
        decision = set_placement.check_order(self.snap, order, self.now, nodes=(room.node,))
        assert isinstance(decision, Placement), decision
        return decision, tuple(after)

    def _rebind_fresh(self, keys: tuple[ClaimKey, ...], node: str) -> bool:
        """Binds ``keys`` on ``node`` instead, when they are one order this pass bound."""
        (key,) = keys if len(keys) == 1 else (None,)
        if key is None or key not in self._fresh_binds:
            return False
        index = self._fresh_binds[key]
        bind = self.actions[index]
        held = self.snap.claim(key)
        assert bind.step is Step.BIND and bind.claims == keys and held is not None
        self.put(replace(held, node=node))
        self.actions[index] = replace(bind, node=node)
        return True
