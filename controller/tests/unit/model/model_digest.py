"""Every number a snapshot derives, read through its public queries, in plain sorted form.

Two snapshots of the same objects must have equal digests however they were built (one
event at a time, or ``Snapshot.build``); the incremental-equals-rebuild tests compare them.
"""

from __future__ import annotations

from typing import Any

from cozystack_gpu.keys import QUOTA_KEY_TOTAL, quota_key, raw_quota_keys
from cozystack_gpu.model import Snapshot


def digest(snap: Snapshot) -> dict[str, Any]:
    nodes = sorted(n.name for n in snap.nodes())
    classes = sorted(snap.classes(), key=lambda c: c.name)
    claims = list(snap.claims())
    resources = sorted({c.resource_name for c in classes})
    # Claims may name nodes the snapshot no longer has (their own or their migration's
    # target); their counters still exist.
    named = sorted(
        set(nodes)
        | {c.node for c in claims if c.node}
        | {c.migration.node for c in claims if c.migration}
    )
    serving = {c.name: [n for n in nodes if snap.serves(n, c.name)] for c in classes}
    tenants: set[str] = {c.namespace for c in claims}
    for ns in snap.namespaces():
        tenants |= ns.ancestors
    budget_keys = [QUOTA_KEY_TOTAL]
    budget_keys += sorted(
        {quota_key(c.class_name) for c in claims} | {quota_key(c.name) for c in classes}
    )
    raw_names = set(resources)
    for ns in snap.namespaces():
        raw_names |= set(ns.raw_used)
    for name in sorted(raw_names):
        budget_keys += list(raw_quota_keys(name))
    return {
        "free": {
            c.name: [(n, snap.free(n, c.resource_name)) for n in serving[c.name]] for c in classes
        },
        "cap": {
            c.name: [(n, snap.capacity(n, c.resource_name)) for n in serving[c.name]]
            for c in classes
        },
        "status": {c.name: snap.class_status(c.name) for c in classes},
        "holds": {c.name: snap.holds_of_class(c.name) for c in classes},
        "max_count": {c.name: snap.max_count(c.name) for c in classes},
        "used": {n: [(r, snap.used(n, r)) for r in resources if snap.used(n, r)] for n in named},
        "pinned": {
            n: [(r, snap.pinned(n, r)) for r in resources if snap.pinned(n, r)] for n in named
        },
        "budgets": {
            t: [(k, snap.budget_used(t, k)) for k in budget_keys if snap.budget_used(t, k)]
            for t in sorted(tenants)
        },
        "pending": sorted(snap.pending_keys()),
        "lost": sorted(snap.lost_keys()),
        "node_claims": {n: sorted(snap.claims_on(n)) for n in named if snap.claims_on(n)},
        "sets": {str(s): sorted(snap.set_members(s)) for s in sorted({c.set_key for c in claims})},
        "unsettled": sorted(snap.unsettled_nodes()),
    }
