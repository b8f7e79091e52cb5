"""One cache per process on the real API server: a replica wired as ``__main__`` wires it
(the admission feed, the binder and the licence copier on one ``SharedInformers``) lists
each kind once, binds from it, judges orders in the webhook as its binder does, and a
binder started again on a Lease won back starts from the cache, with no listing at all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import Corner

from cozystack_gpu import keys
from cozystack_gpu.admission import handlers as admission
from cozystack_gpu.cluster import informer as informer_module
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.controller import Controller
from cozystack_gpu.model import ClaimInfo, set_placement
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import binder_config, wait_for

pytestmark = pytest.mark.apiserver


@pytest.fixture
def listings(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every listing an informer of this process sends to the API server, by kind."""
    counted: Counter[str] = Counter()
    real = informer_module.Informer._list

    def counting(self: informer_module.Informer) -> str:
        counted[self._source.kind] += 1
        return real(self)

    monkeypatch.setattr(informer_module.Informer, "_list", counting)
    return counted


@pytest.fixture
def replica(
    control_plane: ControlPlane, corner: Corner, listings: Counter[str]
) -> Iterator[dict[str, Any]]:
    """Wired as __main__ wires one (the listings counted from before its start)."""
    config = binder_config(corner.controller_ns, identity="one-cache")
    cache = SharedInformers(control_plane.api_client())
    cache.start()
    controller = Controller(control_plane.api_client(), config, cache)
    webhooks = admission.build(control_plane.api_client(), config, informers=cache)
    controller.start()
    webhooks.feed.start()
    try:
        yield {"controller": controller, "feed": webhooks.feed, "cache": cache}
    finally:
        controller.stop()
        webhooks.stop()
        cache.stop()


def test_a_replica_lists_each_kind_once_and_a_new_leadership_lists_nothing(
    corner: Corner, replica: dict[str, Any], listings: Counter[str]
) -> None:
    controller: Controller = replica["controller"]
    feed = replica["feed"]
    corner.nodes(2, 2)
    gpu_class = corner.gpu_class()
    corner.kube.claim(corner.tenant, "first", gpu_class, 1)
    wait_for(lambda: corner.phase("first") == "Bound", 30, "the first bind")
    wait_for(feed.synced.is_set, 30, "the feed's snapshot")

    watched = {k.kind for k in keys.BINDER_WATCHES}
    assert watched <= set(listings), listings
    twice = {kind: n for kind, n in listings.items() if n != 1}
    assert not twice, f"listed more than once by one process: {twice}"

    # The webhook's snapshot and the binder's judge an order alike, from the same events.
    binder = controller.binder
    assert binder is not None
    order = ClaimInfo(corner.tenant, "probe", gpu_class, 4)
    now = binder.clock()
    wait_for(
        lambda: (
            feed.check_order(order, now) == set_placement.check_order(binder.snapshot, order, now)
        ),
        15,
        "the feed and the binder to agree",
    )

    # The Lease lost: the binder stops, the licence copier's Secrets are watched no more,
    # and a fresh standby binder starts from the cache, listing none of the kinds the feed
    # reads (usage records, read by no one meanwhile, are listed afresh). Won back, it binds.
    before = Counter(listings)
    controller._stop_binding()
    standby = controller.binder
    assert standby is not None and standby is not binder, "no fresh standby binder"
    assert replica["cache"].watched() == watched | {keys.WORKLOAD.kind}, (
        "the copier's Secrets are still watched, or the standby watches less than a binder"
    )
    controller._start_binding()
    assert controller.binder is standby, "the standby was not the binder that leads"
    corner.kube.claim(corner.tenant, "second", gpu_class, 1)
    wait_for(lambda: corner.phase("second") == "Bound", 30, "a bind by the next binder")
    again = {
        kind: listings[kind] - before[kind] for kind in watched if listings[kind] != before[kind]
    }
    assert not again, f"the next binder listed again: {again}"
