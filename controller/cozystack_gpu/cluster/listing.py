"""The binder's view of one listing, for those who judge without watching: the kubectl
plugin's what-if, the layout preview, tests of the binder's parts."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.model import Snapshot


def view_of_listing(
    listing: Mapping[str, Iterable[Mapping[str, Any]]], config: Config, now: float
) -> tuple[ClusterView, Snapshot]:
    """The binder's view of one listing of every kind it watches (by kind name), and the
    snapshot it would decide with at ``now``: for those who judge without watching (the
    kubectl plugin's what-if, the layout preview, tests of the binder's parts)."""
    kinds = keys.BINDER_WATCHES + tuple(k for k in keys.DRA_WATCHES if k.kind in listing)
    view = ClusterView(config, kinds)
    for kind in kinds:
        view.relist(kind.kind, [dict(o) for o in listing.get(kind.kind, ())])
    view.refresh_staleness(now)
    return view, view.build_snapshot(now)
