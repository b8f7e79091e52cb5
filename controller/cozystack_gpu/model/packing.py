"""Making room for a large order: move unattached holds off one node so that the order fits.

Best fit keeps whole nodes free for as long as it can, but releases scatter free units: a
class can have 40 free units and no node with 8. When an order is refused only for that
reason, ``make_room`` looks for one node to free. It moves sets of holds off that node, each
move a normal placement of the set (``set_placement.place_set``: another node, serving every
class of the set, with the units, not among the set's rejected nodes), at most
``max_moves`` claims in all. The binder writes each move as it writes any bind, checked by
resourceVersion, so a hold that changed meanwhile is not moved.

What may move: a set whose every member is Bound on the node being freed, has no
attachment recorded (a VMI may be starting with it), is no template claim (its launcher pod
is pinned to that node) nor a window's claim (its window is booked there), has no VM
volume bound to that node (a stopped VM's local disk: its next start can only be there),
has no live migration recorded (its target holds units elsewhere until the migration ends)
and was not changed earlier in the same pass. Attached claims never move.

Budgets: a move keeps every claim's namespace, class and count, and a Bound claim counts
against its budgets wherever it is, so a move changes no budget key (the planner asserts
it for every move it records). Moves only leave the node being freed and only arrive on
nodes with room, so capacity holds after each one, in any order.

Search: the serving nodes large enough and not rejected by the order are tried from the
most free units down, skipping at once those where units no move may take are too many
(``Snapshot.pinned``). On each, a lower bound on the claims that must move ignores where
they would go; then the choices of sets with the fewest moves come first, each checked by
placing its sets one by one, largest first, backtracking over destinations. After the first
plan, ``WINDOW`` more nodes are tried for one with fewer moves. At most ``MAX_LOOKED``
claims looked at and ``MAX_TRIES`` steps per order: on small clusters the search is
exhaustive (the model tests compare it with a brute-force oracle), on large ones it stops
early rather than slow the pass.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

from cozystack_gpu.keys import Phase
from cozystack_gpu.model import set_placement
from cozystack_gpu.model.eligibility import kept_by_volumes
from cozystack_gpu.model.snapshot import Snapshot
from cozystack_gpu.model.types import ClaimInfo, ClaimKey, NodeInfo, Placement, Reason, Refusal

MAX_MOVES = 8  # claims moved per order: each is one status write before the order binds
MAX_LOOKED = 4_096  # claims on the nodes looked at per order, most free units first
MAX_TRIES = 2_000  # search steps per order (choices built and placements tried)
WINDOW = 8  # nodes looked at after the first plan, for one with fewer moves

Shape = tuple[tuple[tuple[str, int], ...], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Move:
    """One set of holds leaving the node being freed."""

    claims: tuple[ClaimKey, ...]
    from_node: str
    to_node: str


@dataclass(frozen=True, slots=True)
class Room:
    """A node freed for an order, and the moves that free it, in the order made."""

    node: str
    moves: tuple[Move, ...]

    @property
    def claims_moved(self) -> int:
        return sum(len(m.claims) for m in self.moves)


class _Set(NamedTuple):
    members: tuple[ClaimInfo, ...]
    units: int  # of the order's resource name, freed on the node when the set leaves
    shape: Shape  # sets of one shape are interchangeable wherever they go
    latest: float  # the last bind of a member: the most recent give way first


def make_room(
    snap: Snapshot,
    order: ClaimInfo,
    now: float,
    refusal: Refusal,
    *,
    max_moves: int = MAX_MOVES,
    frozen: Collection[ClaimKey] = (),
) -> Room | Refusal | None:
    """Moves that free one node for ``order``, refused by ``check_order`` with ``refusal``.

    None when moves cannot help: the refusal is not for capacity, no node is large enough,
    or the class lacks the free units in all (the plain refusal then stands). A refusal
    (``CapacityFragmented``) when the units are there, scattered, and no plan of at most
    ``max_moves`` moves frees a node. ``frozen`` claims do not move (changed earlier in the
    pass). The snapshot is left unchanged.
    """
    if max_moves <= 0 or refusal.reason is not Reason.INSUFFICIENT_CAPACITY:
        return None
    klass = snap.gpu_class(order.class_name)
    if klass is None:
        return None
    need = order.count
    total = snap.class_status(klass.name).free
    if total < need or snap.largest_capacity(klass.name) < need:
        return None
    res = klass.resource_name
    skip = {r.node for r in order.rejected if r.until > now}
    frozen_keys = frozenset(frozen)
    held = 0  # nodes whose units no move may take keep them from being freed
    costly = 0  # nodes that would take more than max_moves moves
    nowhere = 0  # nodes whose holds to move find no other node with room
    search = _Search(snap, now)
    best: Room | None = None
    since_best = 0
    try:
        # The search changes the snapshot and undoes it before the next node is read.
        for name, free in snap.serving_by_free(klass.name):
            room = _room(snap, name, res) - snap.held_back(name, res)
            if name in skip or room < need:
                continue
            if room - snap.pinned(name, res) < need:
                held += 1
                continue
            if best is not None:
                if best.claims_moved <= 1 or since_best >= WINDOW:
                    break
                since_best += 1
            if not search.look(len(snap.claims_on(name))):
                break
            limit = max_moves if best is None else best.claims_moved - 1
            sets = _movable_sets(snap, name, res, now, frozen_keys)
            short = need - free
            if sum(s.units for s in sets) < short:
                held += 1  # some of its holds changed earlier in this pass
                continue
            bound = _fewest_moves(sets, short, limit)
            if bound is None:
                costly += 1
                continue
            moves = search.free_node(name, sets, short, bound, limit)
            if moves is not None:
                best = Room(name, moves)
            else:
                nowhere += 1
            if search.cut:
                break
    finally:
        search.rollback(0)
    if best is not None:
        return best
    if not (held or costly or nowhere or search.cut):
        return None  # no node large enough apart from those the order rejected
    return Refusal(
        Reason.CAPACITY_FRAGMENTED,
        f"{refusal.message}; class {klass.name} has {total} free units in all, but no plan "
        f"of at most {max_moves} moves of unattached holds frees a node for it: "
        + _why_not(held, costly, nowhere, search.cut),
    )


def _why_not(held: int, costly: int, nowhere: int, cut: bool) -> str:
    parts = []
    if held:
        parts.append(
            f"on {_nodes(held)} attached claims, those of starting VMs or of VMs whose disk "
            "is there hold the units"
        )
    if costly:
        parts.append(f"on {_nodes(costly)} it takes more than that many moves")
    if nowhere:
        parts.append(f"on {_nodes(nowhere)} the holds to move have nowhere else to go")
    if cut:
        parts.append(
            f"the search stopped there (at most {MAX_LOOKED} claims looked at and "
            f"{MAX_TRIES} placements tried per order), from the nodes with the most free units"
        )
    return "; ".join(parts)


def _nodes(n: int) -> str:
    return "1 node" if n == 1 else f"{n} nodes"


def _room(snap: Snapshot, node: str, res: str) -> int:
    """The most free units the node could have with every claim gone."""
    info = snap.node(node)
    raw = info.raw_used.get(res, 0) if info is not None else 0
    return snap.capacity(node, res) - raw


def may_move(claim: ClaimInfo, node: NodeInfo | None, frozen: Collection[ClaimKey]) -> bool:
    """An unattached hold on ``node`` that packing may move (see the module's rules)."""
    return (
        node is not None
        and claim.phase is Phase.BOUND
        and claim.node == node.name
        and claim.attached_to is None
        and claim.ordered
        and claim.migration is None
        and not kept_by_volumes(claim, node)
        and claim.key not in frozen
    )


def _movable_sets(
    snap: Snapshot, node: str, res: str, now: float, frozen: frozenset[ClaimKey]
) -> list[_Set]:
    """The sets on the node that may move and free units of ``res`` there."""
    out: list[_Set] = []
    seen: set[tuple[str, str]] = set()
    info = snap.node(node)
    for key in snap.claims_on(node):
        claim = snap.claim(key)
        if claim is None or not may_move(claim, info, frozen) or claim.set_key in seen:
            continue
        members: tuple[ClaimInfo, ...] = (claim,)
        if claim.set_id is not None:
            seen.add(claim.set_key)
            found = [snap.claim(k) for k in sorted(snap.set_members(claim.set_key))]
            if any(m is None or not may_move(m, info, frozen) for m in found):
                continue
            members = tuple(m for m in found if m is not None)
        units = 0
        for member in members:
            klass = snap.gpu_class(member.class_name)
            if klass is None:
                break
            if klass.resource_name == res:
                units += member.count
        else:
            if units:
                rejected = {r.node for m in members for r in m.rejected if r.until > now}
                shape = (tuple(sorted((m.class_name, m.count) for m in members)),
                         tuple(sorted(rejected)))  # fmt: skip
                latest = max(m.bound_at or m.created for m in members)
                out.append(_Set(members, units, shape, latest))
    # Within a shape the most recently bound give way first, so older holds keep their node.
    out.sort(key=lambda s: (s.shape, -s.latest, s.members[0].key))
    return out


def _fewest_moves(sets: list[_Set], short: int, max_moves: int) -> int | None:
    """The fewest claims that, moved, free ``short`` units (where they go aside), or None
    beyond ``max_moves``: a 0/1 knapsack over moves."""
    most = [0] * (max_moves + 1)  # most units freed by at most k claims moved
    for s in sets:
        weight = len(s.members)
        for k in range(max_moves, weight - 1, -1):
            most[k] = max(most[k], most[k - weight] + s.units)
    for k, units in enumerate(most):
        if units >= short:
            return k
    return None


class _Search:
    """Tries choices of sets to move and places them, changing the snapshot as it goes and
    undoing every change (``rollback``) before ``make_room`` returns."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap = snap
        self.now = now
        self.tries = MAX_TRIES
        self.looked = MAX_LOOKED
        self.cut = False
        self.undo: list[ClaimInfo] = []

    def look(self, claims: int) -> bool:
        """Count the claims of one more node against the budget."""
        if self.looked < claims:
            self.cut = True
            return False
        self.looked -= claims
        return True

    def spend(self) -> bool:
        if self.tries <= 0:
            self.cut = True
            return False
        self.tries -= 1
        return True

    def rollback(self, mark: int) -> None:
        while len(self.undo) > mark:
            self.snap.upsert_claim(self.undo.pop())

    def free_node(
        self, node: str, sets: list[_Set], short: int, first: int, limit: int
    ) -> tuple[Move, ...] | None:
        """The first choice of sets, fewest moves first, that frees ``short`` units on the
        node and finds each set a place elsewhere."""
        groups: dict[Shape, list[_Set]] = {}
        for s in sets:
            groups.setdefault(s.shape, []).append(s)
        ordered = sorted(groups.values(), key=lambda g: (-g[0].units, g[0].shape))
        for moves in range(first, limit + 1):
            for choice in self._choices(ordered, short, moves):
                placed = self._place(node, choice)
                if placed is not None:
                    return placed
                if self.cut:
                    return None
        return None

    def _choices(self, groups: list[list[_Set]], short: int, moves: int) -> Iterator[list[_Set]]:
        """Choices of sets with exactly ``moves`` claims that free at least ``short`` units
        and none of whose sets could be left out; groups of big sets first."""
        reach = [0] * (len(groups) + 1)  # units every group from i on could free
        for i in range(len(groups) - 1, -1, -1):
            reach[i] = reach[i + 1] + sum(s.units for s in groups[i])
        picked: list[tuple[int, int]] = []  # (group, how many of it)

        def walk(i: int, left: int, units: int) -> Iterator[list[_Set]]:
            if not self.spend():
                return
            if left == 0:
                if units >= short and all(
                    units - groups[g][0].units < short for g, _size in picked
                ):
                    yield [s for g, n in picked for s in groups[g][:n]]
                return
            if i == len(groups) or units + reach[i] < short:
                return
            weight = len(groups[i][0].members)
            for n in range(min(len(groups[i]), left // weight), -1, -1):
                if n:
                    picked.append((i, n))
                yield from walk(i + 1, left - n * weight, units + n * groups[i][0].units)
                if n:
                    picked.pop()

        yield from walk(0, moves, 0)

    def _place(self, node: str, choice: list[_Set]) -> tuple[Move, ...] | None:
        """Each set of the choice on another node, backtracking over destinations; None
        when some set has nowhere to go whatever the others do."""
        todo = sorted(choice, key=lambda s: (-s.units, s.shape))
        failed: set[tuple[int, tuple[tuple[Shape, str], ...]]] = set()
        placed: list[tuple[Shape, str]] = []
        moves: list[Move] = []
        start = len(self.undo)

        def place(i: int) -> bool:
            if i == len(todo):
                return True
            state = (i, tuple(sorted(placed)))
            if state in failed:
                return False
            current = todo[i]
            tried = {node}
            while self.spend():
                decision = set_placement.place_set(
                    self.snap, current.members, self.now, exclude=tried
                )
                if not isinstance(decision, Placement):
                    break
                mark = len(self.undo)
                for claim in current.members:
                    self.undo.append(claim)
                    self.snap.upsert_claim(replace(claim, node=decision.node, bound_at=self.now))
                placed.append((current.shape, decision.node))
                moves.append(Move(tuple(c.key for c in current.members), node, decision.node))
                if place(i + 1):
                    return True
                placed.pop()
                moves.pop()
                self.rollback(mark)
                tried.add(decision.node)
            if not self.cut:
                failed.add(state)
            return False

        found = place(0)
        self.rollback(start)
        return tuple(moves) if found else None
