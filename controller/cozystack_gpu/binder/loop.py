"""The binder: a single loop in the leader over a model snapshot kept current by watches.

gather (informer events → raw objects → model inputs) → decide (``model.plan`` and the
attachment rules) → write (pipelined status writes) → report (class status, usage
records, settings, metrics).

Why the writes cannot double-book: every decision is made on the snapshot, which already
holds the outcome of every decision sent before it (the loop records a decision in the
snapshot when it sends the write, not when the watch returns it). Each write carries the
resourceVersion the decision saw, so a claim changed by someone else in between gets 409;
the loop then takes the fresh claim and decides again for it alone. While a claim's write
is in flight, no plan that would change it again is acted on. Watch events older than what
the loop already knows of a claim are ignored (etcd revisions are integers and grow).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder import claim_status
from cozystack_gpu.binder.attachments import ATTACHMENT_STEPS, Attachments
from cozystack_gpu.binder.gatekeeper import Gatekeeper
from cozystack_gpu.binder.publisher import Publisher
from cozystack_gpu.binder.waiting_notes import WaitingNotes
from cozystack_gpu.binder.writer import (
    ClaimWriteDone,
    Outcome,
    Priority,
    WriteDone,
    WriteKind,
    Writer,
)
from cozystack_gpu.cluster.informer import (
    Event,
    EventType,
    SharedInformers,
    WatchedThread,
    source,
)
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.model import (
    Action,
    ClaimInfo,
    ClaimKey,
    Plan,
    Reason,
    Snapshot,
    Step,
    plan,
)
from cozystack_gpu.objects import translate
from cozystack_gpu.objects.translate import meta

log = logging.getLogger(__name__)

# The loop wakes at least every TICK_S to look at timed rules (attachment grace, rejections
# expiring), and plans at least every REPLAN_S even when nothing changed, for those rules.
TICK_S = 0.5
REPLAN_S = 1.0
MAX_BATCH = 5000
PLACING = (Step.BIND, Step.REBIND, Step.MOVE)  # steps that take units on ``action.node``

STALENESS_EVERY_S = 1.0  # how often node agent reports are checked for age


@dataclass
class Stats:
    """Counters the benchmark and tests read; metrics carry the same for Prometheus."""

    binds: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0
    passes: int = 0  # plan passes (only when something changed)
    loops: int = 0  # loop turns after the first listing (at least one per tick)


class Binder:
    """Runs in its own thread while this replica leads; ``stop()`` ends it at once."""

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        is_leader: Callable[[], bool] = lambda: True,
        informers: SharedInformers | None = None,
    ) -> None:
        metrics.start_at_zero(
            steps=[*(str(s) for s in Step if s is not Step.WAIT), *ATTACHMENT_STEPS],
            reasons=[str(r) for r in Reason],
        )
        self.api = api
        self.config = config
        self.clock = clock
        self.is_leader = is_leader
        self.stats = Stats()
        self.synced = threading.Event()
        # Why the loop stopped on its own (an exception), for the health probe and the logs.
        self.failure: str | None = None
        watched = keys.BINDER_WATCHES + ((keys.WORKLOAD,) if config.workload_records else ())
        self.view = ClusterView(config, watched)
        # The process's shared cache when given (one listing and watch per kind for the
        # admission feed and the binder), else informers of the binder's own.
        self._threads = WatchedThread(
            api,
            [source(api, kind) for kind in watched],
            self._run,
            "binder",
            lambda: self.failure,
            informers,
        )
        self._stop, self._queue = self._threads.stop_event, self._threads.queue
        self.writer = Writer(api, self._queue, config.write_workers, may_send=is_leader)

        self.snapshot = Snapshot()
        self.gatekeeper = Gatekeeper(self)
        self.publisher = Publisher(self)
        self.attachments = Attachments(self)
        self.waiting = WaitingNotes(self)
        # Claims whose placement write is out: no decision touches them until it returns.
        self.inflight: set[ClaimKey] = set()
        # Holds packing is moving off each node: no placement there is sent until their
        # writes are answered (a move refused leaves its hold where the order would go).
        self._vacating: dict[str, set[ClaimKey]] = {}
        self._last_staleness = 0.0
        self._last_plan = 0.0
        self._next_plan = 0.0
        self._changed = True
        # Who hears the answer of each kind of write.
        self._answers: dict[WriteKind, Callable[[WriteDone], None]] = {
            WriteKind.CLASS_STATUS: self.publisher.written,
            WriteKind.RECORD: self.publisher.written,
            WriteKind.RECORD_DELETE: self.publisher.written,
            WriteKind.FINALIZER: self.publisher.written,
            WriteKind.GPUNODE_STATUS: self.publisher.written,
            WriteKind.SETTINGS: self.publisher.written,
            WriteKind.POD_PIN: self.gatekeeper.written,
            WriteKind.POD_DELETE: self.gatekeeper.written,
            WriteKind.TEMPLATE_CLAIM: self.gatekeeper.written,
            WriteKind.VMI_DELETE: self.attachments.vmi_deleted,
            WriteKind.CLAIM_DELETE: self.publisher.written,
            WriteKind.EVENT: lambda _done: None,  # Events for people: nothing to take back
        }

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self.writer.start()
        self._threads.start()

    def stop(self) -> None:
        self._stop.set()
        # The writer first: its queued jobs are dropped at once (a replica that stops
        # leading must not write), even while a hung loop is still being waited for.
        self.writer.stop()
        self._threads.stop()

    def dead_threads(self) -> list[str]:
        """Names of the binder's threads that should run but do not (empty when healthy):
        its loop, its writers and the informers it reads."""
        if self._stop.is_set() and self.failure is None:
            return []  # stopped on purpose
        writers = [t.name for t in self.writer.threads if t.ident is not None and not t.is_alive()]
        return self._threads.dead_threads() + writers

    @property
    def status_writes(self) -> int:
        return self.writer.status_writes

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                batch = self._drain()
                for item in batch:
                    self._handle(item)
                if not self.synced.is_set():
                    if self.view.fully_listed:
                        self._initial_build()
                    else:
                        continue
                if not self.is_leader():
                    continue
                self.stats.loops += 1
                now = self.clock()
                self._flush()
                self.attachments.run(now)
                self.publisher.protect(now)
                self.gatekeeper.run(now)
                self.gatekeeper.refusals(now)
                self._decide(now)
                self.attachments.release_stuck_vmis()
                self.publisher.publish(now)
        except Exception as exc:
            log.exception("binder loop failed; stopping so a fresh one can start")
            self.failure = f"{type(exc).__name__}: {exc}"
            self._stop.set()

    def _drain(self) -> list[Any]:
        timeout = TICK_S
        if self._changed:
            # A pass is due: wait no longer than its spacing for more to batch into it.
            timeout = max(0.0, min(TICK_S, self._next_plan - time.monotonic()))
        try:
            first = self._queue.get(timeout=timeout)
        except queue.Empty:
            return []
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return [item for item in batch if item is not None]

    # --- gather ----------------------------------------------------------------------

    def _handle(self, item: Any) -> None:
        if isinstance(item, Event):
            if item.type is EventType.LISTED:
                self.view.relist(item.kind, item.objects)
            elif item.obj is not None:
                self.view.apply(item.kind, item.obj, deleted=item.type is EventType.DELETED)
        elif isinstance(item, ClaimWriteDone):
            self._claim_written(item)
        elif isinstance(item, WriteDone):
            self._written(item)

    def _initial_build(self) -> None:
        started = time.perf_counter()
        self.snapshot = self.view.build_snapshot(self.clock())
        self.synced.set()
        log.info(
            "binder synced: %d nodes, %d classes, %d claims in %.3f s",
            len(self.view.raw[keys.NODE.kind]),
            len(self.view.raw[keys.GPU_CLASS.kind]),
            len(self.view.raw[keys.GPU_CLAIM.kind]),
            time.perf_counter() - started,
        )

    def _flush(self) -> None:
        """Bring the snapshot up to date with every object changed since the last pass.

        Only a change of what the model reads asks for a new plan: the echo of a condition
        the binder wrote itself, or a label the model ignores, does not. A claim whose
        write is out keeps the decision sent until the write returns.
        """
        now = self.clock()
        if now - self._last_staleness >= STALENESS_EVERY_S:
            self._last_staleness = now
            self.view.refresh_staleness(now)
        changed, dirty = self.view.sync_into(self.snapshot, now, held=self.inflight)
        self.publisher.changed(dirty.claims, dirty.nodes)
        self.gatekeeper.nodes_changed(dirty.nodes)
        for key in dirty.claims:
            if self.view.claim(key) is None:
                self.waiting.forget(key)
        if changed:
            self._changed = True

    # --- decide and write ------------------------------------------------------------

    def _decide(self, now: float) -> None:
        # Decisions also depend on time (rejections and attachments expire): plan at least
        # once per REPLAN_S even when nothing was watched to change.
        if not self._changed and now - self._last_plan < REPLAN_S:
            return
        if time.monotonic() < self._next_plan:
            return  # too soon after the last pass: let more changes batch into the next
        self._changed = False
        self._last_plan = now
        started = time.monotonic()
        result = plan(self.snapshot, now)
        # A pass costs time in proportion to what waits; space passes by their own cost so
        # the loop spends at most about half its time planning and the rest taking in
        # events and sending writes. Arrivals meanwhile are judged together in the next.
        self._next_plan = time.monotonic() + (time.monotonic() - started)
        self.stats.passes += 1
        if self.in_flight(key for a in result.changes for key in a.claims):
            # A decision would change a claim whose write is still out: wait for it and
            # plan again, rather than act on a plan built on a decision not yet confirmed.
            self._changed = True
            return
        self._act(result, now)

    def _act(self, result: Plan, now: float) -> None:
        self.waiting.refill(now)
        waits: list[Action] = []
        for action in result.actions:
            if action.step is Step.WAIT:
                if action.refusal is not None:
                    waits.append(action)
                continue
            if action.step in PLACING and self._vacated_in_flight(action.node):
                # Planned into room whose moves are not answered yet: placed again by a
                # pass after they are, on what they really left.
                self._changed = True
                continue
            if action.step is Step.MOVE and action.from_node is not None:
                self._vacating.setdefault(action.from_node, set()).update(action.claims)
            for key in action.claims:
                updated = result.updates.get(key)
                obj = self.view.claim(key)
                if updated is None or obj is None:
                    continue
                cond = claim_status.action_condition(action, updated, now)
                body = claim_status.claim_status_patch(obj, updated, cond)
                self.decide(updated, body, str(action.step))
                self.waiting.forget(key)
                self.writer.event(
                    obj, str(cond["reason"]), str(cond["message"]), action.step is Step.LOSE
                )
        # Orders never judged before are told first: a new order shows Pending at once, even
        # while a new leader tells a backlog of older waiting claims their changed reasons.
        self.waiting.tell(waits, now, placing=bool(self.inflight))
        # Every waiting claim, the VMs' template claims at the gate too (the plan leaves
        # those to the gate): what kubectl gpu top counts, the alerts count.
        waiting_now = [c for c in self.snapshot.claims() if c.waiting]
        metrics.PENDING.set(len(waiting_now))
        metrics.set_oldest_waiting(claim_status.oldest_waiting(waiting_now))

    def _vacated_in_flight(self, node: str | None) -> bool:
        if node is None:
            return False
        moving = self._vacating.get(node)
        if moving is None:
            return False
        moving &= self.inflight
        if not moving:
            del self._vacating[node]
        return bool(moving)

    # --- what the parts are handed (binder.part.PartHandle) ------------------------------

    def in_flight(self, keys: Iterable[ClaimKey]) -> bool:
        """Whether a placement write about any of these claims is still out: no decision
        touches such a claim until its write is answered."""
        return any(key in self.inflight for key in keys)

    def decide(self, claim: ClaimInfo, body: dict[str, Any], purpose: str) -> None:
        """A decision: recorded in the snapshot when it is sent, so the rest of the turn
        judges on it, and its write sent (answered in ``_claim_written``)."""
        self.snapshot.upsert_claim(claim)
        self.send(claim.key, body, purpose)

    def send(self, key: ClaimKey, body: dict[str, Any], purpose: str) -> None:
        # Sent even when the Lease lapsed since the top of this turn: the writer asks again
        # before sending and answers a write it holds back as failed, so the claim is judged
        # again. Dropped here, it would stay decided in the snapshot and never be written
        # (an order left with no phase for good, found by the fault suite's slow server).
        self.inflight.add(key)
        self.writer.claim_status(key, body, purpose, Priority.BIND)

    def _claim_written(self, done: ClaimWriteDone) -> None:
        if done.purpose in claim_status.NOTES:
            if done.obj is not None:  # written, or refused with the claim as it is now
                self._store_claim(done.key, done.obj)
            written = done.outcome is Outcome.WRITTEN
            if done.purpose == claim_status.NOTE_PLACED:
                self.gatekeeper.placed_answered(done.key, written)
            elif written:
                return
            elif done.purpose == claim_status.NOTE_WAIT:
                self.waiting.forget(done.key)
            else:
                self.publisher.note_failed(done.key)
            return
        self.inflight.discard(done.key)
        self.view.dirty.claims.add(done.key)
        if done.outcome is not Outcome.WRITTEN:
            self._changed = True
        if done.outcome is Outcome.WRITTEN and done.obj is not None:
            self._store_claim(done.key, done.obj)
            self.stats.decisions[done.purpose] = self.stats.decisions.get(done.purpose, 0) + 1
            metrics.DECISIONS.labels(done.purpose).inc()
            if done.purpose == str(Step.BIND):
                self.stats.binds += 1
                created = translate.timestamp(meta(done.obj).get("creationTimestamp"))
                if created is not None:
                    metrics.BIND_LATENCY.observe(max(self.clock() - created, 0.0))
        elif done.outcome is Outcome.GONE:
            self.view.forget_claim(done.key)
        else:
            self.stats.conflicts += 1
            metrics.WRITE_CONFLICTS.inc()
            if done.obj is not None:
                self._store_claim(done.key, done.obj)

    def _store_claim(self, key: ClaimKey, obj: dict[str, Any]) -> None:
        obj.setdefault("kind", keys.KIND_CLAIM)
        self.view.apply(keys.GPU_CLAIM.kind, obj, deleted=False)

    def _written(self, done: WriteDone) -> None:
        self._answers[done.what](done)
