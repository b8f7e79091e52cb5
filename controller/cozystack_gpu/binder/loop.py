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
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls.base import Answer, Call, CallKey, Outcome
from cozystack_gpu.binder.calls.claims import ClaimListing, ClaimRead, Decision
from cozystack_gpu.binder.calls.reports import EventWrite
from cozystack_gpu.binder.parts.attachments import ATTACHMENT_STEPS, Attachments
from cozystack_gpu.binder.parts.bookings import Bookings
from cozystack_gpu.binder.parts.dra_claims import DraClaims
from cozystack_gpu.binder.parts.gatekeeper import Gatekeeper
from cozystack_gpu.binder.parts.migrations import Migrations
from cozystack_gpu.binder.parts.publisher import Publisher
from cozystack_gpu.binder.parts.rejections import Rejections
from cozystack_gpu.binder.parts.waiting_notes import WaitingNotes
from cozystack_gpu.binder.parts.windows import Windows
from cozystack_gpu.binder.rules import claim_status
from cozystack_gpu.binder.rules.events import EventBook
from cozystack_gpu.binder.writer import Writer
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
from cozystack_gpu.leader import Term
from cozystack_gpu.model import (
    WINDOW_REASONS,
    Action,
    ClaimInfo,
    ClaimKey,
    Plan,
    Reason,
    Snapshot,
    Step,
    plan,
)
from cozystack_gpu.objects import MutableObj, translate
from cozystack_gpu.objects.translate import meta

log = logging.getLogger(__name__)

# The loop wakes at least every TICK_S to look at timed rules (attachment grace, rejections
# expiring), and plans at least every REPLAN_S even when nothing changed, for those rules.
TICK_S = 0.5
REPLAN_S = 1.0
MAX_BATCH = 5000
# Binds per pass at most: a new leader behind 10,000 orders sends the oldest's writes after
# judging a few hundred, not all of them; the rest are judged by the passes that follow.
BINDS_PER_PASS = 500
PLACING = (Step.BIND, Step.REBIND, Step.MOVE)  # steps that take units on ``action.node``

STALENESS_EVERY_S = 1.0  # how often node agent reports are checked for age
WAKE = object()  # put on the loop's queue to turn it at once


@dataclass
class Stats:
    """Counters the benchmark and tests read; metrics carry the same for Prometheus."""

    binds: int = 0
    decisions: dict[str, int] = field(default_factory=dict)
    conflicts: int = 0
    passes: int = 0  # plan passes (only when something changed)
    loops: int = 0  # loop turns after the first listing (at least one per tick)
    standby_turns: int = 0  # turns while not leading: one per batch of events or tick


