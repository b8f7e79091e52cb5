"""Live migration keeps the hold (SPEC §12): a migration's target pod, gated by the pod
webhook, gets the whole set's target placed, recorded on each claim and then the pod pinned
and ungated in one update; the hold follows the VM when it lands, and the target goes when
the migration ends otherwise.

1. **Place.** For the one target pod of a migration (``launcher.migration_target_of``) of a
   running VMI whose claims all hold units on its node: ``set_placement.place_migration``
   picks another node serving every class of the set (capacity alone: the units are held
   already, budgets count them once). Each claim gets ``status.migration`` (node, uid,
   since) as a decision, so the snapshot counts the target's units on that node from the
   moment the write is sent. A set with no room keeps its pod gated, says why on the VMI.
2. **Pin.** Once the view shows the target on every claim, the pod is pinned and ungated,
   in the turn its pod came in: the loop takes its queue in after each step of a turn and
   runs ``caught_up`` then (``Binder._turn``), which records the migrations that came in
   and pins the pods whose records are answered; an answer applied elsewhere pins as it is
   applied (``_recorded``).
3. **Follow.** A claim whose migration is recorded: moved to the target in one write when
   the VMI runs there (``nodeName``, ``migration`` cleared), or the target cleared when the
   migration failed, was cancelled, its pod went (``rules.migration.outcome``) or its target
   node is gone.

All of it is read from status, not memory: a new leader finds each migration where it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from functools import partial

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.start_path import PodPin
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules import claim_status, gate, migration
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import ClaimReason, EventReason, Phase
from cozystack_gpu.model import ClaimKey, MigrationTarget, Refusal
from cozystack_gpu.model.set_placement import place_migration
from cozystack_gpu.objects import MutableObj, conditions, launcher, translate, vmi_pods

HELD = (Phase.BOUND, Phase.ATTACHED)


class Migrations(BinderPart):
    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._migrating: set[ClaimKey] = set()  # claims with a target recorded
        self._seen_all = False
        self._targets: dict[str, Key] = {}  # migration uid -> its target pod, once seen
        self._told: dict[str, str] = {}  # migration uid -> what its VMI was last told

    def took_over(self) -> None:
        self._seen_all = False

    def changed(self, claims: Iterable[ClaimKey]) -> None:
        for key in claims:
            info = self.snapshot.claim(key)
            if info is not None and info.migration is not None:
                self._migrating.add(key)

    def run(self, now: float) -> None:
        if not self._seen_all:
            self._seen_all = True
            self._migrating |= {c.key for c in self.snapshot.claims() if c.migration is not None}
        self.view.migrations.take_fresh()  # every open one is looked at here
        self._place_ahead(self.view.migrations.open(), now)
        self.place_gated(now)
        for key in sorted(self._migrating):
            if self._follow(key, now):
                self._migrating.discard(key)

    def caught_up(self, now: float) -> None:
        """What a mid-turn catch-up brought: the migrations that came in placed ahead (their
        records sent now, not at the next turn's start, which their target pods would wait
        for), and the gated target pods placed or pinned."""
        self._place_ahead(self.view.migrations.take_fresh(), now)
        self.place_gated(now)

    def _place_ahead(self, job_keys: Iterable[Key], now: float) -> None:
        for job_key in job_keys:
            job = self.view.migrations.get(job_key)
            if job is not None:
                self._ahead(job_key[0], job, now)

    def place_gated(self, now: float) -> None:
        """Each gated target pod placed, recorded or, once its set shows the target,
        pinned; the loop runs it again mid-turn once the records' answers are in."""
        for pod_key in self.view.gated_pods():
            pod = self.view.pod(pod_key)
            uid = launcher.migration_of(pod) if pod is not None else None
            if pod is None or uid is None or self.handle.writing((PodPin.what, *pod_key)):
                continue
            self._place(pod_key, pod, uid, now)

    # --- place and pin -----------------------------------------------------------------

    def _ahead(self, namespace: str, job: MutableObj, now: float) -> None:
        """A migration seen before its target pod: the target placed and recorded now, so
        the pod virt-controller renders next is pinned in one update (``rules.migration
        .ahead`` says when)."""
        uid = str(translate.meta(job).get("uid") or "")
        vmi_name = str((job.get("spec") or {}).get("vmiName") or "")
        vmi = self.view.vmi_object((namespace, vmi_name)) if uid and vmi_name else None
        if vmi is not None and uid not in self._targets and migration.ahead(job, vmi):
            self._target(namespace, vmi_name, vmi, uid, now)

    def _chosen(self, pod_key: Key, pod: MutableObj, uid: str) -> tuple[str, MutableObj] | None:
        """The VMI (name, object) of which this pod is migration ``uid``'s one target pod,
        now remembered as that migration's target; None for a pod the label alone names (no
        open migration of that uid for its VMI, or a second target pod: never pinned)."""
        job = self.view.migrations.by_uid(uid)
        vmi_name = vmi_pods.owning_vmi(pod)
        vmi = self.view.vmi_object((pod_key[0], vmi_name)) if vmi_name else None
        if vmi_name is None or vmi is None or job is None or not launcher.migration_open(job):
            return None
        vmi_uid = vmi_pods.owning_vmi_uid(pod)
        if translate.meta(vmi).get("uid") != vmi_uid:
            return None
        if (job.get("spec") or {}).get("vmiName") != vmi_name:
            return None
        # Among all the VMI's pods, gated or not: once the target is pinned, a pod forged
        # with the label later is still not it.
        if self.view.migration_target((pod_key[0], vmi_name), vmi_uid, uid) != pod_key:
            return None
        self._targets[uid] = pod_key
        return vmi_name, vmi

    def _place(self, pod_key: Key, pod: MutableObj, uid: str, now: float) -> None:
        chosen = self._chosen(pod_key, pod, uid)
        if chosen is None:
            return
        vmi_name, vmi = chosen
        node = self._target(pod_key[0], vmi_name, vmi, uid, now)
        members = gate.claim_keys((pod_key[0], vmi_name), vmi)
        if node is not None and all(self._shows_target(k, uid, node) for k in members):
            self._pin(pod_key, pod, node, uid)

    def _recorded(self, uid: str, answer: Answer) -> None:
        """A record of migration ``uid``'s target answered, and applied to the view: its
        target pod, if virt-controller has rendered it, pinned once every claim of the set
        shows the target. Only pinned: a set still being recorded, or a refused record, is
        judged on the next pass."""
        pod_key = self._targets.get(uid)
        if not answer.ok or pod_key is None or self.handle.writing((PodPin.what, *pod_key)):
            return
        pod = self.view.pod(pod_key)
        if pod is None or pod_key not in self.view.gated_pods():
            return
        chosen = self._chosen(pod_key, pod, uid)
        if chosen is None:
            return
        members = gate.claim_keys((pod_key[0], chosen[0]), chosen[1])
        nodes = {self._recorded_node(k, uid) for k in members}
        node = nodes.pop() if len(nodes) == 1 else None
        if node is not None and not self.handle.in_flight(members):
            self._pin(pod_key, pod, node, uid)

    def _target(
        self, namespace: str, vmi_name: str, vmi: MutableObj, uid: str, now: float
    ) -> str | None:
        """The node of the migration's target once every claim of the set records it;
        until then the target placed and its record sent (or why it waits told)."""
        members = gate.claim_keys((namespace, vmi_name), vmi)
        if not members or self.handle.in_flight(members):
            return None
        infos = [self.snapshot.claim(k) for k in members]
        source = (vmi.get("status") or {}).get("nodeName")
        if any(c is None or c.phase not in HELD or c.node != source for c in infos):
            return None  # not every claim holds units where the VM runs (yet)
        claims = [c for c in infos if c is not None]
        recorded = {c.migration.node for c in claims if c.migration and c.migration.uid == uid}
        if len(recorded) == 1 and all(c.migration and c.migration.uid == uid for c in claims):
            return next(iter(recorded))
        decision = place_migration(self.snapshot, claims, now)
        if isinstance(decision, Refusal):
            self._tell(uid, vmi, members, decision.message, now)
            return None
        if self.handle.vacated_in_flight(decision.node):
            return None  # room left by a move not answered yet: placed again once it is
        target = MigrationTarget(decision.node, uid, now)
        for claim in claims:
            if claim.migration is not None and claim.migration.uid == uid:
                continue
            obj = self.view.claim(claim.key)
            if obj is None:
                continue
            body = migration.record_patch(obj, target)
            updated = replace(claim, migration=target)
            heard = partial(self._recorded, uid)
            self.handle.decide(updated, Decision(*claim.key, body, "migrate", heard=heard))
            self._migrating.add(claim.key)
        return None

    def _recorded_node(self, key: ClaimKey, uid: str) -> str | None:
        """The target node the claim's status records for migration ``uid``, if any."""
        obj = self.view.claim(key)
        recorded = translate.migration_target((obj or {}).get("status") or {})
        return recorded.node if recorded is not None and recorded.uid == uid else None

    def _shows_target(self, key: ClaimKey, uid: str, node: str) -> bool:
        return self._recorded_node(key, uid) == node

    def _pin(self, pod_key: Key, pod: MutableObj, node: str, uid: str) -> None:
        self._told.pop(uid, None)
        self.handle.send(PodPin(*pod_key, gate.pin_and_ungate(pod, node)))

    def _tell(
        self, uid: str, vmi: MutableObj, members: list[ClaimKey], refusal: str, now: float
    ) -> None:
        """Why the target of migration ``uid`` waits, once per reason: an Event on the VMI
        and the Migration condition on each claim of the set."""
        words = migration.not_placed_words(translate.name_of(vmi), refusal)
        if self._told.get(uid) == words:
            return
        self._told[uid] = words
        self.handle.event(vmi, EventReason.SET_NOT_PLACED.value, words, True, kind=keys.VMI)
        for key in members:
            obj = self.view.claim(key)
            if obj is not None:
                body = migration.not_placed_patch(obj, words, now)
                heard = partial(self._not_placed_heard, uid)
                self.handle.send(ClaimNote(*key, body, Note.MIGRATION, heard=heard))

    def _not_placed_heard(self, uid: str, answer: Answer) -> None:
        """A claim changed before its condition landed: told again on the next pass."""
        if not answer.ok:
            self._told.pop(uid, None)

    # --- follow ------------------------------------------------------------------------

    def _target_live(self, target: MigrationTarget, vmi: MutableObj | None) -> bool:
        """Whether the migration's target still stands: its target pod, once there is one,
        lives (seen by this leader, or found among the VMI's pods); before one, its
        migration is open (placed ahead; a cancelled migration is deleted)."""
        pod_key = self._targets.get(target.uid)
        if pod_key is None and vmi is not None:
            vmi_key = (translate.namespace_of(vmi), translate.name_of(vmi))
            vmi_uid = str(translate.meta(vmi).get("uid") or "")
            pod_key = self.view.migration_target(vmi_key, vmi_uid, target.uid)
        if pod_key is not None:
            pod = self.view.pod(pod_key)
            return pod is not None and (
                (pod.get("status") or {}).get("phase") not in translate.FINAL_POD_PHASES
            )
        job = self.view.migrations.by_uid(target.uid)
        return job is not None and launcher.migration_open(job)

    def _follow(self, key: ClaimKey, now: float) -> bool:
        """Move the claim to its target once its VM runs there, or clear a target whose
        migration ended otherwise; True once it has no migration any more."""
        claim = self.snapshot.claim(key)
        obj = self.view.claim(key)
        if claim is None or obj is None or claim.migration is None:
            return True
        if self.handle.in_flight([key]):
            return False
        target = claim.migration
        vmi = (
            self.view.vmi_object((key.namespace, claim.attached_to)) if claim.attached_to else None
        )
        state = migration.outcome(target, vmi, self._target_live(target, vmi), claim.node)
        if state is migration.Outcome.RUNNING and self.snapshot.node(target.node) is None:
            state = migration.Outcome.ENDED  # its target node is gone: the VM cannot land there
        if state is migration.Outcome.RUNNING:
            return False
        if state is migration.Outcome.LANDED:
            updated = replace(claim, node=target.node, migration=None)
            words = f"moved to node {target.node} with its VM's live migration {target.uid}"
            cond = conditions.condition(keys.CONDITION_BOUND, True, ClaimReason.MOVED, words, now)
            step = "migrated"
        else:
            updated = replace(claim, migration=None)
            cond = None
            step = "migration-ended"
        body = claim_status.claim_status_patch(obj, updated, cond)
        body["status"]["migration"] = None
        migration.told_ended(body, obj, target, state is migration.Outcome.LANDED, now)
        # The source node's units are free in the snapshot at once; no decision places into
        # them until this write is answered (``vacated_in_flight``), by when the view counts
        # the VM's source pod, which runs on there for its guest's last moments.
        self.handle.decide(updated, Decision(*key, body, step))
        return False  # done once the view shows no migration (``changed`` no longer adds it)
