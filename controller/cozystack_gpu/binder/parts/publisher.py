"""What the binder keeps true beside placement, and what it reports: finalizers on
classes and attached claims, GPUClass status, GPUNode conditions, the settings ConfigMap,
usage records and metrics. The bodies are built by the pure modules beside it
(``claim_status``, ``protection``, ``class_status``, ``records``, ``node_reports``); this is
their I/O, run from the binder's loop at most every ``PUBLISH_EVERY_S``.
"""

from __future__ import annotations

import logging
from typing import Any

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.claims import ClaimNote, Note
from cozystack_gpu.binder.calls.reports import (
    ClassStatus,
    Finalizer,
    GpuNodeStatus,
    RecordCreate,
    RecordDelete,
    RecordMeta,
    RecordStatus,
    Settings,
)
from cozystack_gpu.binder.calls.start_path import ClaimDelete
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules import claim_status, class_status, node_reports, protection, records
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import EventReason, Phase
from cozystack_gpu.model import ClaimKey, booked_by_class
from cozystack_gpu.objects import attachment, conditions, translate

log = logging.getLogger(__name__)

PUBLISH_EVERY_S = 0.25  # class status and usage records at most this often
METRICS_EVERY_S = 5.0
# The settings ConfigMap is written again this often even when its data did not change:
# the raw-name policy reads it, and a hand edit or a deletion must not last. Unchanged,
# the write is one request the API server answers without storing anything.
SETTINGS_REFRESH_S = 30.0
# Every template claim is judged again this often for a VMI that is gone: its VMI's end
# marks it for judging at once, but a claim whose metadata no longer names that VMI is found
# by this look.
TEMPLATE_SWEEP_S = 10.0


