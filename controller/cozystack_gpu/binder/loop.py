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
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder import gate, lifecycle, translate
from cozystack_gpu.binder.translate import meta
from cozystack_gpu.binder.view import ClusterView, Key
from cozystack_gpu.binder.writer import (
    REQUEST_TIMEOUT_S,
    ClaimWriteDone,
    Outcome,
    Priority,
    WriteDone,
    Writer,
)
from cozystack_gpu.config import Config
from cozystack_gpu.informer import Event, EventType, Informer, source
from cozystack_gpu.keys import OnCordon, Phase
from cozystack_gpu.model import (
    Action,
    ClaimKey,
    Plan,
    Refusal,
    RejectedNode,
    Snapshot,
    Step,
    plan,
)

log = logging.getLogger(__name__)

TICK_S = 0.5  # re-plan at least this often: expiries (attachment grace, rejections) are timed
# "Why it waits" condition writes a second, at most. Each costs the API server as much as a
# bind; measured on 2 cores, 100/s behind 10,000 refused orders tripled the bind latency of
# the orders that fit. A few refusals are told at once (the bucket holds this many).
WAIT_NOTES_PER_S = 20
REPLAN_S = 1.0  # plan at least this often, for time-based rules
PUBLISH_EVERY_S = 0.25  # class status and usage records at most this often
METRICS_EVERY_S = 5.0
MAX_BATCH = 5000

