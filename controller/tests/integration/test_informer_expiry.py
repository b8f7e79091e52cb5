"""A watch that expires (410 Gone) is listed again at once, as an expiry.

The API server answers a watch from a compacted resourceVersion with an ERROR event (410
Gone) inside the stream. Found by the fault suite: the client's watch read that event with
``deserialize=False`` as a KeyError ('raw_object'), so the informer took it for a broken
stream, logged a traceback and waited its retry delay before listing again.

The plane here has no watch cache (watches go to etcd, as for any resource without one),
the informer reaches it through a proxy that delays every chunk, and etcd is compacted
while the informer lists: its watch from the listing's resourceVersion is too old.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid
from collections.abc import Iterator

import pytest

from cozystack_gpu import keys
from cozystack_gpu.cluster import informer as informer_module
from cozystack_gpu.cluster.informer import Event, EventType, Informer, source
from cozystack_gpu_testkit import cluster, faults
from cozystack_gpu_testkit.objects import Kube, wait_for
from cozystack_gpu_testkit.proxy import Proxy

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def uncached_plane() -> Iterator[cluster.ControlPlane]:
    plane = cluster.start(
        crds=sorted(cluster.CRD_DIR.glob("*.yaml")), extra_apiserver_args=("--watch-cache=false",)
    )
    try:
        yield plane
    finally:
        plane.stop()


def test_a_watch_from_a_compacted_version_is_listed_again_at_once(
    uncached_plane: cluster.ControlPlane,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A broken stream waits this long before listing again; an expiry must not.
    monkeypatch.setattr(informer_module, "RETRY_DELAY_S", 120.0)
    kube = Kube(uncached_plane.api_client())
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    kube.namespace(namespace)
    port = int(uncached_plane.server.rsplit(":", 1)[1])
    events: queue.Queue[Event] = queue.Queue()
    listings: list[Event] = []
    stop, churned = threading.Event(), threading.Event()

    def churn() -> None:
        """Writes and compactions, so a watch that starts late starts too old."""
        n = 0
        while not churned.wait(0.1):
            n += 1
            kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": f"c{n}"}})
            faults.compact(uncached_plane)

    with Proxy(("127.0.0.1", port)) as proxy, proxy.slowed(0.3):
        api = uncached_plane.api_client()
        api.configuration.host = f"https://{proxy.address}"
        feed = Informer(api, source(api, keys.GPU_CLAIM), events, stop)
        writer = threading.Thread(target=churn, daemon=True)
        writer.start()
        caplog.set_level(logging.INFO, logger="cozystack_gpu.cluster.informer")
        feed.start()
        try:

            def listed_twice() -> bool:
                while not events.empty():
                    event = events.get()
                    if event.type is EventType.LISTED:
                        listings.append(event)
                return len(listings) >= 2

            wait_for(listed_twice, 20, "a second listing after the watch expired")
        finally:
            churned.set()
            stop.set()
            feed.join(5)
            writer.join(5)
    messages = [r.getMessage() for r in caplog.records]
    assert f"watch of {keys.KIND_CLAIM} expired; listing again" in messages, messages
    assert not [m for m in messages if "broke" in m], messages
