"""The launcher-pod gate, as the leader runs it: template claims created, the whole set
placed on one node, and the pod pinned and ungated in one update (a pinned pod the scheduler
refuses is ``rejections``'). The rules are in ``gate``; this is their I/O, run from the
binder's loop on the binder's snapshot, written as typed calls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import INVALID, Answer
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.start_path import ClaimCreate, PodPin
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle, StartSet, start_set
from cozystack_gpu.binder.rules import claim_status, gate
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import AdmissionReason, ClaimReason, EventReason, Phase
from cozystack_gpu.model import ClaimInfo, ClaimKey, Refusal, Step, VolumeAffinity, set_placement
from cozystack_gpu.objects import annotation, conditions, launcher, translate, vmi_pods
from cozystack_gpu.objects.annotation import ClaimsRequest

log = logging.getLogger(__name__)

MAX_VOLUME_LIMITS = 1024  # distinct volume affinities remembered (one per waiting disk)
# The gated pod waits for a sibling that goes by itself: nothing to tell.
_SILENT = "silent"


class Gatekeeper(BinderPart):
    """The gate's state: what each gated pod was last told (a refusal is said once), and
    the Placed notes out. The nodes that refused a pinned pod are ``Rejections``'."""

    def __init__(
        self,
        handle: PartHandle,
        refused_nodes: Callable[[Key, float], set[str]] = lambda vmi, now: set(),
    ) -> None:
        super().__init__(handle)
        # The nodes that refused a VM's pinned launcher pod, and still would (``Rejections``).
        self._refused_nodes = refused_nodes
        self._gate_told: dict[Key, str] = {}
        # The gated pod each claim's "cannot start" note is out for: one refused (409, the
        # claim changed meanwhile) is said again, or the claim would never show why.
        self._told_out: dict[ClaimKey, Key] = {}
        # Where each distinct set of volume affinities can be used, while no node's labels
        # change: judging it costs a pass over every node, and a pod may wait many turns.
        self._volume_nodes: dict[tuple[VolumeAffinity, ...], frozenset[str] | None] = {}
        self._volume_nodes_of = -1  # the view's node_labels_version they were judged at
        # Placed conditions sent and not answered yet, and those to send again: a note is
        # written over the version it read, so one racing the claim's attachment is refused.
        self._placed_sent: dict[ClaimKey, dict[str, Any]] = {}
        self._placed_due: dict[ClaimKey, dict[str, Any]] = {}
        # Template claims the API server refused as invalid, by the VMI (uid) they were for,
        # with its answer: never sent again for that VMI (a 422 is the same answer each
        # time), said on the VMI instead.
        self._invalid_templates: dict[tuple[ClaimKey, str], str] = {}

    def clock(self) -> float:
        return self.handle.clock()

    def run(self, now: float) -> None:
        """Gated launcher pods: create the template claims, place the whole set on one
        node, and pin and ungate the pod in one update once every claim is bound there."""
        self._resend_placed()
        for pod_key, pod in self._gated_due():
            at = start_set(self.view, pod_key, pod)
            if at is None:
                continue  # its VMI is not known yet
            if self._unreadable(at, now):
                continue
            if not at.members:
                self._pin(at, None)  # no claims to place: only ungate
                continue
            if self._not_its_set(at, now) or self._create_templates(at, now):
                continue
            claims = self._claims_ready(at, now)
            if claims is None:
                continue
            target = self._place(at, claims, now)
            if target is None or self._bind(at, claims, target, now):
                continue  # no node yet, or pin once the API confirms every claim on it
            if all(gate.bound_on(self.view.claim(k), target) for k in at.members) and all(
                gate.held_for_start(self.view.claim(c.key), at.vmi)
                for c in claims
                if not c.template
            ):
                self._pin(at, target)

    def _resend_placed(self) -> None:
        """Placed notes refused on the last pass, sent again over the claims as they are."""
        due, self._placed_due = self._placed_due, {}
        for key, cond in due.items():
            self._tell_placed(key, cond)

    def _gated_due(self) -> Iterator[tuple[Key, dict[str, Any]]]:
        """The gated pods to judge, each read as the pass reaches it: seen, no update of it out."""
        gated = self.view.gated_pods()
        if len(self._gate_told) > len(gated):
            # What a pod was told matters only while it waits at the gate.
            waiting = set(gated)
            self._gate_told = {k: v for k, v in self._gate_told.items() if k in waiting}
        for pod_key in gated:
            pod = self.view.pod(pod_key)
            if pod is None or launcher.migration_of(pod) is not None:
                continue  # a live migration's target pod is ``migrations``'
            if not self.handle.writing((PodPin.what, *pod_key)):
                yield pod_key, pod

    def _unreadable(self, at: StartSet, now: float) -> bool:
        """Whether the VMI's claims annotation cannot be read (it names no claim then), said."""
        problem = annotation.claims_ref_problem(at.vmi)
        if problem is not None:
            # Ungated, its GPU requests would reach the scheduler uncounted: it waits.
            self._not_placed(at, AdmissionReason.MALFORMED_ANNOTATION.value, problem, now)
        return problem is not None

    def _not_its_set(self, at: StartSet, now: float) -> bool:
        """Whether another pod is the VMI's launcher or a claim stands in a template's way."""
        other = self._other_launcher(at.pod_key, at.vmi_key, at.pod)
        if other is not None:
            if other != _SILENT:
                self._not_placed(at, ClaimReason.NOT_THE_LAUNCHER.value, other, now)
            return True
        conflict = gate.template_claims_conflict(at.vmi, self.view.claim)
        if conflict is not None:
            self._not_placed(at, AdmissionReason.TEMPLATE_CLAIM_CONFLICT.value, conflict, now)
        return conflict is not None

    def _claims_ready(self, at: StartSet, now: float) -> list[ClaimInfo] | None:
        """The set's claims once all exist, are in the model, have no write out and cover
        exactly what the pod requests; None until then, said where it is not silent."""
        infos = [self.snapshot.claim(k) for k in at.members]
        if self.handle.in_flight(at.members):
            return None  # a write about one of its claims is still out
        # Claims it holds that do not exist (its templates do by now) are told, not
        # waited for in silence.
        absent = [k.name for k in at.members if self.view.claim(k) is None]
        if absent:
            message = (
                f"GPUClaim {', '.join(absent)} named in {keys.ANNOTATION_CLAIMS} does not "
                f"exist in namespace {at.vmi_key[0]}; order it, or remove it from the annotation"
            )
            self._not_placed(at, AdmissionReason.CLAIM_NOT_FOUND.value, message, now)
            return None
        if any(c is None for c in infos):
            return None  # seen, but not in the model yet
        held = self.view.vmi(at.vmi_key)
        for name in held.held_claims if held is not None else ():
            claim = self.view.claim(ClaimKey(at.vmi_key[0], name))
            wait = gate.held_claim_wait(name, claim, at.vmi_key[1])
            if wait is not None:
                # Said on this VMI only: the claim serves the other VM, and its conditions
                # are that VM's to show.
                self._not_placed(at, wait[0], wait[1], now, on_claims=False)
                return None
        claims = [c for c in infos if c is not None]
        mismatch = self._request_mismatch(at.pod, claims)
        if mismatch is not None:
            # Ungated, the surplus would be a GPU outside every budget and record.
            self._not_placed(at, ClaimReason.REQUESTS_BEYOND_CLAIMS.value, mismatch, now)
            return None
        return claims

    def _place(self, at: StartSet, claims: list[ClaimInfo], now: float) -> str | None:
        """The node the whole set starts on, where its volumes can be used; None, said, if none."""
        allowed, unbound = self._allowed_nodes(at.pod)
        if unbound:
            message = (
                f"PersistentVolumeClaim {', '.join(unbound)} of launcher pod {at.pod_key[1]} "
                "is not bound to a volume yet; the VM starts once it is, on a node the "
                "volume can be used from"
            )
            self._not_placed(at, ClaimReason.VOLUME_NOT_BOUND.value, message, now)
            return None
        decision = set_placement.place_for_start(
            self.snapshot, claims, now, allowed, exclude=self._refused_nodes(at.vmi_key, now)
        )
        if isinstance(decision, Refusal):
            self._not_placed(at, str(decision.reason), decision.message, now)
            return None
        return decision.node

    def _bind(self, at: StartSet, claims: list[ClaimInfo], target: str, now: float) -> bool:
        """Bind (or move) to ``target`` each claim not held there yet; True when any was."""
        vmi_key, vmi_uid = at.vmi_key, vmi_pods.owning_vmi_uid(at.pod)
        moving = [c for c in claims if not (c.holds_node and c.node == target)]
        if moving and self.handle.vacated_in_flight(target):
            # Room another claim's move left there, its write not answered yet: the pod it
            # leaves behind (a migrated VM's source pod) is counted only once it is. The
            # set is placed again on the next pass.
            return True
        for claim in moving:
            obj = self.view.claim(claim.key)
            if obj is None:
                continue
            step = Step.BIND if claim.phase is Phase.PENDING else Step.MOVE
            cond = conditions.condition(
                keys.CONDITION_BOUND,
                True,
                ClaimReason.BOUND if step is Step.BIND else ClaimReason.MOVED,
                f"holds {claim.count} unit(s) of class {claim.class_name} on node {target} "
                f"for the start of VMI {vmi_key[1]}",
                now,
            )
            if claim.template:
                # A template claim exists for this VMI alone: it is attached to it (by
                # uid) in the same write that binds it, so from then on it is held,
                # protected and counted as the running VM's like any attached claim.
                updated = replace(
                    claim,
                    phase=Phase.ATTACHED,
                    node=target,
                    bound_at=now,
                    attached_to=vmi_key[1],
                    vmi_live=True,
                )
                body = claim_status.claim_status_patch(obj, updated, cond)
                body["status"].update(claim_status.attachment_fields(vmi_key[1], vmi_uid, now))
            else:
                updated = replace(claim, phase=Phase.BOUND, node=target, bound_at=now)
                body = claim_status.claim_status_patch(obj, updated, cond)
            self.handle.decide(updated, Decision(*claim.key, body, str(step)))
        return bool(moving)

    def _other_launcher(self, pod_key: Key, vmi_key: Key, pod: dict[str, Any]) -> str | None:
        """Why this gated pod is not its VMI's one launcher pod (``launcher.launcher_of``),
        or None when it is: only that pod is covered by the claims, so only it is pinned.
        ``_SILENT`` when the launcher is KubeVirt's temporary pod for WaitForFirstConsumer
        volumes, which goes once the volumes are bound."""
        chosen = self.view.launcher_pod(vmi_key, vmi_pods.owning_vmi_uid(pod))
        if chosen is None or chosen == pod_key:
            return None
        other = self.view.pod(chosen) or {}
        annotations = translate.meta(other).get("annotations") or {}
        if annotations.get(keys.ANNOTATION_EPHEMERAL_PROVISIONING) == "true":
            return _SILENT
        return (
            f"pod {chosen[1]} names VirtualMachineInstance {vmi_key[1]} as its owner too and "
            f"is older, so it is the VMI's launcher pod and pod {pod_key[1]} is not: only one "
            "pod of a VMI is covered by its claims; this pod waits at the gate until that "
            "pod is gone"
        )

    def _request_mismatch(self, pod: dict[str, Any], claims: list[ClaimInfo]) -> str | None:
        """Why the GPU names the pod requests (every container) are not exactly what its
        claims cover, or None (``launcher.request_mismatch``)."""
        cover: dict[str, int] = {}
        resource_claims: list[str] = []  # a dra class's claims: their ResourceClaims
        for claim in claims:
            klass = self.snapshot.gpu_class(claim.class_name)
            if klass is None or not klass.resource_name:
                return None  # a class gone: placement refuses the set and says so
            if klass.dra:
                resource_claims.append(claim.key.name)
            else:
                cover[klass.resource_name] = cover.get(klass.resource_name, 0) + claim.count
        return launcher.request_mismatch(
            pod, self.view.gpu_names, cover
        ) or launcher.resource_claims_missing(pod, resource_claims)

    def _create_templates(self, at: StartSet, now: float) -> bool:
        """Create the VMI's template claims that do not exist yet; True while any is
        missing. Their budget and capacity are judged with the set, at placement. One the
        API server refused as invalid is not sent again for this VMI: the set waits, and
        says why."""
        vmi = at.vmi
        ref = annotation.claims_ref_of(vmi) or ClaimsRequest()
        uid = str(translate.meta(vmi).get("uid") or "")
        missing = False
        for template in ref.templates:
            body = gate.template_claim(vmi, template)
            key = ClaimKey(translate.namespace_of(vmi), body["metadata"]["name"])
            if self.view.claim(key) is not None:
                continue
            missing = True
            refused = self._invalid_templates.get((key, uid))
            if refused is not None:
                why = (
                    f"the API server refuses template claim {key.name} of entry "
                    f"{template.name!r} ({refused}); correct the entry in the VM's "
                    f"{keys.ANNOTATION_CLAIMS} annotation"
                )
                self._not_placed(at, ClaimReason.TEMPLATE_CLAIM_INVALID.value, why, now)
            elif not self.handle.writing((ClaimCreate.what, *key)):
                heard = partial(self._template_heard, key, uid)
                self.handle.send(ClaimCreate(*key, body, heard=heard))
        return missing

    def _template_heard(self, key: ClaimKey, uid: str, answer: Answer) -> None:
        if answer.code in INVALID:
            log.warning("template claim %s/%s refused as invalid: %s", *key, answer.error)
            if len(self._invalid_templates) > MAX_VOLUME_LIMITS:
                self._invalid_templates.clear()  # VMIs come and go: a bound, not a record
            self._invalid_templates[(key, uid)] = answer.error

    def _allowed_nodes(self, pod: dict[str, Any]) -> tuple[frozenset[str] | None, tuple[str, ...]]:
        """Nodes the pod's bound persistent volumes can be used from (a WaitForFirstConsumer
        volume bound by KubeVirt's temporary pod limits where the VM may start), and the
        PVCs it waits for. Read from the binder's watches, never from the API: the loop
        must not block on a read, and a binding arrives as an event that judges it again."""
        namespace = translate.namespace_of(pod)
        volumes = gate.pod_volumes(
            pod,
            lambda name: self.view.pvc(namespace, name),
            self.view.pv,
            self.view.storage_class,
        )
        if not volumes.volumes:
            return None, volumes.unbound
        version = self.view.node_labels_version
        if version != self._volume_nodes_of or len(self._volume_nodes) >= MAX_VOLUME_LIMITS:
            self._volume_nodes.clear()
            self._volume_nodes_of = version
        if volumes.volumes not in self._volume_nodes:
            nodes = gate.volume_nodes(volumes.volumes, self.view.nodes())
            self._volume_nodes[volumes.volumes] = None if nodes is None else frozenset(nodes)
        return self._volume_nodes[volumes.volumes], volumes.unbound

    def _not_placed(
        self, at: StartSet, reason: str, why: str, now: float, *, on_claims: bool = True
    ) -> None:
        """A set with nowhere to go keeps its pod gated; say so once per reason, on the
        claims (condition Placed) and on the VMI (a Warning event)."""
        said = f"{reason}: {why}"
        if self._gate_told.get(at.pod_key) == said:
            return
        self._gate_told[at.pod_key] = said
        message = f"the VM's GPU set cannot start anywhere yet: {why}"
        self.handle.event(at.vmi, EventReason.SET_NOT_PLACED.value, message, True, kind=keys.VMI)
        if not on_claims:
            return
        cond = conditions.condition(keys.CONDITION_PLACED, False, reason, message, now)
        for key in at.members:
            obj = self.view.claim(key)
            if obj is not None:
                self._told_out[key] = at.pod_key
                # A template claim that waits for room shows Pending, as an order does.
                body = claim_status.waiting_patch(obj, cond)
                self.handle.send(ClaimNote(*key, body, Note.PLACED, heard=self._placed_heard))

    def _pin(self, at: StartSet, node: str | None) -> None:
        """The one pod update: pin to ``node`` (every required term gains the requirement)
        and remove the gate; without a node, only remove the gate."""
        pod_key, pod = at.pod_key, at.pod
        body = gate.pin_and_ungate(pod, node) if node else gate.ungate(pod)
        self._gate_told.pop(pod_key, None)
        self.handle.send(PodPin(*pod_key, body))
        if node is None:
            return
        now = self.clock()
        message = gate.pinned_message(pod_key[1], node)
        cond = conditions.condition(keys.CONDITION_PLACED, True, ClaimReason.PINNED, message, now)
        for key in at.members:
            self._tell_placed(key, cond)

    def _tell_placed(self, key: ClaimKey, cond: dict[str, Any]) -> None:
        obj = self.view.claim(key)
        if obj is None or conditions.same_condition(
            (obj.get("status") or {}).get("conditions") or [], cond
        ):
            return
        self._placed_sent[key] = cond
        body = claim_status.condition_patch(obj, cond)
        self.handle.send(ClaimNote(*key, body, Note.PLACED, heard=self._placed_heard))

    def _placed_heard(self, answer: Answer) -> None:
        if isinstance(answer.call, ClaimNote):
            self.placed_answered(answer.call.claim, answer.ok)

    def placed_answered(self, key: ClaimKey, written: bool) -> None:
        """A Placed note's answer: one refused (the claim changed meanwhile), a pin's or a
        set's that cannot start, is sent again on the next pass, over the claim as it is
        then."""
        cond = self._placed_sent.pop(key, None)
        if cond is not None and not written:
            self._placed_due[key] = cond
        told = self._told_out.pop(key, None)
        if told is not None and not written:
            self._gate_told.pop(told, None)  # the next pass tells it again

    def placed_over(self, key: ClaimKey) -> None:
        """The pin's Placed note on this claim is over (the node refused the pod): one still
        out, or to be sent again after a race, must not land after the refusal and say the
        pod is pinned."""
        self._placed_sent.pop(key, None)
        self._placed_due.pop(key, None)
