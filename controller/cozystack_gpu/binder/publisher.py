"""What the binder keeps true beside placement, and what it reports: finalizers on
classes and attached claims, GPUClass status, GPUNode conditions, the settings ConfigMap,
usage records and metrics. The bodies are built by the pure modules beside it
(``claim_status``, ``protection``, ``class_status``, ``records``, ``node_reports``); this is
their I/O, run from the binder's loop at most every ``PUBLISH_EVERY_S``.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder import claim_status, class_status, node_reports, protection, records
from cozystack_gpu.binder.part import BinderPart, PartHandle
from cozystack_gpu.binder.writer import REQUEST_TIMEOUT_S, Priority, WriteDone, WriteKind
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import EventReason, Phase
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import attachment, conditions, translate

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.25  # class status and usage records at most this often
METRICS_EVERY_S = 5.0
# The settings ConfigMap is written again this often even when its data did not change:
# the raw-name policy reads it, and a hand edit or a deletion must not last. Unchanged,
# the write is one request the API server answers without storing anything.
SETTINGS_REFRESH_S = 30.0
WORKLOAD_KIND = keys.WORKLOAD.kind
# Every template claim is judged again this often for a VMI that is gone: its VMI's end
# marks it for judging at once, but a claim whose metadata no longer names that VMI is found
# by this look.
TEMPLATE_SWEEP_S = 10.0


class Publisher(BinderPart):
    """Finalizers, statuses, records, settings and metrics, with the writes in flight."""

    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._class_writes: set[str] = set()
        self._record_writes: set[Key] = set()
        self._meta_writes: set[tuple[str, Key]] = set()  # finalizer patches in flight
        self._protect_due: set[ClaimKey] = set()  # claims whose finalizer may have to change
        self._claim_deletes: set[ClaimKey] = set()  # left-over template claims being deleted
        self._left_over_at: dict[ClaimKey, float] = {}  # too young to judge until then
        self._last_sweep = 0.0
        self._deleting_noted: set[ClaimKey] = set()
        self._withdrawal_noted: set[ClaimKey] = set()  # told their class is being deleted
        self._gpunodes_due: set[str] = set()  # GPUNodes whose conditions may have to change
        self._gpunode_writes: set[str] = set()
        self._published_nodes: set[tuple[str, str]] = set()  # (node, resource) in metrics
        self._stale_published: set[str] = set()  # nodes in the inventory-stale metric
        self._settings_written: dict[str, str] | None = None
        self._settings_at = 0.0
        self._settings_inflight = False
        # After a failed settings write (RBAC lost, the server refusing): the next try
        # waits 1, 2, 4 ... s, at most SETTINGS_REFRESH_S, instead of every publish turn.
        self._settings_failures = 0
        self._settings_retry_at = 0.0
        self._last_publish = 0.0
        self._last_metrics = 0.0

    def changed(self, claims: set[ClaimKey], nodes: set[str]) -> None:
        """Claims and nodes read into the model again: their finalizers and GPUNode
        conditions may have to change."""
        self._protect_due |= claims
        self._gpunodes_due |= nodes

    def written(self, done: WriteDone) -> None:
        what = done.what
        if what is WriteKind.CLASS_STATUS:
            self._class_writes.discard(done.name)
            if done.ok and done.obj is not None:
                self.view.apply(keys.GPU_CLASS.kind, done.obj, deleted=False)
        elif what in (WriteKind.RECORD, WriteKind.RECORD_DELETE):
            self._record_writes.discard(done.key)
            if done.obj is not None:  # written, or read again after a conflict
                self.view.apply(WORKLOAD_KIND, done.obj, deleted=False)
            elif done.ok and what is WriteKind.RECORD_DELETE:
                self.view.raw[WORKLOAD_KIND].pop(done.key, None)
        elif what is WriteKind.FINALIZER:
            kind = done.object_kind
            self._meta_writes.discard((kind, done.key))
            if done.ok and done.obj is not None:
                self.view.apply(kind, done.obj, deleted=False)
            elif not done.ok:
                # A conflict is the VMI webhook writing the same finalizer at attach time:
                # the next look finds it there.
                level = logging.DEBUG if done.error.startswith("409") else logging.INFO
                log.log(level, "finalizer of %s %s not written: %s", kind, done.path, done.error)
                if kind == keys.GPU_CLAIM.kind:
                    self._protect_due.add(ClaimKey(*done.key))
        elif what is WriteKind.CLAIM_DELETE:
            key = ClaimKey(*done.key)
            self._claim_deletes.discard(key)
            if not done.ok:
                log.warning("left-over template claim %s not deleted: %s", done.path, done.error)
                self._protect_due.add(key)
        elif what is WriteKind.GPUNODE_STATUS:
            self._gpunode_writes.discard(done.name)
            if done.ok and done.obj is not None:
                self.view.apply(keys.GPU_NODE.kind, done.obj, deleted=False)
            elif not done.ok:
                self._gpunodes_due.add(done.name)
        elif what is WriteKind.SETTINGS:
            self._settings_inflight = False
            metrics.SETTINGS_WRITE_FAILING.set(0 if done.ok else 1)
            if done.ok:
                self._settings_failures = 0
            else:
                self._settings_written = None
                self._settings_failures += 1
                wait = min(SETTINGS_REFRESH_S, 2.0 ** (self._settings_failures - 1))
                self._settings_retry_at = self._settings_at + wait
                log.warning(
                    "settings ConfigMap not written: %s (try %d; the next in %.0f s)",
                    done.error,
                    self._settings_failures,
                    wait,
                )

    def note_failed(self, key: ClaimKey) -> None:
        """A Deleting or OfferWithdrawn note did not reach the claim: judge it again."""
        self._protect_due.add(key)
        self._withdrawal_noted.discard(key)

    def protect(self, now: float) -> None:
        """Finalizers: the claim-protection finalizer on claims attached to a live VMI, the
        class-protection finalizer on classes, and the note on a claim whose deletion
        waits for its VMI."""
        due, self._protect_due = self._protect_due, set()
        due |= self._template_claims_due(now)
        for key in due:
            obj = self.view.claim(key)
            if obj is None:
                continue
            self._delete_if_left_over(key, obj, now)
            if (keys.GPU_CLAIM.kind, key) in self._meta_writes:
                continue
            vmi = self.view.attached_vmi(key)
            seen = self.view.attachment_seen_at(key, now)
            live = attachment.vmi_live(obj, vmi, now, self.config.attachment_grace, seen)
            owner_live = self.view.template_owner_live(key)
            body = protection.claim_protection(obj, live, owner_live=owner_live)
            if body is not None:
                self._patch_meta(keys.GPU_CLAIM, key, body)
                continue
            cond = protection.deletion_waits_condition(obj, now) if live else None
            if cond is not None and key not in self._deleting_noted:
                self._deleting_noted.add(key)
                current = (obj.get("status") or {}).get("conditions") or []
                if not conditions.same_condition(current, cond):
                    self.writer.claim_status(
                        key,
                        claim_status.condition_patch(obj, cond),
                        claim_status.NOTE_DELETING,
                        Priority.STATUS,
                    )
                    self.writer.event(
                        obj, EventReason.DELETION_WAITS.value, str(cond["message"]), False
                    )
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        for obj in self.view.classes():
            class_key = ("", translate.name_of(obj))
            if (keys.GPU_CLASS.kind, class_key) in self._meta_writes:
                continue
            body = protection.class_protection(obj, self.snapshot.holds_of_class(class_key[1]))
            if body is not None:
                self._patch_meta(keys.GPU_CLASS, class_key, body)

    def _template_claims_due(self, now: float) -> set[ClaimKey]:
        """Template claims whose wait to be judged ran out, and every one at each sweep."""
        due = {key for key, at in self._left_over_at.items() if at <= now}
        for key in due:
            del self._left_over_at[key]
        if now - self._last_sweep >= TEMPLATE_SWEEP_S:
            self._last_sweep = now
            due |= {key for key, obj in self.view.claims() if translate.made_by_template(obj)}
        return due

    def _delete_if_left_over(self, key: ClaimKey, obj: dict[str, Any], now: float) -> None:
        """Delete a template claim whose VMI is gone (``protection.template_left_over``)."""
        if key in self._claim_deletes:
            return
        verdict = protection.template_left_over(
            obj,
            lambda uid: self.view.vmi_uid_exists(key.namespace, uid),
            now,
            self.config.attachment_grace,
        )
        if verdict is None:
            self._left_over_at.pop(key, None)
        elif verdict.judge_at is not None:
            self._left_over_at[key] = verdict.judge_at
        elif verdict.delete is not None:
            self._claim_deletes.add(key)
            uid = str(translate.meta(obj).get("uid") or "")
            self.writer.delete_claim(key.namespace, key.name, uid, verdict.delete)

    def _patch_meta(self, kind: keys.ApiKind, key: Key, body: dict[str, Any]) -> None:
        """A metadata merge patch (finalizers) on the main resource of a claim or class."""
        namespace, name = key
        custom = self.writer.custom
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
        self.writer.call(WriteKind.FINALIZER, namespace, name, request, object_kind=kind.kind)

    def publish(self, now: float) -> None:
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        self._last_publish = now
        self._publish_class_status(now)
        self._publish_gpunode_conditions(now)
        self._publish_settings(now)
        if self.config.workload_records:
            self._publish_records()
        if now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self._publish_metrics()

    def _publish_class_status(self, now: float) -> None:
        for (_cluster_scope, name), obj in self.view.raw[keys.GPU_CLASS.kind].items():
            kept = False
            if protection.deleting(obj):
                self._note_withdrawal(name, now)
                kept = self._kept(name)
            if name in self._class_writes:
                continue
            numbers = self.snapshot.class_status(name)
            body = class_status.class_status_body(obj, numbers, now, kept)
            if body is not None:
                self._class_writes.add(name)
                self.writer.class_status(name, body)

    def _kept(self, class_name: str) -> bool:
        """Whether a claim of the class still holds its units, for the class's condition."""
        for key in self.snapshot.claims_of_class(class_name):
            claim = self.snapshot.claim(key)
            if claim is not None and claim.phase in class_status.KEEPING_PHASES:
                return True
        return False

    def _note_withdrawal(self, class_name: str, now: float) -> None:
        """Tell each claim of a class being deleted, once, that the offer is withdrawn: the
        tenant reads its claims, not the hoster's plans."""
        for key in self.snapshot.claims_of_class(class_name):
            if key in self._withdrawal_noted:
                continue
            obj = self.view.claim(key)
            claim = self.snapshot.claim(key)
            if obj is None or claim is None:
                continue
            self._withdrawal_noted.add(key)
            cond = class_status.withdrawal_condition(class_name, claim.phase, now)
            current = (obj.get("status") or {}).get("conditions") or []
            if not conditions.same_condition(current, cond):
                self.writer.claim_status(
                    key,
                    claim_status.condition_patch(obj, cond),
                    claim_status.NOTE_WITHDRAWN,
                    Priority.STATUS,
                )

    def _publish_gpunode_conditions(self, now: float) -> None:
        due, self._gpunodes_due = self._gpunodes_due, set()
        custom = self.writer.custom
        for name in due:
            gpunode = self.view.gpunode(name)
            if gpunode is None or name in self._gpunode_writes:
                if name in self._gpunode_writes:
                    self._gpunodes_due.add(name)  # look again once the write is back
                continue
            wanted = node_reports.gpunode_conditions(
                self.view.node(name),
                gpunode,
                self.view.inventory_stale(name),
                self.config.inventory_stale_after,
                now,
            )
            body = node_reports.gpunode_status_patch(gpunode, wanted)
            if body is None:
                continue

            request = partial(
                custom.patch_cluster_custom_object_status,
                keys.GPU_NODE.group,
                keys.GPU_NODE.version,
                keys.GPU_NODE.plural,
                name,
                body,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            self._gpunode_writes.add(name)
            self.writer.call(WriteKind.GPUNODE_STATUS, "", name, request)

    def _publish_settings(self, now: float) -> None:
        if self._settings_inflight or now < self._settings_retry_at:
            return
        data = node_reports.settings_data(self.view.gpu_names, self.config.raw_resource_names)
        if data == self._settings_written and now - self._settings_at < SETTINGS_REFRESH_S:
            return
        self._settings_written, self._settings_at = data, now
        self._settings_inflight = True
        self.writer.settings(self.config.namespace, data)

    def _publish_records(self) -> None:
        """One usage record per ordered Bound or Attached claim, as the API confirmed it."""
        wanted: dict[Key, dict[str, Any]] = {}
        for key, claim in self.view.claims():
            if records.wants_usage_record(claim):
                wanted[(key[0], records.workload_name(key[1]))] = claim
        existing = self.view.raw[WORKLOAD_KIND]
        for record_key, claim in wanted.items():
            if record_key in self._record_writes:
                continue
            have = existing.get(record_key)
            if have is None:
                self._record_writes.add(record_key)
                self.writer.create_record(record_key[0], records.usage_record(claim))
            elif records.owned_claim_name(have) == translate.name_of(claim):
                # Billing reads the status: one edited or never written is written back.
                repair = records.status_repair(have, claim)
                if repair is not None:
                    log.info(
                        "usage record %s/%s: its status is not its claim's; writing it back",
                        *record_key,
                    )
                    self._record_writes.add(record_key)
                    self.writer.record_status(*record_key, repair)
        for record_key, record in list(existing.items()):
            if record_key in wanted or record_key in self._record_writes:
                continue
            if records.owned_claim_name(record) is None:
                continue  # not ours
            self._record_writes.add(record_key)
            self.writer.delete_record(*record_key)

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
        names: set[str] = set()
        for node in snap.nodes():
            names.add(node.name)
            metrics.NODE_INVENTORY_STALE.labels(node.name).set(1 if node.inventory_stale else 0)
        for gone_name in self._stale_published - names:
            metrics.NODE_INVENTORY_STALE.remove(gone_name)
        self._stale_published = names
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