STALENESS_EVERY_S = 1.0  # how often node agent reports are checked for age
WORKLOAD_KIND = keys.WORKLOAD.kind
# Status writes that only tell (why a claim waits, why its deletion waits): they are not
# placements, so they are queued behind every bind and never held in flight.
NOTE_WAIT = "Wait"
NOTE_DELETING = "Deleting"
NOTE_PLACED = "Placed"
NOTES = frozenset({NOTE_WAIT, NOTE_DELETING, NOTE_PLACED})


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
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        self.is_leader = is_leader
        self.stats = Stats()
        self.synced = threading.Event()
        # Why the loop stopped on its own (an exception), for the health probe and the logs.
        self.failure: str | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer = Writer(api, self._queue, config.write_workers)
        watched = keys.BINDER_WATCHES + ((keys.WORKLOAD,) if config.workload_records else ())
        self.view = ClusterView(config, watched)
        self._informers = [
            Informer(api, source(api, kind), self._queue, self._stop) for kind in watched
        ]
        self._thread = threading.Thread(target=self._run, name="binder", daemon=True)

        self.snapshot = Snapshot()
        # Writes in flight.
        self._inflight: set[ClaimKey] = set()
        self._class_writes: set[str] = set()
        self._record_writes: set[Key] = set()
        self._vmi_deletes: set[Key] = set()
        self._meta_writes: set[tuple[str, Key]] = set()  # finalizer patches in flight
        # The gate: pod updates and template-claim creations in flight, what each gated pod
        # was last told (so a refusal is said once), the nodes that refused a pinned pod
        # with the node state they refused in, and the volumes' node limits per pod.
        self._pod_writes: set[Key] = set()
        self._creating: set[ClaimKey] = set()
        self._gate_told: dict[Key, str] = {}
        self._rejected_health: dict[str, tuple[Any, ...]] = {}
        self._volume_nodes: dict[str, set[str] | None] = {}
        self._protect_due: set[ClaimKey] = set()  # claims whose finalizer may have to change
        self._deleting_noted: set[ClaimKey] = set()
        self._gpunodes_due: set[str] = set()  # GPUNodes whose conditions may have to change
        self._gpunode_writes: set[str] = set()
        self._last_staleness = 0.0
        self._published_nodes: set[tuple[str, str]] = set()  # (node, resource) in metrics
        self._settings_written: dict[str, str] | None = None
        self._settings_inflight = False
        self._waiting_written: dict[ClaimKey, tuple[str, str]] = {}
        self._counted_refusals: set[ClaimKey] = set()
        self._note_budget = float(WAIT_NOTES_PER_S)
        self._note_refilled = 0.0
        self._last_publish = 0.0
        self._last_plan = 0.0
        self._next_plan = 0.0
        self._last_metrics = 0.0
        self._changed = True

    # --- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        self._writer.start()
        for informer in self._informers:
            informer.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._queue.put(None)
        self._thread.join(timeout=10)
        self._writer.stop()
        for informer in self._informers:
            informer.join(timeout=1)

    def dead_threads(self) -> list[str]:
        """Names of the binder's threads that should run but do not (empty when healthy)."""
        if self._stop.is_set() and self.failure is None:
            return []  # stopped on purpose
        threads = [self._thread, *self._writer.threads, *(i.thread for i in self._informers)]
        return [t.name for t in threads if t.ident is not None and not t.is_alive()]

    @property
    def status_writes(self) -> int:
        return self._writer.status_writes

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
                self._attachments(now)
                self._protect(now)
                self._gate(now)
                self._refusals(now)
                self._decide(now)
                self._release_stuck_vmis()
                self._publish(now)
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
        changed, dirty = self.view.sync_into(self.snapshot, now, held=self._inflight)
        self._protect_due |= dirty.claims
        self._gpunodes_due |= dirty.nodes
        if self._rejected_health and dirty.nodes:
            self._forget_rejections(dirty.nodes)
        for key in dirty.claims:
            if self.view.claim(key) is None:
                self._waiting_written.pop(key, None)
        if changed:
            self._changed = True

    # --- decide and write ------------------------------------------------------------

    def _attachments(self, now: float) -> None:
        """Bound ⇄ Attached transitions, and attachments that never saw their VMI."""
        grace = self.config.attachment_grace
        for vmi_key, members in self.view.attachments():
            vmi = self.view.vmi(vmi_key)
            for key in list(members):
                if key in self._inflight:
                    continue
                obj = self.view.claim(key)
                if obj is None:
                    continue
                change = lifecycle.attachment_change(obj, vmi, now, grace)
                if change is None:
                    continue
                body = lifecycle.attachment_patch(obj, change, now)
                info = self.view.claim_info(key, now)
                if info is not None:
                    self.snapshot.upsert_claim(
                        replace(
                            info,
                            phase=change.phase,
                            attached_to=None if change.clear_attachment else info.attached_to,
                        )
                    )
                step = "Attach" if change.phase is Phase.ATTACHED else "Detach"
                self._send(key, body, step)

    def _protect(self, now: float) -> None:
        """Finalizers: the claim-protection finalizer on claims attached to a live VMI, the
        class-protection finalizer on classes, and the note on a claim whose deletion
        waits for its VMI."""
        due, self._protect_due = self._protect_due, set()
        for key in due:
            obj = self.view.claim(key)
            if obj is None or (keys.GPU_CLAIM.kind, key) in self._meta_writes:
                continue
            attached = (obj.get("status") or {}).get("attachedTo")
            vmi = self.view.vmi((key.namespace, attached)) if attached else None
            live = translate.vmi_live(obj, vmi, now, self.config.attachment_grace)
            body = lifecycle.claim_protection(obj, live)
            if body is not None:
                self._patch_meta(keys.GPU_CLAIM, key, body)
                continue
            cond = lifecycle.deletion_waits_condition(obj, now) if live else None
            if cond is not None and key not in self._deleting_noted:
                self._deleting_noted.add(key)
                current = (obj.get("status") or {}).get("conditions") or []
                if not lifecycle.same_condition(current, cond):
                    self._writer.claim_status(
                        key, lifecycle.condition_patch(obj, cond), NOTE_DELETING, Priority.STATUS
                    )
                    self._writer.event(obj, "DeletionWaitsForVMI", str(cond["message"]), False)
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        for obj in self.view.classes():
            class_key = ("", translate.name_of(obj))
            if (keys.GPU_CLASS.kind, class_key) in self._meta_writes:
                continue
            body = lifecycle.class_protection(obj, self.snapshot.holds_of_class(class_key[1]))
            if body is not None:
                self._patch_meta(keys.GPU_CLASS, class_key, body)

    def _patch_meta(self, kind: keys.ApiKind, key: Key, body: dict[str, Any]) -> None:
        """A metadata merge patch (finalizers) on the main resource of a claim or class."""
        namespace, name = key
        custom = self._writer.custom
        if kind.namespaced:

            def request() -> Any:
                return custom.patch_namespaced_custom_object(
                    kind.group,
                    kind.version,
                    namespace,
                    kind.plural,
                    name,
                    body,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
        else:

            def request() -> Any:
                return custom.patch_cluster_custom_object(
                    kind.group,
                    kind.version,
                    kind.plural,
                    name,
                    body,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )

        self._meta_writes.add((kind.kind, key))
        self._writer.call(f"meta/{kind.kind}", f"{namespace}/{name}", request, Priority.BIND)

    # --- the gate ----------------------------------------------------------------------

    def _start_set(self, pod: dict[str, Any]) -> tuple[Key, dict[str, Any], list[ClaimKey]] | None:
        """The VMI a launcher pod starts and the keys of its claims (held ones and those of
        its claim templates), or None when the pod is not one of ours."""
        vmi_name = gate.owning_vmi(pod)
        if vmi_name is None:
            return None
        vmi_key = (translate.namespace_of(pod), vmi_name)
        vmi = self.view.vmi_object(vmi_key)
        if vmi is None:
            return None
        ref = gate.claims_ref_of(vmi) or gate.ClaimsRef()
        names = [*ref.claims, *gate.template_claim_names(vmi_name, ref)]
        return vmi_key, vmi, [ClaimKey(vmi_key[0], n) for n in names]

    def _gate(self, now: float) -> None:
        """Gated launcher pods: create the template claims, place the whole set on one
        node, and pin and ungate the pod in one update once every claim is bound there."""
        for pod_key in self.view.gated_pods():
            pod = self.view.pod(pod_key)
            if pod is None or pod_key in self._pod_writes:
                continue
            found = self._start_set(pod)
            if found is None:
                continue  # its VMI is not known yet
            vmi_key, vmi, members = found
            if not members:
                self._pin(pod_key, pod, None, [])  # no claims to place: only ungate
                continue
            if self._create_templates(vmi, members):
                continue
            infos = [self.snapshot.claim(k) for k in members]
            if any(c is None for c in infos) or any(k in self._inflight for k in members):
                continue  # a claim not seen yet, or a write about one still out
            claims = [c for c in infos if c is not None]
            decision = self.snapshot.place_for_start(claims, now, self._allowed_nodes(pod))
            if isinstance(decision, Refusal):
                self._not_placed(pod_key, vmi, members, decision, now)
                continue
            target = decision.node
            moving = [c for c in claims if not (c.holds_node and c.node == target)]
            for claim in moving:
                obj = self.view.claim(claim.key)
                if obj is None:
                    continue
                updated = replace(claim, phase=Phase.BOUND, node=target, bound_at=now)
                step = Step.BIND if claim.phase is Phase.PENDING else Step.MOVE
                cond = lifecycle.condition(
                    keys.CONDITION_BOUND,
                    True,
                    "Bound" if step is Step.BIND else "Moved",
                    f"holds {claim.count} unit(s) of class {claim.class_name} on node {target} "
                    f"for the start of VMI {vmi_key[1]}",
                    now,
                )
                self.snapshot.upsert_claim(updated)
                self._send(claim.key, lifecycle.claim_status_patch(obj, updated, cond), str(step))
            if moving:
                continue  # pin once the API confirms every claim on the node
            if all(_bound_on(self.view.claim(k), target) for k in members):
                self._pin(pod_key, pod, target, members)

    def _create_templates(self, vmi: dict[str, Any], members: list[ClaimKey]) -> bool:
        """Create the VMI's template claims that do not exist yet; True while any is
        missing. Their budget and capacity are judged with the set, at placement."""
        ref = gate.claims_ref_of(vmi) or gate.ClaimsRef()
        missing = False
        custom = self._writer.custom
        for template in ref.templates:
            body = gate.template_claim(vmi, template)
            key = ClaimKey(translate.namespace_of(vmi), body["metadata"]["name"])
            if self.view.claim(key) is not None:
                continue
            missing = True
            if key in self._creating:
                continue

            def request(key: ClaimKey = key, body: dict[str, Any] = body) -> Any:
                try:
                    return custom.create_namespaced_custom_object(
                        keys.GPU_CLAIM.group,
                        keys.GPU_CLAIM.version,
                        key.namespace,
                        keys.GPU_CLAIM.plural,
                        body,
                        _request_timeout=REQUEST_TIMEOUT_S,
                    )
                except ApiException as exc:
                    if exc.status == 409:
                        return None  # created before: the watch brings it
                    raise

            self._creating.add(key)
            self._writer.call(
                "template-claim", f"{key.namespace}/{key.name}", request, Priority.BIND
            )
        return missing

    def _allowed_nodes(self, pod: dict[str, Any]) -> set[str] | None:
        """Nodes the pod's bound persistent volumes can be used from (a WaitForFirstConsumer
        volume bound by KubeVirt's temporary pod limits where the VM may start)."""
        uid = str(translate.meta(pod).get("uid"))
        if uid in self._volume_nodes:
            return self._volume_nodes[uid]
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in (pod.get("spec") or {}).get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")
        ]
        volumes = []
        core = self._writer.core
        for name in claims:
            try:
                pvc = core.read_namespaced_persistent_volume_claim(
                    name, translate.namespace_of(pod), _request_timeout=REQUEST_TIMEOUT_S
                )
                if pvc.spec and pvc.spec.volume_name:
                    pv = core.read_persistent_volume(
                        pvc.spec.volume_name, _request_timeout=REQUEST_TIMEOUT_S
                    )
                    volumes.append(self.api.sanitize_for_serialization(pv))
            except ApiException as exc:
                if exc.status != 404:
                    log.warning("volume %s of pod %s not read: %s", name, uid, exc.reason)
                    return None  # try again on a later pass, without caching
        allowed = gate.volume_nodes(volumes, self.view.raw[keys.NODE.kind].values())
        self._volume_nodes[uid] = allowed
        return allowed

    def _not_placed(
        self,
        pod_key: Key,
        vmi: dict[str, Any],
        members: list[ClaimKey],
        refusal: Refusal,
        now: float,
    ) -> None:
        """A set with nowhere to go keeps its pod gated; say so once per reason, on the
        claims (condition Placed) and on the VMI (a Warning event)."""
        said = f"{refusal.reason}: {refusal.message}"
        if self._gate_told.get(pod_key) == said:
            return
        self._gate_told[pod_key] = said
        message = f"the VM's GPU set cannot start anywhere yet: {refusal.message}"
        self._writer.event(vmi, "GPUSetNotPlaced", message, True, kind=keys.VMI)
        cond = lifecycle.condition(keys.CONDITION_PLACED, False, str(refusal.reason), message, now)
        for key in members:
            obj = self.view.claim(key)
            if obj is not None:
                self._writer.claim_status(
                    key, lifecycle.condition_patch(obj, cond), NOTE_PLACED, Priority.STATUS
                )

    def _pin(
        self, pod_key: Key, pod: dict[str, Any], node: str | None, members: list[ClaimKey]
    ) -> None:
        """The one pod update: pin to ``node`` (every required term gains the requirement)
        and remove the gate; without a node, only remove the gate."""
        body = gate.pin_and_ungate(pod, node) if node else gate.ungate(pod)
        core = self._writer.core

        def request() -> Any:
            return core.patch_namespaced_pod(
                pod_key[1],
                pod_key[0],
                body,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            ).json()

        self._pod_writes.add(pod_key)
        self._gate_told.pop(pod_key, None)
        self._writer.call("pod-pin", f"{pod_key[0]}/{pod_key[1]}", request, Priority.BIND)
        if node is None:
            return
        now = self.clock()
        message = f"launcher pod {pod_key[1]} pinned to node {node}"
        cond = lifecycle.condition(keys.CONDITION_PLACED, True, "Pinned", message, now)
        for key in members:
            obj = self.view.claim(key)
            if obj is not None and not lifecycle.same_condition(
                (obj.get("status") or {}).get("conditions") or [], cond
            ):
                self._writer.claim_status(
                    key, lifecycle.condition_patch(obj, cond), NOTE_PLACED, Priority.STATUS
                )

    def _refusals(self, now: float) -> None:
        """A pinned pod the scheduler refuses for lack of resources on a node that is Ready,
        uncordoned and still serves the set: delete the pod and record the node in every
        claim's rejectedNodes, so the next launcher pod goes elsewhere."""
        for pod_key in self.view.pinned_pods():
            pod = self.view.pod(pod_key)
            if pod is None or pod_key in self._pod_writes:
                continue
            found = self._start_set(pod)
            node = gate.pinned_node(pod)
            if found is None or node is None or not found[2]:
                continue
            _vmi_key, vmi, members = found
            claims = [c for k in members if (c := self.snapshot.claim(k)) is not None]
            if len(claims) != len(members) or any(k in self._inflight for k in members):
                continue
            classes = [self.snapshot.gpu_class(c.class_name) for c in claims]
            resources = {k.resource_name for k in classes if k is not None}
            message = gate.refused_for_resources(pod, resources)
            if message is None:
                continue
            stay = any(k is not None and k.on_cordon is OnCordon.STAY for k in classes)
            node_obj = self.view.node(node)
            if not gate.node_may_reject(node_obj, stay) or not all(
                self.snapshot.serves(node, c.class_name) for c in claims
            ):
                continue  # waiting for the node, not refused by it
            assert node_obj is not None
            self._rejected_health[node] = translate.node_health(node_obj)
            until = translate.rfc3339(now + self.config.rejection_ttl)
            for claim in claims:
                obj = self.view.claim(claim.key)
                if obj is None:
                    continue
                rejected = (*claim.rejected, RejectedNode(node, now + self.config.rejection_ttl))
                self.snapshot.upsert_claim(replace(claim, rejected=rejected))
                body = gate.rejection_patch(obj, node, until, translate.rfc3339(now))
                self._send(claim.key, body, "Reject")
            self._writer.event(
                vmi,
                "GPUNodeRejected",
                f"the scheduler refused launcher pod {pod_key[1]} on node {node} ({message}); "
                f"the pod is deleted and the VM's GPU set skips {node} until {until} or "
                "until the node's allocatable, taints or readiness change",
                True,
                kind=keys.VMI,
            )
            self._delete_pod(pod_key, pod)

    def _delete_pod(self, pod_key: Key, pod: dict[str, Any]) -> None:
        core = self._writer.core
        uid = translate.meta(pod).get("uid")

        def request() -> Any:
            try:
                core.delete_namespaced_pod(
                    pod_key[1],
                    pod_key[0],
                    body={"preconditions": {"uid": uid}},
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                ).release_conn()
            except ApiException as exc:
                if exc.status not in (404, 409):
                    raise
            return None

        self._pod_writes.add(pod_key)
        self._writer.call("pod-delete", f"{pod_key[0]}/{pod_key[1]}", request, Priority.BIND)

    def _forget_rejections(self, nodes: set[str]) -> None:
        """Nodes that refused a pinned pod and whose allocatable, taints or readiness changed
        since: their rejectedNodes entries go."""
        changed = []
        for node in nodes & set(self._rejected_health):
            node_obj = self.view.node(node)
            if node_obj is None or translate.node_health(node_obj) != self._rejected_health[node]:
                changed.append(node)
                del self._rejected_health[node]
        if not changed:
            return
        for claim in list(self.snapshot.claims()):
            if not any(r.node in changed for r in claim.rejected) or claim.key in self._inflight:
                continue
            obj = self.view.claim(claim.key)
            body = gate.without_rejections(obj, changed) if obj is not None else None
            if body is not None:
                kept = tuple(r for r in claim.rejected if r.node not in changed)
                self.snapshot.upsert_claim(replace(claim, rejected=kept))
                self._send(claim.key, body, "Unreject")

    def _release_stuck_vmis(self) -> None:
        """Delete a VMI pinned to a node that is gone before it ever ran there.

        Its launcher pod can never be scheduled, so it would hold its Lost claims forever;
        deleted, the VM starts again and its claims move with it.
        """
        for vmi_key, members in self.view.attachments():
            vmi = self.view.vmi(vmi_key)
            if vmi is None or vmi_key in self._vmi_deletes:
                continue
            if not lifecycle.vmi_never_ran(vmi):
                continue
            stuck = False
            for key in members:
                claim = self.view.claim(key)
                status = (claim or {}).get("status") or {}
                if (
                    status.get("phase") == Phase.LOST.value
                    and self.view.node(str(status.get("nodeName"))) is None
                ):
                    stuck = True
            if stuck:
                self._vmi_deletes.add(vmi_key)
                self._writer.delete_vmi(*vmi_key)

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
        if any(key in self._inflight for a in result.changes for key in a.claims):
            # A decision would change a claim whose write is still out: wait for it and
            # plan again, rather than act on a plan built on a decision not yet confirmed.
            self._changed = True
            return
        self._act(result, now)

    def _act(self, result: Plan, now: float) -> None:
        pending = 0
        self._note_budget = min(
            WAIT_NOTES_PER_S, self._note_budget + (now - self._note_refilled) * WAIT_NOTES_PER_S
        )
        self._note_refilled = now
        for action in result.actions:
            if action.step is Step.WAIT:
                pending += len(action.claims)
                if action.refusal is not None:
                    self._note_waiting(action, now)
                continue
            for key in action.claims:
                updated = result.updates.get(key)
                obj = self.view.claim(key)
                if updated is None or obj is None:
                    continue
                cond = lifecycle.action_condition(action, updated, now)
                body = lifecycle.claim_status_patch(obj, updated, cond)
                self.snapshot.upsert_claim(updated)
                self._send(key, body, str(action.step))
                self._waiting_written.pop(key, None)
                self._writer.event(
                    obj, str(cond["reason"]), str(cond["message"]), action.step is Step.LOSE
                )
        metrics.PENDING.set(pending)

    def _note_waiting(self, action: Action, now: float) -> None:
        """Say on each waiting claim why it waits, once per distinct reason.

        At most WAIT_NOTES_PER_S such writes a second, and none while a placement write is
        out: a burst of orders that do not fit must not take the API server's time from
        the binds. A note not written now is written on a later pass.
        """
        refusal = action.refusal
        if refusal is None or self._inflight or self._note_budget < 1:
            return  # placements first; the next pass (at most REPLAN_S away) says it
        said = (str(refusal.reason), refusal.message)
        cond = lifecycle.waiting_condition(refusal, now)
        for key in action.claims:
            if self._note_budget < 1:
                return
            if self._waiting_written.get(key) == said:
                continue
            obj = self.view.claim(key)
            if obj is None:
                continue
            self._waiting_written[key] = said
            if key not in self._counted_refusals:
                self._counted_refusals.add(key)
                metrics.REFUSALS.labels(str(refusal.reason)).inc()
            if not lifecycle.waiting_note_due(obj, cond):
                continue
            self._note_budget -= 1
            # Not a placement: queued behind every bind and not held in flight, so a burst
            # of refusals never delays or blocks a bind.
            self._writer.claim_status(
                key, lifecycle.waiting_patch(obj, cond), NOTE_WAIT, Priority.STATUS
            )

    def _send(self, key: ClaimKey, body: dict[str, Any], purpose: str) -> None:
        if not self.is_leader():
            return
        self._inflight.add(key)
        self._writer.claim_status(key, body, purpose, Priority.BIND)

    def _claim_written(self, done: ClaimWriteDone) -> None:
        if done.purpose in NOTES:
            if done.outcome is Outcome.WRITTEN and done.obj is not None:
                self._store_claim(done.key, done.obj)
            elif done.purpose == NOTE_WAIT:
                self._waiting_written.pop(done.key, None)
            else:
                self._protect_due.add(done.key)
            return
        self._inflight.discard(done.key)
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
        if done.what == "class-status":
            self._class_writes.discard(done.name)
            if done.ok and done.obj is not None:
                self.view.apply(keys.GPU_CLASS.kind, done.obj, deleted=False)
        elif done.what in ("record", "record-delete"):
            namespace, name = done.name.split("/", 1)
            self._record_writes.discard((namespace, name))
            if done.ok and done.obj is not None:
                self.view.apply(WORKLOAD_KIND, done.obj, deleted=False)
            elif done.ok and done.what == "record-delete":
                self.view.raw[WORKLOAD_KIND].pop((namespace, name), None)
        elif done.what == "vmi-delete":
            namespace, name = done.name.split("/", 1)
            if not done.ok:
                self._vmi_deletes.discard((namespace, name))
        elif done.what.startswith("meta/"):
            kind = done.what.removeprefix("meta/")
            namespace, name = done.name.split("/", 1)
            self._meta_writes.discard((kind, (namespace, name)))
            if done.ok and done.obj is not None:
                self.view.apply(kind, done.obj, deleted=False)
            elif not done.ok:
                log.info("finalizer of %s %s not written: %s", kind, done.name, done.error)
                if kind == keys.GPU_CLAIM.kind:
                    self._protect_due.add(ClaimKey(namespace, name))
        elif done.what in ("pod-pin", "pod-delete"):
            namespace, name = done.name.split("/", 1)
            self._pod_writes.discard((namespace, name))
            if done.ok and done.obj is not None:
                self.view.apply(keys.POD.kind, done.obj, deleted=False)
            elif not done.ok:
                log.warning("launcher pod %s not updated: %s", done.name, done.error)
        elif done.what == "template-claim":
            namespace, name = done.name.split("/", 1)
            self._creating.discard(ClaimKey(namespace, name))
            if done.ok and done.obj is not None:
                self.view.apply(keys.GPU_CLAIM.kind, done.obj, deleted=False)
            elif not done.ok:
                log.warning("template claim %s not created: %s", done.name, done.error)
        elif done.what == "gpunode-status":
            self._gpunode_writes.discard(done.name)
            if done.ok and done.obj is not None:
                self.view.apply(keys.GPU_NODE.kind, done.obj, deleted=False)
            elif not done.ok:
                self._gpunodes_due.add(done.name)
        elif done.what == "settings":
            self._settings_inflight = False
            if not done.ok:
                self._settings_written = None
                log.warning("settings ConfigMap not written: %s", done.error)

    # --- report ----------------------------------------------------------------------

    def _publish(self, now: float) -> None:
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        self._last_publish = now
        self._publish_class_status(now)
        self._publish_gpunode_conditions(now)
        self._publish_settings()
        if self.config.workload_records:
            self._publish_records()
        if now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self._publish_metrics()

    def _publish_class_status(self, now: float) -> None:
        for (_cluster_scope, name), obj in self.view.raw[keys.GPU_CLASS.kind].items():
            if name in self._class_writes:
                continue
            body = lifecycle.class_status_body(obj, self.snapshot.class_status(name), now)
            if body is not None:
                self._class_writes.add(name)
                self._writer.class_status(name, body)

    def _publish_gpunode_conditions(self, now: float) -> None:
        due, self._gpunodes_due = self._gpunodes_due, set()
        custom = self._writer.custom
        for name in due:
            gpunode = self.view.gpunode(name)
            if gpunode is None or name in self._gpunode_writes:
                if name in self._gpunode_writes:
                    self._gpunodes_due.add(name)  # look again once the write is back
                continue
            conditions = lifecycle.gpunode_conditions(
                self.view.node(name),
                gpunode,
                self.view.inventory_stale(name),
                self.config.inventory_stale_after,
                now,
            )
            body = lifecycle.gpunode_status_patch(gpunode, conditions)
            if body is None:
                continue

            def request(name: str = name, body: dict[str, Any] = body) -> Any:
                return custom.patch_cluster_custom_object_status(
                    keys.GPU_NODE.group,
                    keys.GPU_NODE.version,
                    keys.GPU_NODE.plural,
                    name,
                    body,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )

            self._gpunode_writes.add(name)
            self._writer.call("gpunode-status", name, request, Priority.STATUS)

    def _publish_settings(self) -> None:
        if self._settings_inflight:
            return
        data = lifecycle.settings_data(self.view.gpu_names, self.config.raw_resource_names)
        if data == self._settings_written:
            return
        self._settings_written = data
        self._settings_inflight = True
        self._writer.settings(self.config.namespace, data)

    def _publish_records(self) -> None:
        """One usage record per ordered Bound or Attached claim, as the API confirmed it."""
        wanted: dict[Key, dict[str, Any]] = {}
        for key, claim in self.view.claims():
            if lifecycle.wants_usage_record(claim):
                wanted[(key[0], lifecycle.workload_name(key[1]))] = claim
        existing = self.view.raw[WORKLOAD_KIND]
        for record_key, claim in wanted.items():
            if record_key in self._record_writes:
                continue
            have = existing.get(record_key)
            if have is None:
                self._record_writes.add(record_key)
                self._writer.create_record(record_key[0], lifecycle.usage_record(claim))
        for record_key, record in list(existing.items()):
            if record_key in wanted or record_key in self._record_writes:
                continue
            if lifecycle.owned_claim_name(record) is None:
                continue  # not ours
            self._record_writes.add(record_key)
            self._writer.delete_record(*record_key)

    def _publish_metrics(self) -> None:
        snap = self.snapshot
        published: set[tuple[str, str]] = set()
        for node in snap.nodes():
            for resource, capacity in node.capacity().items():
                published.add((node.name, resource))
                metrics.NODE_UNITS.labels(node.name, resource, "capacity").set(capacity)
                metrics.NODE_UNITS.labels(node.name, resource, "claimed").set(
                    snap.used(node.name, resource)
                )
                metrics.NODE_UNITS.labels(node.name, resource, "raw").set(
                    node.raw_used.get(resource, 0)
                )
        for gone in self._published_nodes - published:
            for state in ("capacity", "claimed", "raw"):
                metrics.NODE_UNITS.remove(*gone, state)
        self._published_nodes = published
        claimed: dict[tuple[str, str], int] = {}
        for claim in snap.claims():
            if claim.phase is not Phase.PENDING:
                k = (claim.class_name, claim.phase.value)
                claimed[k] = claimed.get(k, 0) + claim.count
        for gpu_class in snap.classes():
            capacity = sum(
                snap.capacity(node.name, gpu_class.resource_name)
                for node in snap.nodes()
                if snap.serves(node.name, gpu_class.name)
            )
            metrics.CLASS_CAPACITY.labels(gpu_class.name).set(capacity)
            metrics.CLASS_FREE.labels(gpu_class.name).set(snap.class_status(gpu_class.name).free)
            for phase in (Phase.BOUND, Phase.ATTACHED, Phase.LOST):
                metrics.CLASS_CLAIMED.labels(gpu_class.name, phase.value).set(
                    claimed.get((gpu_class.name, phase.value), 0)
                )


def _bound_on(claim: dict[str, Any] | None, node: str) -> bool:
    """The API has the claim bound (or attached) on ``node``."""
    status = (claim or {}).get("status") or {}
    return status.get("nodeName") == node and status.get("phase") in (
        Phase.BOUND.value,
        Phase.ATTACHED.value,
    )
