"""Every replica's read-only model snapshot, fed by its own watches, for the claim webhook.

The binder keeps its snapshot in the leader only, and a webhook must answer in every
replica, so each replica keeps one of its own, built the binder's way: the same watched
kinds (``keys.BINDER_WATCHES``), the same ``ClusterView`` turning objects into model
inputs, the same ``Snapshot``. The objects come from the process's one cache
(``cluster.informer.SharedInformers``), the very dicts the binder's view holds in the
leader, so the two views read the same fields of the same events. It never decides a
bind, so it needs no writer and takes none of the binder's own writes into account: a
lagging view admits at worst an order the binder then keeps Pending with its reason.

One thread applies the watch events to the view and the view's changes to the snapshot;
the webhook reads the snapshot from kopf's worker threads. ``check_order`` is a read, but
the snapshot refreshes lazy indexes while it answers, so both sides hold one lock. Each
hold is short: events are applied to the view outside it, and one sync covers at most
``MAX_BATCH`` events.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.cluster.informer import (
    Event,
    SharedInformers,
    WatchedThread,
    Watcher,
    source,
    take,
)
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.model import ClaimInfo, Decision, Snapshot, set_placement

log = logging.getLogger(__name__)

MAX_BATCH = 2000
STALENESS_EVERY_S = 1.0  # node agent reports age with time, not with events
BUILD_POLL_S = 0.1  # how often a first build waiting on ``build_after`` asks again


class SnapshotFeed(Watcher):
    """Watches → ``ClusterView`` → ``Snapshot``, in one thread; reads under a lock."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        watches: tuple[keys.ApiKind, ...] | None = None,
        informers: SharedInformers | None = None,
        build_after: Callable[[], bool] | None = None,
    ) -> None:
        self.clock = clock
        # The first build waits until this says so: in the leader, for the binder's first
        # pass, so that the two snapshot builds of one process do not share its start.
        self._build_after = build_after
        watches = config.watches if watches is None else watches
        self.view = ClusterView(config, watches)
        self.synced = threading.Event()
        self._snapshot: Snapshot | None = None
        self._lock = threading.Lock()
        sources = [source(api, kind) for kind in watches]
        self._threads = WatchedThread(api, sources, self._run, "admission-feed", informers)
        self._stop = self._threads.stop_event
        self._last_staleness = 0.0

    # --- reading ---------------------------------------------------------------------

    def check_order(self, claim: ClaimInfo, now: float) -> Decision | None:
        """The model's judgement of one order, or None before the first full listing."""
        with self._lock:
            if self._snapshot is None:
                return None
            return set_placement.check_order(self._snapshot, claim, now)

    def largest_node(self, class_name: str) -> int | None:
        """Units of the class on the largest node serving it (maxCount of a passthrough
        class without one), or None when this replica does not know the class yet."""
        with self._lock:
            snap = self._snapshot
            if snap is None or snap.gpu_class(class_name) is None:
                return None
            return snap.max_count(class_name)

    def gpu_names(self) -> frozenset[str] | None:
        """The effective GPU resource-name set, as the leader publishes it in the settings
        ConfigMap (the same view computes both); None before the first listing."""
        return self.view.gpu_names if self.synced.is_set() else None

    def read(self, fn: Callable[[Snapshot], Any]) -> Any:
        """Run ``fn`` on the snapshot under the lock (None before the first listing)."""
        with self._lock:
            return None if self._snapshot is None else fn(self._snapshot)

    # --- the feed --------------------------------------------------------------------

    def take(self, batch: list[Event]) -> None:
        """Apply a batch of watch events and bring the snapshot up to date (the feed
        thread's step; tests call it with events of their own)."""
        for event in batch:
            take(self.view, event)
        now = self.clock()
        if self._snapshot is None:
            if self.view.fully_listed and (self._build_after is None or self._build_after()):
                self._build(now)
            return
        if now - self._last_staleness >= STALENESS_EVERY_S:
            self._last_staleness = now
            self.view.refresh_staleness(now)
            self.view.reservations.ended(now)
        if self.view.dirty:
            with self._lock:
                self.view.sync_into(self._snapshot, now)

    def _run(self) -> None:
        while not self._stop.is_set():
            # Before the first build, look again soon: it may wait on the binder's pass.
            wait = STALENESS_EVERY_S if self._snapshot is not None else BUILD_POLL_S
            batch = self._threads.drain(wait, MAX_BATCH)
            self.take([event for event in batch if isinstance(event, Event)])

    def _build(self, now: float) -> None:
        started = time.perf_counter()
        snapshot = self.view.build_snapshot(now)
        with self._lock:
            self._snapshot = snapshot
        self.synced.set()
        log.info(
            "admission snapshot ready: %s in %.3f s",
            self.view.sizes(),
            time.perf_counter() - started,
        )