class Binder(Watcher):
    """Runs in its own thread in every replica; it decides and writes only while
    ``is_leader()`` says so, and ``stop()`` ends it at once.

    A standby's binder is warm: it takes every watch event into its view and snapshot as
    the leader's does, so winning the Lease means planning at once on a current snapshot,
    not listing, building and catching up first (the takeover the hoster waits for). What
    the parts keep books on starts at the takeover, as a fresh leader's would
    (``_took_over``).
    """

    def __init__(
        self,
        api: client.ApiClient,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        is_leader: Callable[[], bool] = lambda: True,
        informers: SharedInformers | None = None,
        term: Callable[[], Term | None] = lambda: None,
    ) -> None:
        metrics.start_at_zero(
            steps=[*(str(s) for s in Step if s is not Step.WAIT), *ATTACHMENT_STEPS],
            # An order's refusals: the window reasons are a booking's, never a bind's.
            reasons=[str(r) for r in Reason if r not in WINDOW_REASONS],
        )
        self.api = api
        self.config = config
        self.clock = clock
        self.is_leader = is_leader
        self.stats = Stats()
        self.synced = threading.Event()
        watched = config.watches + ((keys.WORKLOAD,) if config.workload_records else ())
        self.view = ClusterView(config, watched)
        # The process's shared cache when given (one listing and watch per kind for the
        # admission feed and the binder), else informers of the binder's own.
        self._threads = WatchedThread(
            api,
            [source(api, kind) for kind in watched],
            self._run,
            "binder",
            informers,
        )
        self._stop = self._threads.stop_event
        self.writer = Writer(
            api,
            self._threads.queue,
            config.write_workers,
            may_send=is_leader,
            write_deadline_s=config.lease_duration - config.renew_deadline,
            term=term,
        )
        # The reporting instance of its Events: this replica, by its hostname (the pod's
        # name in a cluster, as the Lease identity defaults to).
        self.events = EventBook(socket.gethostname())
        # Calls out by key (sent, not answered): a part asks before writing an object again.
        self._out: Counter[CallKey] = Counter()
        # Decisions whose answer never came (the connection broke, the server restarted):
        # one that landed is counted when its claim shows the status it wrote. One whose
        # claim could not be read again either stays in flight until it is (``_lost``).
        self._unanswered: dict[ClaimKey, Decision] = {}

        self.snapshot = Snapshot()
        # The gate skips the nodes that refused a VM's pod; a refusal ends the pin's note.
        self.rejections = Rejections(self)
        self.gatekeeper = Gatekeeper(self, refused_nodes=self.rejections.refused_nodes)
        self.rejections.placed_over = self.gatekeeper.placed_over
        self.publisher = Publisher(self)
        self.attachments = Attachments(self)
        self.waiting = WaitingNotes(self)
        self.bookings = Bookings(self)
        self.windows = Windows(self)
        self.migrations = Migrations(self)
        self.dra_claims = DraClaims(self)
        # Claims whose placement write is out: no decision touches them until it returns.
        self.inflight: set[ClaimKey] = set()
        # Holds packing is moving off each node: no placement there is sent until their
        # writes are answered (a move refused leaves its hold where the order would go).
        self._vacating: dict[str, set[ClaimKey]] = {}
        self._last_staleness = 0.0
        self._last_plan = 0.0
        self._next_plan = 0.0
        self._changed = True
        self._leading = False  # as of the loop's last turn
        # Each term of leading decides nothing until a listing of the claims sent in that
        # term is in the view (``ClaimListing``): a standby's watches may lag the writes of
        # the leader before it.
        self._term = 0
        self._listed_in_term = False
        self._term_started = 0.0

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

    def wake(self) -> None:
        """Turn the loop now (this replica just won the Lease) instead of at its next tick."""
        self._threads.queue.put(WAKE)

    @property
    def status_writes(self) -> int:
        return self.writer.status_writes

    def _run(self) -> None:
        while not self._stop.is_set():
            timeout = TICK_S
            if self._changed and self._leading:
                # A pass is due: wait no longer than its spacing for more to batch into it.
                # (A standby plans nothing: it waits for events, or for a tick.)
                timeout = max(0.0, min(TICK_S, self._next_plan - time.monotonic()))
            for item in self._threads.drain(timeout, MAX_BATCH):
                self._handle(item)
            if not self.synced.is_set():
                if self.view.fully_listed:
                    self._initial_build()
                else:
                    continue
            if not self.is_leader():
                self._leading = False
                self.stats.standby_turns += 1
                self._flush(standby=True)
                continue
            if not self._leading:
                self._leading = True
                self._took_over()
            self.stats.loops += 1
            now = self.clock()
            self._flush()
            if not self._listing_in():
                continue  # the term's claim listing is not in yet: nothing is decided
            self._turn(now)

    def _turn(self, now: float) -> None:
        """One leading turn after its flush: each part judges the view and sends its writes,
        and after each step the queue is taken in again (``_catch_up``).

        A migration's target pod is pinned only once its set's records are answered, where a
        start's pod is pinned at once by the gate. So the migrations part goes first, and
        what came in while a step ran (a record's answer, a migration, a target pod) is
        taken in before the next step: a record answered mid-turn pins its target pod then,
        and a migration that came in has its target recorded then, not after the rest of the
        turn and the next drain (at 1,000 VMs a busy turn takes a good part of a second).
        """
        steps: tuple[Callable[[float], object], ...] = (
            self.migrations.run,
            self.attachments.run,
            self.attachments.attach_started,
            self.publisher.protect,
            self.gatekeeper.run,
            self.rejections.run,
            self.bookings.run,
            self.windows.run,
            lambda _now: self.dra_claims.run(),
            self._decide,
            lambda _now: self.attachments.release_stuck_vmis(),
        )
        for step in steps:
            step(now)
            self._catch_up(now)
        self.publisher.publish(now)

    def _catch_up(self, now: float) -> None:
        """What came in since the last drain (answers, events), taken into the view and the
        snapshot as at a turn's start, and the gated target pods placed or pinned on it;
        the parts not run yet judge on it too."""
        items = self._threads.drain(0.0, MAX_BATCH)
        for item in items:
            self._handle(item)
        if items:
            self._flush()
            self.migrations.caught_up(now)

    # --- gather ----------------------------------------------------------------------

    def _handle(self, item: Any) -> None:
        if item is WAKE:
            return
        if isinstance(item, Event):
            take(self.view, item)
        elif isinstance(item, Answer):
            self._answered(item)

    def _initial_build(self) -> None:
        started = time.perf_counter()
        self.snapshot = self.view.build_snapshot(self.clock())
        self.synced.set()
        log.info("binder synced: %s in %.3f s", self.view.sizes(), time.perf_counter() - started)

    def _took_over(self) -> None:
        """This replica leads from this turn: what a fresh leader looks at first. Its first
        decision waits for a listing of the claims made now (``ClaimListing``)."""
        self._changed = True
        self._term += 1
        self._listed_in_term = False
        self._term_started = time.monotonic()
        self.publisher.took_over()
        self.bookings.nodes_changed((), everything=True)
        self.windows.took_over()
        self.migrations.took_over()
        self.dra_claims.took_over()
        log.info("binder leads: %s in its snapshot; listing the claims afresh", self.view.sizes())

    def _flush(self, *, standby: bool = False) -> None:
        """Bring the snapshot up to date with every object changed since the last pass.

        Only a change of what the model reads asks for a new plan: the echo of a condition
        the binder wrote itself, or a label the model ignores, does not. A claim whose
        write is out keeps the decision sent until the write returns. A ``standby`` keeps
        only the snapshot: the parts start their books when it leads.
        """
        now = self.clock()
        if now - self._last_staleness >= STALENESS_EVERY_S:
            self._last_staleness = now
            self.view.refresh_staleness(now)
        changed, dirty = self.view.sync_into(
            self.snapshot, now, held=self.inflight, booking=self.bookings.held()
        )
        if standby:
            self._changed |= changed
            return
        for key in dirty.claims & self._unanswered.keys():
            self._confirm(self._unanswered[key], self.view.claim(key))
        self.publisher.changed(dirty.claims, dirty.nodes)
        self.bookings.nodes_changed(dirty.nodes, everything=bool(dirty.classes))
        self.windows.changed(dirty.reservations, dirty.claims)
        self.migrations.changed(dirty.claims)
        self.dra_claims.changed(dirty.claims)
        self.rejections.nodes_changed(dirty.nodes)
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
        result = plan(self.snapshot, now, max_binds=BINDS_PER_PASS)
        # A pass costs time in proportion to what waits; space passes by their own cost so
        # the loop spends at most about half its time planning and the rest taking in
        # events and sending writes. Arrivals meanwhile are judged together in the next.
        self._next_plan = time.monotonic() + (time.monotonic() - started)
        self.stats.passes += 1
        if result.unjudged:
            self._changed = True  # the orders this pass left are judged by the next
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
            if action.step in PLACING and self.vacated_in_flight(action.node):
                # Planned into room whose moves are not answered yet: placed again by a
                # pass after they are, on what they really left.
                self._changed = True
                continue
            for key in action.claims:
                updated = result.updates.get(key)
                obj = self.view.claim(key)
                if updated is None or obj is None:
                    continue
                cond = claim_status.action_condition(action, updated, now)
                body = claim_status.claim_status_patch(obj, updated, cond)
                self.decide(updated, Decision(key.namespace, key.name, body, str(action.step)))
                self.waiting.forget(key)
                self.event(obj, str(cond["reason"]), str(cond["message"]), action.step is Step.LOSE)
        # Orders never judged before are told first: a new order shows Pending at once, even
        # while a new leader tells a backlog of older waiting claims their changed reasons.
        self.waiting.tell(waits, now, placing=bool(self.inflight))
        # Every waiting claim, the VMs' template claims at the gate too (the plan leaves
        # those to the gate): what kubectl gpu top counts, the alerts count.
        metrics.PENDING.set(self.snapshot.waiting_count())
        metrics.set_oldest_waiting(self.snapshot.oldest_waiting())

    def vacated_in_flight(self, node: str | None) -> bool:
        """Whether a claim's write taking it off ``node`` is still out (``decide``): room
        there is not placed into until it is answered and the view counts what is left."""
        if node is None:
            return False
        moving = self._vacating.get(node)
        if moving is None:
            return False
        moving &= self.inflight
        if not moving:
            del self._vacating[node]
        return bool(moving)

    # --- what the parts are handed (binder.parts.handle.PartHandle) ------------------------------

    def in_flight(self, keys: Iterable[ClaimKey]) -> bool:
        """Whether a placement write about any of these claims is still out: no decision
        touches such a claim until its write is answered."""
        return any(key in self.inflight for key in keys)

    def decide(self, claim: ClaimInfo, call: Decision) -> bool:
        """A decision: recorded in the snapshot when it is sent, so the rest of the turn
        judges on it, and its write sent (answered in ``_decided``). False while a placement
        write of the claim is out: the claim is decided again once it is answered."""
        if claim.key in self.inflight:
            return False
        before = self.snapshot.claim(claim.key)
        # The units it leaves are free in the snapshot at once, but not on the node until the
        # write is answered: a VM's source pod runs on after its migration landed (a failed
        # migration's target pod, until it goes), and the view counts that pod as the claim's
        # until the claim is seen changed. A sync of the node meanwhile would count them free.
        for node in before.nodes_held - claim.nodes_held if before is not None else ():
            self._vacating.setdefault(node, set()).add(claim.key)
        self.snapshot.upsert_claim(claim)
        # Sent even when the Lease lapsed since the top of this turn: the writer asks again
        # before sending and answers a write it holds back as failed, so the claim is judged
        # again. Dropped here, it would stay decided in the snapshot and never be written
        # (an order left with no phase for good, found by the fault suite's slow server).
        self.inflight.add(claim.key)
        self.send(call)
        return True

    def send(self, call: Call) -> None:
        self._out[call.key] += 1
        self.writer.send(call)

    def writing(self, key: CallKey) -> bool:
        return key in self._out

    def event(
        self,
        obj: MutableObj,
        reason: str,
        message: str,
        warning: bool,
        kind: keys.ApiKind = keys.GPU_CLAIM,
    ) -> None:
        told, needs_write = self.events.tell(obj, kind, reason, message, warning, time.time())
        if needs_write:  # else the write still queued for this Event carries the repeat
            self.send(EventWrite(told, self.events))

    def _answered(self, answer: Answer) -> None:
        """Every answer, applied here: the view takes what the server said, the claim of a
        decision is released, and the part that keeps books on the call is told."""
        call = answer.call
        self._out[call.key] -= 1
        if self._out[call.key] <= 0:
            del self._out[call.key]
        if answer.outcome is Outcome.SUPERSEDED:
            return  # the newer call queued behind it answers for both
        call.apply(answer, self.view)
        if isinstance(call, Decision):
            self._decided(call, answer)
        elif isinstance(call, ClaimRead):
            self._read_again(call, answer)
        elif isinstance(call, ClaimListing):
            self._listed_afresh(call, answer)
        if call.heard is not None:
            call.heard(answer)

    def _decided(self, call: Decision, answer: Answer) -> None:
        self._unanswered.pop(call.claim, None)
        if answer.outcome is not Outcome.GONE and not answer.ok:
            self.stats.conflicts += 1
            metrics.WRITE_CONFLICTS.inc()
        if answer.outcome is Outcome.FAILED and answer.obj is None and self._may_write():
            self._lost(call)
            return
        self.inflight.discard(call.claim)
        if answer.ok and answer.obj is not None:
            self._count(call, answer.obj)
            return
        self._changed = True
        if answer.outcome is Outcome.FAILED:
            self._unanswered[call.claim] = call
            if answer.obj is not None:  # read again after the failure
                self._confirm(call, answer.obj)

    def _may_write(self) -> bool:
        return self.is_leader() and not self._stop.is_set()

    def _lost(self, call: Decision) -> None:
        """The answer was lost and the claim could not be read again: the write may have
        landed. Going back to the claim as the view last saw it would free its units for
        the next order while the API holds them (a budget over its limit, a node over its
        capacity, found by the fault suite's restarted API server). So the claim stays in
        flight, as decided, until it is read again or the watch shows what it holds."""
        self._unanswered[call.claim] = call
        self.send(ClaimRead(call.namespace, call.name))

    def _listing_in(self) -> bool:
        """Whether this term's claim listing is in the view; while it is not, one is out.
        Asked on every leading turn, so a listing that failed (the server away, or sent in
        an instant the Lease had lapsed, which the loop itself never saw) is sent again
        rather than leaving the leader deciding nothing for good."""
        if self._listed_in_term:
            return True
        if not self.writing(ClaimListing(self._term).key):
            self.send(ClaimListing(self._term))
        return False

    def _listed_afresh(self, call: ClaimListing, answer: Answer) -> None:
        """The term's claim listing is in the view (``ClaimListing.apply``): decide from now
        on. A failed one is sent again by the next leading turn (``_listing_in``); one of an
        earlier term is no listing for this one."""
        if call.term != self._term or self._listed_in_term:
            return
        if answer.ok:
            self._listed_in_term = True
            self._changed = True
            log.info(
                "binder decides: claims listed afresh %.3f s after it began to lead (%s)",
                time.monotonic() - self._term_started,
                self.view.sizes(),
            )
        else:
            log.warning("claim listing failed: %s; listing again", answer.error)

    def _read_again(self, call: ClaimRead, answer: Answer) -> None:
        decision = self._unanswered.get(call.claim)
        if decision is None or call.claim not in self.inflight:
            return  # the watch settled it first
        if answer.outcome is Outcome.FAILED and self._may_write():
            self.send(ClaimRead(call.namespace, call.name))  # the writer paces the retries
            return
        if answer.obj is not None:
            self._confirm(decision, answer.obj, read=True)
        else:  # gone, or this replica stopped leading: the next leader reads it anew
            self._release(call.claim)

    def _confirm(self, call: Decision, obj: MutableObj | None, *, read: bool = False) -> None:
        """Count a decision whose answer was lost once its claim carries what it wrote
        (the node and the boundAt it set); forget it once the claim shows another write,
        or, ``read`` from the API, does not carry it (then it never landed)."""
        if obj is None:
            self._release(call.claim)
            return
        wrote, status = call.body.get("status") or {}, obj.get("status") or {}
        if all(status.get(f) == wrote.get(f) for f in ("nodeName", "boundAt")):
            self._release(call.claim)
            self._count(call, obj)
        elif read or translate.resource_version(obj) > translate.resource_version(call.body):
            self._release(call.claim)  # written over by another, or never: it did not land

    def _release(self, key: ClaimKey) -> None:
        """The API's word on a claim whose answer was lost is in: judged again on it."""
        self._unanswered.pop(key, None)
        if key in self.inflight:
            self.inflight.discard(key)
            self.view.dirty.claims.add(key)  # the next flush takes what the view holds
        self._changed = True

    def _count(self, call: Decision, obj: MutableObj) -> None:
        """A decision the API holds: counted once, whether its answer came back or not."""
        self.stats.decisions[call.step] = self.stats.decisions.get(call.step, 0) + 1
        metrics.DECISIONS.labels(call.step).inc()
        if call.step == str(Step.BIND):
            self.stats.binds += 1
            created = translate.timestamp(meta(obj).get("creationTimestamp"))
            if created is not None:
                metrics.BIND_LATENCY.observe(max(self.clock() - created, 0.0))
