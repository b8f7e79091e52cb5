"""One replica of the controller: a Lease decides whether its binder runs.

Every replica is cheap and stateless apart from the Lease; only the leader turns the
cluster into a binder's snapshot and binds, and only the leader keeps the vGPU licence
copies (``licensing.copier``, its own thread beside the binder's). Both read the process's
one cache (``cluster.informer.SharedInformers``, shared with the admission feed) when
given one, and keep informers of their own when not (tests that run a binder alone).
When the Lease is lost both are stopped at once. Every replica runs a binder from its start:
a standby's keeps its snapshot current and writes nothing (``Binder``), so the replica that
wins the Lease plans on that snapshot at once. A replica that stops leading starts a fresh
standby binder, unless it gave the Lease up for good (below).

A replica whose binder cannot work gives the Lease up. The elector asks ``binder_problem``
every round while it leads: the binder loop raised, one of the binder's threads (loop,
writers, informers) died, or the loop made no progress for ``STALL_S``. Then the binder is
stopped, the Lease released at once (a standby takes over within one retry period, not a
whole lease duration), and the replica campaigns no more. It stays up, reporting the reason
on its health probe (HTTP 500 through kopf), rather than exiting: kubelet's liveness probe
then restarts the container, which keeps the failure visible where a hoster looks (restart
count, the probe's Event, ``kubectl logs --previous``), needs no exit from a background
thread past kopf's clean-up, and leaves the admission webhooks of this replica to the
readiness probe instead of cutting them off mid-request.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from kubernetes import client

from cozystack_gpu import metrics
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.config import Config
from cozystack_gpu.keys import LEASE_NAME_BINDER
from cozystack_gpu.leader import LeaderElector, LeaseTiming
from cozystack_gpu.licensing.copier import LicenseCopier

log = logging.getLogger(__name__)

# A synced binder turns its loop at least every tick (half a second) and a plan pass takes
# well under a second even behind 10,000 waiting orders (BENCHMARKS.md): a minute without a
# turn is a loop that hangs, not one that is busy.
STALL_S = 60.0
# The longest the webhooks' first snapshot waits for the binder's first pass.
FEED_WAIT_S = 10.0


class Controller:
    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        informers: SharedInformers | None = None,
    ) -> None:
        self.api = api
        self.config = config
        # The process's cache, shared with the admission feed; None: each binder keeps its own.
        self.informers = informers
        self._lock = threading.Lock()
        self._stopping = False
        self._started = time.monotonic()
        self.binder: Binder | None = None
        # The leader's other part: the vGPU guest licence copies (SPEC.md §10).
        self.copier: LicenseCopier | None = None
        # The binder whose loop turns are being watched, its count and when it last changed.
        self._watched: tuple[Binder | None, int, float] = (None, 0, 0.0)
        self.elector = LeaderElector(
            api,
            namespace=config.namespace,
            name=LEASE_NAME_BINDER,
            identity=config.identity,
            timing=LeaseTiming(config.lease_duration, config.renew_deadline, config.retry_period),
            on_started=self._start_binding,
            on_stopped=self._stop_binding,
            check=self.binder_problem,
        )

    def start(self) -> None:
        self._started = time.monotonic()
        self._stand_by()
        self.elector.start()

    def stop(self) -> None:
        self._stopping = True
        self.elector.stop(release=True)
        self._stop_binding()

    def _stand_by(self) -> None:
        """A binder that keeps its snapshot warm and binds once this replica leads."""
        with self._lock:
            if self.binder is None and not self._stopping:
                self.binder = Binder(
                    self.api,
                    self.config,
                    is_leader=self.elector.is_leader,
                    informers=self.informers,
                    term=self.elector.term,
                )
                self.binder.start()

    def _start_binding(self) -> None:
        self._stand_by()
        with self._lock:
            if self.copier is not None or self.binder is None:
                return
            metrics.LEADER.set(1)
            self.binder.wake()
            self.copier = LicenseCopier(
                self.api,
                self.config.namespace,
                is_leader=self.elector.is_leader,
                informers=self.informers,
            )
            self.copier.start()
            log.info("%s leads: binder binds (and the licence copier runs)", self.config.identity)

    def _stop_binding(self) -> None:
        with self._lock:
            binder, self.binder = self.binder, None
            copier, self.copier = self.copier, None
            metrics.LEADER.set(0)
        if copier is not None:
            copier.stop()
        if binder is not None:
            binder.stop()
            log.info("%s stopped binding", self.config.identity)
        # A replica that gave the Lease up for good (its binder broke) campaigns no more.
        if self.elector.failure is None:
            self._stand_by()

    def first_pass_or_standby(self) -> bool:
        """Whether the webhooks' snapshot may be built now (and kopf's part imported):
        once this replica's binder has made its first pass and that pass's first write is
        answered (or it sent none), or its election has answered that another replica
        leads, or ``FEED_WAIT_S`` after the start whatever happened (a binder that never
        passes must not keep the webhooks out for good). Both snapshots are built from the
        same 10,000 claims at a start, 0.5-0.8 s of CPU each in one interpreter: the
        leader's first bind need not wait on the webhooks'."""
        binder = self.binder
        if binder is None:
            return True
        if binder.stats.passes > 0 and (binder.stats.binds > 0 or not binder.inflight):
            return True
        if self.elector.rounds > 0 and not self.elector.is_leader():
            return True
        return time.monotonic() - self._started >= FEED_WAIT_S

    # --- health ------------------------------------------------------------------------

    def binder_problem(self) -> str | None:
        """Why this replica must not lead on (None while its binder works).

        The elector asks every round while it leads; an answer makes it resign.
        """
        binder = self.binder
        if binder is None:
            return "the binder is not running"
        found = _broken(binder) or _copier_broken(self.copier)
        if found is not None:
            return found
        now = time.monotonic()
        watched, loops, since = self._watched
        if watched is not binder or loops != binder.stats.loops or not binder.synced.is_set():
            # The clock runs from the first listing: before it the loop does not turn.
            self._watched = (binder, binder.stats.loops, now)
        elif now - since > STALL_S:
            return f"the binder loop made no progress for {now - since:.0f} s"
        return None

    def problems(self) -> list[str]:
        """Everything that makes this replica unhealthy (empty when it is healthy)."""
        found: list[str] = []
        elector = self.elector.problem()
        if elector is not None:
            found.append(elector)
        binder = self.binder
        if binder is not None:
            broken = _broken(binder)
            if broken is not None and broken not in found:
                found.append(broken)
        copier = _copier_broken(self.copier)
        if copier is not None and copier not in found:
            found.append(copier)
        return found

    def health(self) -> dict[str, Any]:
        binder = self.binder
        return {
            "leader": self.elector.is_leader(),
            "synced": bool(binder and binder.synced.is_set()),
            "problems": self.problems(),
        }


def _broken(binder: Binder) -> str | None:
    if binder.failure is not None:
        return f"binder loop failed: {binder.failure}"
    dead = binder.dead_threads()
    if dead:
        return f"binder threads died: {', '.join(dead)}"
    return None


def _copier_broken(copier: LicenseCopier | None) -> str | None:
    if copier is None:
        return None
    if copier.failure is not None:
        return f"licence copier failed: {copier.failure}"
    dead = copier.dead_threads()
    if dead:
        return f"licence copier threads died: {', '.join(dead)}"
    return None
