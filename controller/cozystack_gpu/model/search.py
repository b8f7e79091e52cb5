"""Node search: the best-fit node for a set's demand per class, or why there is none.

Best fit packs: among the nodes that serve every class of the set and have room, take the
one with the fewest free units of the set's largest class (ties by name), so whole nodes
stay free for large sets. A set that already holds units on one node counts them as free
there, so it keeps its node when the node still takes it. The per-class indexes
(``ClassIndex``) make this a walk over distinct free values, not over nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from cozystack_gpu.model._index import ClassIndex
from cozystack_gpu.model.types import (
    ClaimInfo,
    ClassInfo,
    Decision,
    Placement,
    Reason,
    Refusal,
)


# one piece: the placement search's hot path; its closures share the tables it builds
def find_node(
    classes: Mapping[str, ClassInfo],
    indexes: Mapping[str, ClassIndex],
    demand: dict[str, int],
    claims: Sequence[ClaimInfo],
    now: float,
    nodes: Collection[str] | None,
    exclude: Collection[str],
) -> Decision:
    """The best-fit node for ``demand`` (units per class), or a refusal naming what is
    missing. ``claims`` are the set's members (their held units count as free where they
    are, their rejected nodes are skipped until ``until``); ``nodes`` limits the choice and
    ``exclude`` leaves nodes out."""
    res_of = {name: classes[name].resource_name for name in demand}
    by_res: dict[str, str] = {}
    for name in sorted(demand):
        other = by_res.setdefault(res_of[name], name)
        if other != name:
            return Refusal(
                Reason.NO_NODE_SERVES,
                f"classes {other} and {name} share resource name {res_of[name]}, "
                "so no node serves both",
            )
    skip = {r.node for c in claims for r in c.rejected if r.until > now}
    skip.update(exclude)
    credit: dict[str, dict[str, int]] = {}
    for claim in claims:
        if claim.holds_node and claim.node is not None:
            row = credit.setdefault(claim.node, {})
            res = res_of[claim.class_name]
            row[res] = row.get(res, 0) + claim.count
    order = sorted(demand, key=lambda n: (-demand[n], n))
    primary = order[0]
    pidx = indexes[primary]
    pres = res_of[primary]
    pneed = demand[primary]
    others = [(indexes[n], demand[n], res_of[n]) for n in order[1:]]
    allowed = None if nodes is None else set(nodes)

    def fits_others(node: str) -> bool:
        row = credit.get(node)
        for idx, need, res in others:
            free = idx.free.get(node)
            if free is None or free + (row.get(res, 0) if row else 0) < need:
                return False
        return True

    def usable(node: str) -> bool:
        return node not in skip and (allowed is None or node in allowed)

    best: tuple[int, str] | None = None
    for node in sorted(credit):
        free = pidx.free.get(node)
        if free is None or not usable(node):
            continue
        free += credit[node].get(pres, 0)
        if free >= pneed and fits_others(node):
            if len(credit) == 1:
                return Placement(node)
            if best is None or (free, node) < best:
                best = (free, node)
    if allowed is not None:
        for node in allowed:
            free = pidx.free.get(node)
            if free is None or free < pneed or node in skip or node in credit:
                continue
            if others and not fits_others(node):
                continue
            if best is None or (free, node) < best:
                best = (free, node)
    else:
        accept: Callable[[str], bool] | None = None
        if skip or credit or others:

            def accept(node: str) -> bool:
                return node not in skip and node not in credit and fits_others(node)

        found = pidx.best(pneed, accept)
        if found is not None and (best is None or (pidx.free[found], found) < best):
            best = (pidx.free[found], found)
    if best is not None:
        return Placement(best[1])
    return capacity_refusal(indexes, order, demand, skip, allowed)


def capacity_refusal(
    indexes: Mapping[str, ClassIndex],
    order: list[str],
    demand: dict[str, int],
    skip: set[str],
    allowed: set[str] | None,
) -> Refusal:
    """Why no node takes the demand: no serving node at all, or none with room (naming the
    most free units one node has, for a single class). Nodes are counted, never named: the
    tenant reads this and cannot read nodes."""
    where = ""
    if allowed is not None:
        where += " among the nodes the VM may use"
    if skip:
        # Nodes that refused the set's launcher pod, or that the set must leave.
        where += f" (apart from {len(skip)} node{'' if len(skip) == 1 else 's'} its claims skip)"

    def usable(node: str) -> bool:
        return node not in skip and (allowed is None or node in allowed)

    pidx = indexes[order[0]]
    if len(order) == 1:
        if allowed is not None:
            frees = [pidx.free[n] for n in allowed if n in pidx.free and usable(n)]
            largest = max(frees) if frees else None
        else:
            largest = pidx.largest(usable if skip else None)
        # Serving nodes that advertise no units of the class serve nothing: say so.
        if largest is None or (largest == 0 and pidx.max_cap() == 0):
            return Refusal(Reason.NO_NODE_SERVES, f"no node serves class {order[0]}{where}")
        return Refusal(
            Reason.INSUFFICIENT_CAPACITY,
            f"no node serving class {order[0]}{where} has {demand[order[0]]} free "
            f"{'unit' if demand[order[0]] == 1 else 'units'}; "
            f"the largest has {largest}",
        )
    names = sorted(order)
    idxs = [indexes[n] for n in names]
    smallest = min(idxs, key=len)
    if not any(usable(n) and all(n in i for i in idxs) for n in smallest.free):
        return Refusal(
            Reason.NO_NODE_SERVES,
            f"no node serves every class of the set ({', '.join(names)}){where}",
        )
    wanted = ", ".join(f"{n}: {demand[n]}" for n in names)
    return Refusal(
        Reason.INSUFFICIENT_CAPACITY,
        f"no node serving classes {', '.join(names)}{where} has room for the set ({wanted})",
    )
