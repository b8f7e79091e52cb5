"""What one claim adds to a snapshot's counters: the rule in one place.

A claim counts against its tenant's budgets once (Bound, Attached, Lost), takes capacity on
its node while it holds it, and, while a live migration of its VMI runs (SPEC §12), on the
migration's target node as well. The snapshot keeps the ``Account`` it applied for each
claim, so taking the claim back takes back exactly what it added, and ``Snapshot.build`` of
the same claims counts what upserting them one by one counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from cozystack_gpu.keys import Phase
from cozystack_gpu.model.budgets import Charge, Ledger
from cozystack_gpu.model.eligibility import kept_by_volumes
from cozystack_gpu.model.types import ClaimInfo, ClassInfo, NodeInfo


class Account(NamedTuple):
    """What one claim added to the counters, so removing it takes back exactly that."""

    charge: Charge | None  # set when the claim counts against budgets
    resource: str | None
    node: str | None  # set when the claim takes capacity there
    units: int
    pinned: bool  # packing may not move it (attached, starting, template, window, Lost, disk)
    # A live migration's target node: the units count there too, pinned, budgets untouched.
    target: str | None = None


def account(
    claim: ClaimInfo,
    classes: Mapping[str, ClassInfo],
    ledger: Ledger,
    nodes: Mapping[str, NodeInfo],
) -> Account:
    """The counters ``claim`` adds, with its class's resource name, its namespace's
    ancestors (``ledger``) and its node's labels (for its VM's volumes) as they are now."""
    klass = classes.get(claim.class_name)
    res = klass.resource_name if klass is not None else None
    node = claim.node if claim.holds_node and res is not None else None
    target = claim.migrating_to if res is not None else None
    charge = None
    if claim.counts_budget:
        charge = Charge(ledger.ancestors(claim.namespace), claim.class_name, res, claim.count)
    pinned = (
        not (claim.phase is Phase.BOUND and claim.attached_to is None)
        or not claim.ordered
        or claim.migration is not None
        or (node is not None and kept_by_volumes(claim, nodes.get(node)))
    )
    return Account(charge, res, node, claim.count, pinned, target)