class Publisher(BinderPart):
    """Finalizers, statuses, records, settings and metrics, and what is due to be judged."""

    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._protect_due: set[ClaimKey] = set()  # claims whose finalizer may have to change
        self._left_over_at: dict[ClaimKey, float] = {}  # too young to judge until then
        self._last_sweep = 0.0
        self._deleting_noted: set[ClaimKey] = set()
        self._withdrawal_noted: set[ClaimKey] = set()  # told their class is being deleted
        self._gpunodes_due: set[str] = set()  # GPUNodes whose conditions may have to change
        self._published_nodes: set[tuple[str, str]] = set()  # (node, resource) in metrics
        self._stale_published: set[str] = set()  # nodes in the inventory-stale metric
        self._settings_written: dict[str, str] | None = None
        self._settings_at = 0.0
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

    def took_over(self) -> None:
        """The binder leads from now: every claim being deleted is judged for its
        finalizer, as no watch event may bring it again (deleted while no replica led, or
        while this one stood by)."""
        self._protect_due |= {key for key, obj in self.view.claims() if protection.deleting(obj)}

    def _settings_heard(self, answer: Answer) -> None:
        if answer.ok:
            self._settings_failures = 0
            return
        self._settings_written = None
        self._settings_failures += 1
        wait = min(SETTINGS_REFRESH_S, 2.0 ** (self._settings_failures - 1))
        self._settings_retry_at = self._settings_at + wait
        log.warning(
            "settings ConfigMap not written: %s (try %d; the next in %.0f s)",
            answer.error,
            self._settings_failures,
            wait,
        )

    def _claim_heard(self, answer: Answer) -> None:
        """A finalizer, a note or a delete of a claim that did not land: judge it again."""
        if answer.ok:
            return
        call = answer.call
        if isinstance(call, ClaimNote):
            self.note_failed(call.claim)
        elif not isinstance(call, Finalizer) or call.kind is keys.GPU_CLAIM:
            self._protect_due.add(ClaimKey(call.namespace, call.name))

    def _gpunode_heard(self, answer: Answer) -> None:
        if not answer.ok:
            self._gpunodes_due.add(answer.call.name)

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
            if self.handle.writing(Finalizer.key_of(keys.GPU_CLAIM, key)):
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
                    body = claim_status.condition_patch(obj, cond)
                    self.handle.send(ClaimNote(*key, body, Note.DELETING, heard=self._claim_heard))
                    self.handle.event(
                        obj, EventReason.DELETION_WAITS.value, str(cond["message"]), False
                    )
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        for obj in self.view.classes():
            class_key = ("", translate.name_of(obj))
            if self.handle.writing(Finalizer.key_of(keys.GPU_CLASS, class_key)):
                continue
            # A window booked of the class keeps it as a hold does (SPEC §11): its units on
            # its node, and its budget, until it ends or is cancelled.
            holds = self.snapshot.holds_of_class(class_key[1])
            holds += self.snapshot.windows.of_class(class_key[1])
            body = protection.class_protection(obj, holds)
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
        if self.handle.writing((ClaimDelete.what, *key)):
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
            uid = str(translate.meta(obj).get("uid") or "")
            self.handle.send(ClaimDelete(*key, uid, verdict.delete, heard=self._claim_heard))

    def _patch_meta(self, kind: keys.ApiKind, key: Key, body: dict[str, Any]) -> None:
        """A metadata merge patch (finalizers) on the main resource of a claim or class."""
        self.handle.send(Finalizer(kind, *key, body, heard=self._claim_heard))

    def publish(self, now: float) -> None:
        if now - self._last_publish < PUBLISH_EVERY_S:
            return
        self._last_publish = now
        self._publish_class_status(now)
        self._publish_gpunode_conditions(now)
        self._publish_settings(now)
        if self.config.workload_records:
            self._publish_records(now)
        if now - self._last_metrics >= METRICS_EVERY_S:
            self._last_metrics = now
            self._publish_metrics()

    def _publish_class_status(self, now: float) -> None:
        for obj in self.view.classes():
            name = translate.name_of(obj)
            kept = False
            if protection.deleting(obj):
                self._note_withdrawal(name, now)
                kept = self._kept(name)
            if self.handle.writing((ClassStatus.what, "", name)):
                continue
            numbers = self.snapshot.class_status(name)
            body = class_status.class_status_body(obj, numbers, now, kept)
            if body is not None:
                self.handle.send(ClassStatus(name, body))

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
                body = claim_status.condition_patch(obj, cond)
                self.handle.send(ClaimNote(*key, body, Note.WITHDRAWN, heard=self._claim_heard))

    def _publish_gpunode_conditions(self, now: float) -> None:
        due, self._gpunodes_due = self._gpunodes_due, set()
        for name in due:
            gpunode = self.view.gpunode(name)
            if self.handle.writing((GpuNodeStatus.what, "", name)):
                self._gpunodes_due.add(name)  # look again once the write is back
                continue
            if gpunode is None:
                continue
            wanted = node_reports.gpunode_conditions(
                self.view.node(name),
                gpunode,
                self.view.inventory_stale(name),
                self.config.inventory_stale_after,
                now,
            )
            body = node_reports.gpunode_status_patch(gpunode, wanted)
            if body is not None:
                self.handle.send(GpuNodeStatus(name, body, heard=self._gpunode_heard))

    def _publish_settings(self, now: float) -> None:
        namespace = self.config.namespace
        if self.handle.writing((Settings.what, namespace, keys.SETTINGS_CONFIGMAP)):
            return
        if now < self._settings_retry_at:
            return
        data = node_reports.settings_data(
            self.view.gpu_names, self.config.raw_resource_names, self.view.classes()
        )
        if data == self._settings_written and now - self._settings_at < SETTINGS_REFRESH_S:
            return
        self._settings_written, self._settings_at = data, now
        self.handle.send(Settings(namespace, data, heard=self._settings_heard))

    def _publish_records(self, now: float) -> None:
        """One usage record of its own per ordered Bound or Attached claim and per booked
        reservation whose window has not ended, as the API confirmed them, and none else
        (``records.record_owners``, ``records.plan_records``); one write per record at a
        time. Judged again from the whole view at every publish: a reservation's change
        needs no hook, and its window's end is read against ``now``."""
        claims, reservations = records.record_owners(
            (claim for _key, claim in self.view.claims()), self.view.reservations.objects(), now
        )
        plan = records.plan_records(claims, self.view.usage_records(), reservations)
        for body in plan.create:
            meta = body["metadata"]
            if not self.handle.writing((RecordCreate.what, meta["namespace"], meta["name"])):
                self.handle.send(RecordCreate(meta["namespace"], body))
        for record_key, patch in plan.repair:
            if not self.handle.writing((RecordStatus.what, *record_key)):
                # Billing reads the status: one edited or never written is written back.
                log.info(
                    "usage record %s/%s: its status is not its owner's; writing it back",
                    *record_key,
                )
                self.handle.send(RecordStatus(*record_key, patch))
        for record_key, patch in plan.annotate:
            if not self.handle.writing((RecordMeta.what, *record_key)):
                self.handle.send(RecordMeta(*record_key, patch))
        for record_key in plan.delete:
            if not self.handle.writing((RecordDelete.what, *record_key)):
                log.info("usage record %s/%s: no holding claim or window owns it", *record_key)
                self.handle.send(RecordDelete(*record_key))

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
        booked = metrics.booked_by_hour(booked_by_class(snap.bookings), self.handle.clock())
        for gpu_class in snap.classes():
            hours = booked.get(gpu_class.name) or [0] * metrics.HOURS_AHEAD
            for hour, units in enumerate(hours):
                metrics.BOOKED_UNITS.labels(gpu_class.name, str(hour)).set(units)
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
