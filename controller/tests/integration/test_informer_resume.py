"""A watch the API server ends (its timeout) goes on from the last version it delivered,
as client-go's reflector does, instead of listing the whole kind again.

Found reading the informer for issue 30's standby costs: every watch ended after
``WATCH_TIMEOUT_S`` (5 minutes) and each replica then listed and decoded every claim, pod
and node again, 50,000 claims every five minutes per replica at a hoster's size, and the
API server served each listing. Here the server ends the watch every second.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.cluster import informer as informer_module
from cozystack_gpu.cluster.informer import Event, EventType, Informer, source
from cozystack_gpu_testkit.objects import Kube

pytestmark = pytest.mark.apiserver


def test_a_watch_the_server_ends_resumes_without_listing_again_and_loses_nothing(
    api_client: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(informer_module, "WATCH_TIMEOUT_S", 1)
    kube = Kube(api_client)
    kube.claim(namespace, "before", "any-class")
    events: queue.Queue[Event] = queue.Queue()
    stop = threading.Event()
    feed = Informer(api_client, source(api_client, keys.GPU_CLAIM), events, stop)
    seen: list[Event] = []

    def take_until(done: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            try:
                seen.append(events.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                raise AssertionError(f"{what}: the informer delivered {seen}") from None

    def named(kind: EventType, name: str) -> bool:
        return any(
            e.type is kind and e.obj is not None and e.obj["metadata"]["name"] == name
            and e.obj["metadata"]["namespace"] == namespace
            for e in seen
        )  # fmt: skip

    feed.start()
    try:
        take_until(lambda: bool(seen), 30, "the first listing")
        # Past several of the server's watch timeouts, each write after another end.
        for n in range(4):
            time.sleep(1.2)
            kube.claim(namespace, f"after-{n}", "any-class")
        take_until(lambda: all(named(EventType.ADDED, f"after-{n}") for n in range(4)), 30,
                   "every claim created across the watch's ends")  # fmt: skip
    finally:
        stop.set()
        feed.join(5)
    listings = [e for e in seen if e.type is EventType.LISTED]
    assert len(listings) == 1, f"{len(listings)} listings: the kind was listed again"
    assert any(o["metadata"]["name"] == "before" for o in listings[0].objects)
    added = [e.obj["metadata"]["name"] for e in seen if e.type is EventType.ADDED and e.obj]
    assert sorted(n for n in added if n.startswith("after-")) == [f"after-{n}" for n in range(4)]
