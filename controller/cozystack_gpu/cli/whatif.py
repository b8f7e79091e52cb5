"""The hoster's what-if: the binder's own view and model, built from one listing.

A hoster reads every kind the binder watches; fed through the binder's ``ClusterView`` (the
same translation of API objects into model inputs the leader uses) this gives the snapshot
the binder would judge with, so ``check_order`` and packing's ``make_room`` answer here what
the binder's next pass would do. Pure: listings in, answers out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from cozystack_gpu.cluster.listing import view_of_listing
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import (
    ClaimInfo,
    ClaimKey,
    Placement,
    Refusal,
    Room,
    Snapshot,
    make_room,
    set_placement,
)
from cozystack_gpu.objects import Obj

# Objects per kind name (keys.ApiKind.kind), as listed; a kind left out counts as empty.
Listing = Mapping[str, Iterable[Obj]]


def build(listing: Listing, config: Config, now: float) -> tuple[ClusterView, Snapshot]:
    """The binder's view of ``listing`` and the snapshot it would decide with at ``now``."""
    return view_of_listing(listing, config, now)


@dataclass(frozen=True)
class NodeRow:
    """One node as a hoster sees it for one class: capacity, held, raw, free, and whether it
    takes the class now (and if not, why)."""

    node: str
    serves: bool
    why_not: str
    capacity: int
    held: int
    raw: int
    free: int
    short: int  # units the claim lacks there (0: it fits)
    rejected_until: float | None  # the claim skips the node until then

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "serves": self.serves,
            "whyNot": self.why_not or None,
            "capacity": self.capacity,
            "held": self.held,
            "raw": self.raw,
            "free": self.free,
            "short": self.short,
            "rejectedUntil": self.rejected_until,
        }


def node_rows(snap: Snapshot, claim: ClaimInfo, now: float) -> list[NodeRow]:
    """Every node with units of the class's resource name, or claims of the class, the
    closest first: serving nodes by fewest units short, then the others."""
    klass = snap.gpu_class(claim.class_name)
    if klass is None:
        return []
    res = klass.resource_name
    rejected = {r.node: r.until for r in claim.rejected if r.until > now}
    rows = []
    for node in snap.nodes():
        capacity = snap.capacity(node.name, res)
        holds = any(
            (c := snap.claim(k)) is not None and c.class_name == klass.name
            for k in snap.claims_on(node.name)
        )
        if capacity <= 0 and not holds:
            continue
        serves = snap.serves(node.name, klass.name)
        why = "" if serves else _why_not(snap, node.name, klass.name)
        free = snap.free(node.name, res)
        # The claim's own hold counts as free where it is: it would stay.
        own = claim.count if claim.holds_node and claim.node == node.name else 0
        rows.append(
            NodeRow(
                node=node.name,
                serves=serves,
                why_not=why,
                capacity=capacity,
                held=snap.used(node.name, res),
                raw=node.raw_used.get(res, 0),
                free=free,
                short=max(0, claim.count - free - own),
                rejected_until=rejected.get(node.name),
            )
        )
    rows.sort(key=lambda r: (not r.serves, r.rejected_until is not None, r.short, -r.free, r.node))
    return rows


def _why_not(snap: Snapshot, name: str, class_name: str) -> str:
    node = snap.node(name)
    klass = snap.gpu_class(class_name)
    assert node is not None and klass is not None
    why = snap.why_not_placeable(node, klass)
    if why:
        return why
    if not node.ready:
        return "not Ready"
    if node.unschedulable:
        return "cordoned"
    if node.inventory_stale:
        return "inventory stale"
    return "takes no new placements"


@dataclass(frozen=True)
class WhatIf:
    """What the model says of one claim now: where it would go, or why not, and what would
    make it fit (moves that free a node, a smaller count, another class)."""

    verdict: str  # "holds" | "fits" | "refused"
    node: str | None = None
    reason: str = ""
    message: str = ""
    moves: tuple[tuple[str, int, str, str], ...] = ()  # (claim, units, from, to)
    room_node: str | None = None
    smaller: tuple[int, str] | None = None  # the largest count that fits now, and where
    other_classes: tuple[tuple[str, str], ...] = ()  # (class, node) that take it now

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "node": self.node,
            "reason": self.reason or None,
            "message": self.message or None,
            "moves": [{"claim": c, "units": u, "from": f, "to": t} for c, u, f, t in self.moves],
            "roomOn": self.room_node,
            "smallerCount": None
            if self.smaller is None
            else {"count": self.smaller[0], "node": self.smaller[1]},
            "otherClasses": [{"class": c, "node": n} for c, n in self.other_classes],
        }


def what_if(snap: Snapshot, key: ClaimKey, now: float) -> WhatIf | None:
    """The model's answer for the claim ``key``; None when the snapshot lacks it."""
    claim = snap.claim(key)
    if claim is None:
        return None
    if claim.holds_node and claim.phase is not Phase.LOST:
        return WhatIf("holds", node=claim.node)
    decision = set_placement.check_order(snap, claim, now)
    if isinstance(decision, Placement):
        return WhatIf("fits", node=decision.node)
    moves: tuple[tuple[str, int, str, str], ...] = ()
    room_node = None
    refusal: Refusal = decision
    room = make_room(snap, claim, now, decision)
    if isinstance(room, Room):
        room_node = room.node
        moves = tuple(
            (str(k), _count(snap, k), m.from_node, m.to_node) for m in room.moves for k in m.claims
        )
    elif room is not None:
        refusal = room
    return WhatIf(
        "refused",
        reason=str(refusal.reason),
        message=refusal.message,
        moves=moves,
        room_node=room_node,
        smaller=_smaller(snap, claim, now),
        other_classes=_other_classes(snap, claim, now),
    )


def _count(snap: Snapshot, key: ClaimKey) -> int:
    held = snap.claim(key)
    return held.count if held is not None else 0


def _smaller(snap: Snapshot, claim: ClaimInfo, now: float) -> tuple[int, str] | None:
    for count in range(claim.count - 1, 0, -1):
        decision = set_placement.check_order(snap, replace(claim, count=count), now)
        if isinstance(decision, Placement):
            return count, decision.node
    return None


def _other_classes(snap: Snapshot, claim: ClaimInfo, now: float) -> tuple[tuple[str, str], ...]:
    found = []
    for klass in sorted(snap.classes(), key=lambda k: k.name):
        if klass.name == claim.class_name or klass.deleting:
            continue
        decision = set_placement.check_order(snap, replace(claim, class_name=klass.name), now)
        if isinstance(decision, Placement):
            found.append((klass.name, decision.node))
    return tuple(found)
