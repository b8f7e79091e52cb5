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
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes import client

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder import lifecycle, translate
from cozystack_gpu.binder.translate import VMIState, meta, name_of, namespace_of
from cozystack_gpu.binder.writer import ClaimWriteDone, Outcome, Priority, WriteDone, Writer
from cozystack_gpu.config import Config
from cozystack_gpu.informer import Event, EventType, Informer, Source, sources
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import Action, ClaimKey, Plan, Snapshot, Step, plan

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

Key = tuple[str, str]  # (namespace, name); cluster-scoped objects use ("", name)

WORKLOAD_KIND = "Workload"
KINDS = (
    "Node",
    "GPUNode",
    "GPUClass",
    "GPUClaim",
    "Namespace",
    "ResourceQuota",
    "Pod",
    "VirtualMachineInstance",
    "VirtualMachine",
)


def _key(obj: dict[str, Any]) -> Key:
    return (namespace_of(obj), name_of(obj))


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
        self._stop = threading.Event()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer = Writer(api, self._queue, config.write_workers)
        lists = sources(api)
        custom = client.CustomObjectsApi(api)

        def list_workloads(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(
                keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, keys.WORKLOAD_PLURAL, **kwargs
            )

        self._kinds = KINDS + ((WORKLOAD_KIND,) if config.workload_records else ())
        self._informers = [
            Informer(api, Source(kind, lists[kind]), self._queue, self._stop) for kind in KINDS
        ]
        if config.workload_records:
            self._informers.append(
                Informer(api, Source(WORKLOAD_KIND, list_workloads), self._queue, self._stop)
            )
        self._thread = threading.Thread(target=self._run, name="binder", daemon=True)

        # Raw objects by kind, as the API has them (or as our own writes returned them).
        self.raw: dict[str, dict[Key, dict[str, Any]]] = {kind: {} for kind in self._kinds}
        self._listed: set[str] = set()
        # Derived indexes.
        self._pods: dict[Key, translate.PodUsage] = {}
        self._pods_on_node: dict[str, set[Key]] = {}
        self._pods_in_ns: dict[str, set[Key]] = {}
        self._quotas_in_ns: dict[str, set[Key]] = {}
        self._vmis: dict[Key, VMIState] = {}
        self._claim_vmi: dict[ClaimKey, str] = {}
        self._claim_vm: dict[ClaimKey, str] = {}
        self._attached: dict[Key, set[ClaimKey]] = {}
        self._gpu_names: frozenset[str] = frozenset(config.extra_resource_names)
        # Model and what must be re-read into it.
        self.snapshot = Snapshot()
        self._dirty_nodes: set[str] = set()
        self._dirty_classes: set[str] = set()
        self._dirty_claims: set[ClaimKey] = set()
        self._dirty_namespaces: set[str] = set()
        # Writes in flight.
        self._inflight: set[ClaimKey] = set()
        self._class_writes: set[str] = set()
        self._record_writes: set[Key] = set()
        self._vmi_deletes: set[Key] = set()
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
                    if self._listed >= set(self._kinds):
                        self._initial_build()
                    else:
                        continue
                if not self.is_leader():
                    continue
                self.stats.loops += 1
                now = self.clock()
                self._flush()
                self._attachments(now)
                self._decide(now)
                self._release_stuck_vmis()
                self._publish(now)
        except Exception:
            log.exception("binder loop failed; stopping so a fresh one can start")
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
                self._listed.add(item.kind)
                self._relist(item.kind, item.objects)
            elif item.obj is not None:
                self._apply(item.kind, item.obj, deleted=item.type is EventType.DELETED)
        elif isinstance(item, ClaimWriteDone):
            self._claim_written(item)
        elif isinstance(item, WriteDone):
            self._written(item)

    def _relist(self, kind: str, objects: Iterable[dict[str, Any]]) -> None:
        fresh = {_key(o): o for o in objects}
        for key in list(self.raw[kind]):
            if key not in fresh:
                self._apply(kind, self.raw[kind][key], deleted=True)
        for obj in fresh.values():
            self._apply(kind, obj, deleted=False)

    def _apply(self, kind: str, obj: dict[str, Any], *, deleted: bool) -> None:
        key = _key(obj)
        store = self.raw[kind]
        old = store.get(key)
        if (
            not deleted
            and old is not None
            and translate.resource_version(obj) < translate.resource_version(old)
        ):
            return  # an event older than what we already know (e.g. our own write)
        if deleted:
            store.pop(key, None)
        else:
            store[key] = obj
        handler = getattr(self, "_on_" + kind, None)
        if handler is not None:
            handler(key, old, None if deleted else obj)

    def _on_Node(self, key: Key, old: Any, new: Any) -> None:
        self._dirty_nodes.add(key[1])

    def _on_GPUNode(self, key: Key, old: Any, new: Any) -> None:
        self._dirty_nodes.add(key[1])
        self._refresh_gpu_names()

    def _on_GPUClass(self, key: Key, old: Any, new: Any) -> None:
        self._dirty_classes.add(key[1])
        self._refresh_gpu_names()

    def _on_GPUClaim(self, key: Key, old: Any, new: Any) -> None:
        claim_key = ClaimKey(*key)
        for obj, add in ((old, False), (new, True)):
            target = ((obj or {}).get("status") or {}).get("attachedTo")
            if target:
                index = self._attached.setdefault((key[0], target), set())
                (index.add if add else index.discard)(claim_key)
        self._dirty_claims.add(claim_key)

    def _on_Namespace(self, key: Key, old: Any, new: Any) -> None:
        self._dirty_namespaces.add(key[1])

    def _on_ResourceQuota(self, key: Key, old: Any, new: Any) -> None:
        members = self._quotas_in_ns.setdefault(key[0], set())
        (members.add if new is not None else members.discard)(key)
        self._dirty_namespaces.add(key[0])

    def _on_Pod(self, key: Key, old: Any, new: Any) -> None:
        previous = self._pods.pop(key, None)
        if previous is not None:
            if previous.node:
                self._pods_on_node.get(previous.node, set()).discard(key)
                self._dirty_nodes.add(previous.node)
            self._pods_in_ns.get(previous.namespace, set()).discard(key)
            self._dirty_namespaces.add(previous.namespace)
        usage = translate.pod_usage(new) if new is not None else None
        if usage is None:
            return
        self._pods[key] = usage
        if usage.node:
            self._pods_on_node.setdefault(usage.node, set()).add(key)
            self._dirty_nodes.add(usage.node)
        self._pods_in_ns.setdefault(usage.namespace, set()).add(key)
        self._dirty_namespaces.add(usage.namespace)

    def _on_VirtualMachineInstance(self, key: Key, old: Any, new: Any) -> None:
        namespace = key[0]
        before = self._vmis.pop(key, None)
        touched: set[ClaimKey] = set(self._attached.get(key, set()))
        if before is not None:
            for claim in before.held_claims:
                claim_key = ClaimKey(namespace, claim)
                if self._claim_vmi.get(claim_key) == key[1]:
                    del self._claim_vmi[claim_key]
                touched.add(claim_key)
        if new is not None:
            state = translate.vmi_state(new)
            self._vmis[key] = state
            for claim in state.held_claims:
                claim_key = ClaimKey(namespace, claim)
                self._claim_vmi[claim_key] = key[1]
                touched.add(claim_key)
        # Template claims are owned by their VMI: their set id does not change, but their
        # liveness does.
        self._dirty_claims |= touched

    def _on_VirtualMachine(self, key: Key, old: Any, new: Any) -> None:
        namespace = key[0]
        touched: set[ClaimKey] = set()
        for obj in (old, new):
            if obj is None:
                continue
            for claim in translate.vm_held_claims(obj):
                touched.add(ClaimKey(namespace, claim))
        for claim_key in touched:
            if self._claim_vm.get(claim_key) == key[1]:
                del self._claim_vm[claim_key]
        if new is not None:
            for claim in translate.vm_held_claims(new):
                self._claim_vm[ClaimKey(namespace, claim)] = key[1]
        self._dirty_claims |= touched

    def _refresh_gpu_names(self) -> None:
        names = set(self.config.extra_resource_names)
        for gpu_class in self.raw["GPUClass"].values():
            resource = translate.class_resource_name(gpu_class)
            if resource:
                names.add(resource)
        for gpunode in self.raw["GPUNode"].values():
            names.update((gpunode.get("status") or {}).get("resourceNames") or [])
        fresh = frozenset(names)
        if fresh != self._gpu_names:
            self._gpu_names = fresh
            # Raw-name usage is counted over GPU names only: re-read every user of it.
            self._dirty_nodes |= set(self._pods_on_node)
            self._dirty_namespaces |= set(self._pods_in_ns)

    # --- model inputs ----------------------------------------------------------------

    def _node_info(self, name: str) -> Any:
        node = self.raw["Node"].get(("", name))
        if node is None:
            return None
        usage = [self._pods[k] for k in self._pods_on_node.get(name, ())]
        return translate.node_info(
            node, self.raw["GPUNode"].get(("", name)), translate.sum_usage(usage, self._gpu_names)
        )

    def _namespace_info(self, name: str) -> Any:
        namespace = self.raw["Namespace"].get(("", name))
        if namespace is None:
            return None
        quotas = [self.raw["ResourceQuota"][k] for k in self._quotas_in_ns.get(name, ())]
        usage = [self._pods[k] for k in self._pods_in_ns.get(name, ())]
        return translate.namespace_info(
            namespace, quotas, translate.sum_usage(usage, self._gpu_names)
        )

    def _claim_info(self, key: ClaimKey, now: float) -> Any:
        obj = self.raw["GPUClaim"].get(key)
        if obj is None:
            return None
        attached = (obj.get("status") or {}).get("attachedTo")
        vmi = self._vmis.get((key.namespace, attached)) if attached else None
        return translate.claim_info(
            obj,
            vmi_live_now=translate.vmi_live(obj, vmi, now, self.config.attachment_grace),
            set_id=translate.set_id_for(obj, self._claim_vmi.get(key), self._claim_vm.get(key)),
        )

    def _initial_build(self) -> None:
        now = self.clock()
        started = time.perf_counter()
        self.snapshot = Snapshot.build(
            nodes=[n for name in self._names("Node") if (n := self._node_info(name))],
            classes=[translate.class_info(c) for c in self.raw["GPUClass"].values()],
            claims=[c for k in self.raw["GPUClaim"] if (c := self._claim_info(ClaimKey(*k), now))],
            namespaces=[
                n for name in self._names("Namespace") if (n := self._namespace_info(name))
            ],
        )
        self._dirty_nodes.clear()
        self._dirty_classes.clear()
        self._dirty_claims.clear()
        self._dirty_namespaces.clear()
        self.synced.set()
        log.info(
            "binder synced: %d nodes, %d classes, %d claims in %.3f s",
            len(self.raw["Node"]),
            len(self.raw["GPUClass"]),
            len(self.raw["GPUClaim"]),
            time.perf_counter() - started,
        )

    def _names(self, kind: str) -> list[str]:
        return [name for _namespace, name in self.raw[kind]]

    def _flush(self) -> None:
        """Bring the snapshot up to date with every object changed since the last pass.

        Only a change of what the model reads asks for a new plan: the echo of a condition
        the binder wrote itself, or a label the model ignores, does not.
        """
        now = self.clock()
        snap = self.snapshot

        def class_info(name: str) -> Any:
            obj = self.raw["GPUClass"].get(("", name))
            return None if obj is None else translate.class_info(obj)

        changed = _sync(
            self._dirty_classes, class_info, snap.gpu_class, snap.upsert_class, snap.remove_class
        )
        changed |= _sync(
            self._dirty_namespaces,
            self._namespace_info,
            snap.namespace,
            snap.upsert_namespace,
            snap.remove_namespace,
        )
        changed |= _sync(
            self._dirty_nodes, self._node_info, snap.node, snap.upsert_node, snap.remove_node
        )
        held: set[ClaimKey] = set()
        for key in self._dirty_claims:
            if key in self._inflight:
                held.add(key)  # keep the decision sent until its write returns
                continue
            claim = self._claim_info(key, now)
            if claim is None:
                changed |= snap.claim(key) is not None
                snap.remove_claim(key)
                self._waiting_written.pop(key, None)
            elif snap.claim(key) != claim:
                snap.upsert_claim(claim)
                changed = True
        self._dirty_classes.clear()
        self._dirty_namespaces.clear()
        self._dirty_nodes.clear()
        self._dirty_claims = held
        if changed:
            self._changed = True

    # --- decide and write ------------------------------------------------------------

    def _attachments(self, now: float) -> None:
        """Bound ⇄ Attached transitions, and attachments that never saw their VMI."""
        grace = self.config.attachment_grace
        for (namespace, vmi_name), members in list(self._attached.items()):
            vmi = self._vmis.get((namespace, vmi_name))
            for key in list(members):
                if key in self._inflight:
                    continue
                obj = self.raw["GPUClaim"].get(key)
                if obj is None:
                    continue
                change = lifecycle.attachment_change(obj, vmi, now, grace)
                if change is None:
                    continue
                body = lifecycle.attachment_patch(obj, change, now)
                info = self._claim_info(key, now)
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

    def _release_stuck_vmis(self) -> None:
        """Delete a VMI pinned to a node that is gone before it ever ran there.

        Its launcher pod can never be scheduled, so it would hold its Lost claims forever;
        deleted, the VM starts again and its claims move with it.
        """
        nodes = self.raw["Node"]
        for (namespace, vmi_name), members in self._attached.items():
            vmi = self._vmis.get((namespace, vmi_name))
            if vmi is None or (namespace, vmi_name) in self._vmi_deletes:
                continue
            if not lifecycle.vmi_never_ran(vmi):
                continue
            stuck = False
            for key in members:
                claim = self.raw["GPUClaim"].get(key)
                status = (claim or {}).get("status") or {}
                if (
                    status.get("phase") == Phase.LOST.value
                    and ("", status.get("nodeName")) not in nodes
                ):
                    stuck = True
            if stuck:
                self._vmi_deletes.add((namespace, vmi_name))
                self._writer.delete_vmi(namespace, vmi_name)

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
                obj = self.raw["GPUClaim"].get(key)
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
            obj = self.raw["GPUClaim"].get(key)
            if obj is None:
                continue
            self._waiting_written[key] = said
            if key not in self._counted_refusals:
                self._counted_refusals.add(key)
                metrics.REFUSALS.labels(str(refusal.reason)).inc()
            current = (obj.get("status") or {}).get("conditions") or []
            if lifecycle.same_condition(current, cond):
                continue
            self._note_budget -= 1
            # Not a placement: queued behind every bind and not held in flight, so a burst
            # of refusals never delays or blocks a bind.
            self._writer.claim_status(
                key, lifecycle.condition_patch(obj, cond), "Wait", Priority.STATUS
            )

    def _send(self, key: ClaimKey, body: dict[str, Any], purpose: str) -> None:
        if not self.is_leader():
            return
        self._inflight.add(key)
        self._writer.claim_status(key, body, purpose, Priority.BIND)

    def _claim_written(self, done: ClaimWriteDone) -> None:
        if done.purpose == "Wait":
            if done.outcome is Outcome.WRITTEN and done.obj is not None:
                self._store_claim(done.key, done.obj)
            else:
                self._waiting_written.pop(done.key, None)
            return
        self._inflight.discard(done.key)
        self._dirty_claims.add(done.key)
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
            self._apply(
                "GPUClaim",
                {"metadata": {"namespace": done.key.namespace, "name": done.key.name}},
                deleted=True,
            )
        else:
            self.stats.conflicts += 1
            metrics.WRITE_CONFLICTS.inc()
            if done.obj is not None:
                self._store_claim(done.key, done.obj)

    def _store_claim(self, key: ClaimKey, obj: dict[str, Any]) -> None:
        obj.setdefault("kind", keys.KIND_CLAIM)
        self._apply("GPUClaim", obj, deleted=False)

    def _written(self, done: WriteDone) -> None:
        if done.what == "class-status":
            self._class_writes.discard(done.name)
            if done.ok and done.obj is not None:
                self._apply("GPUClass", done.obj, deleted=False)
        elif done.what in ("record", "record-delete"):
            namespace, name = done.name.split("/", 1)
            self._record_writes.discard((namespace, name))
            if done.ok and done.obj is not None:
                self._apply(WORKLOAD_KIND, done.obj, deleted=False)
            elif done.ok and done.what == "record-delete":
                self.raw[WORKLOAD_KIND].pop((namespace, name), None)
        elif done.what == "vmi-delete":
            namespace, name = done.name.split("/", 1)
            if not done.ok:
                self._vmi_deletes.discard((namespace, name))
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
        self._publish_settings()
        if self.config.workload_records:
            self._publish_records()
        if now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self._publish_metrics()

    def _publish_class_status(self, now: float) -> None:
        for (_cluster_scope, name), obj in self.raw["GPUClass"].items():
            if name in self._class_writes:
                continue
            body = lifecycle.class_status_body(obj, self.snapshot.class_status(name), now)
            if body is not None:
                self._class_writes.add(name)
                self._writer.class_status(name, body)

    def _publish_settings(self) -> None:
        if self._settings_inflight:
            return
        data = lifecycle.settings_data(
            (translate.class_resource_name(c) for c in self.raw["GPUClass"].values()),
            (
                name
                for n in self.raw["GPUNode"].values()
                for name in (n.get("status") or {}).get("resourceNames") or []
            ),
            self.config.extra_resource_names,
            self.config.raw_resource_names,
        )
        if data == self._settings_written:
            return
        self._settings_written = data
        self._settings_inflight = True
        self._writer.settings(self.config.namespace, data)

    def _publish_records(self) -> None:
        """One usage record per ordered Bound or Attached claim, as the API confirmed it."""
        wanted: dict[Key, dict[str, Any]] = {}
        for key, claim in self.raw["GPUClaim"].items():
            if lifecycle.wants_usage_record(claim):
                wanted[(key[0], lifecycle.workload_name(key[1]))] = claim
        existing = self.raw[WORKLOAD_KIND]
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


def _sync(
    names: Iterable[str],
    build: Callable[[str], Any],
    current: Callable[[str], Any],
    upsert: Callable[[Any], None],
    remove: Callable[[str], None],
) -> bool:
    """Bring one kind of model input up to date; True when the model saw a change."""
    changed = False
    for name in names:
        fresh = build(name)
        if fresh is None:
            changed |= current(name) is not None
            remove(name)
        elif current(name) != fresh:
            upsert(fresh)
            changed = True
    return changed
