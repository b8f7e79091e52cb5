"""The launcher-pod gate, as the leader runs it: template claims created, the whole set
placed on one node, the pod pinned and ungated in one update, and a pinned pod the scheduler
refuses turned into a rejected node (seed 000). The rules are in ``gate``; this is their I/O,
run from the binder's loop on the binder's snapshot, written as typed calls.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from functools import partial
from typing import Any, NamedTuple

from cozystack_gpu import keys
from cozystack_gpu.binder import claim_status, gate
from cozystack_gpu.binder.calls.base import INVALID, Answer
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.start_path import PodDelete, PodPin, TemplateClaimCreate
from cozystack_gpu.binder.part import BinderPart, PartHandle
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import AdmissionReason, ClaimReason, EventReason, OnCordon, Phase
from cozystack_gpu.model import ClaimInfo, ClaimKey, Refusal, RejectedNode, Step, VolumeAffinity
from cozystack_gpu.objects import conditions, launcher, translate, vmi_pods
from cozystack_gpu.objects.annotation import ClaimsRequest

log = logging.getLogger(__name__)

MAX_VOLUME_LIMITS = 1024  # distinct volume affinities remembered (one per waiting disk)
# The gated pod waits for a sibling that goes by itself: nothing to tell.
_SILENT = "silent"


class _Rejection(NamedTuple):
    """A node's refusal of a VM's pinned launcher pod, kept against the VM: until when, the
    node's state when it refused, and the NodeRefused condition its claims were told."""

    until: float
    state: str
    told: dict[str, Any]


class _StartSet(NamedTuple):
    """A launcher pod, the VMI it starts and the keys of the VMI's claims."""

    pod_key: Key
    pod: dict[str, Any]
    vmi_key: Key
    vmi: dict[str, Any]
    members: list[ClaimKey]


class Gatekeeper(BinderPart):
    """The gate's state: what each gated pod was last told (a refusal is said once), and
    the nodes that refused a pinned pod with the node state they refused in."""

    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._gate_told: dict[Key, str] = {}
        # The gated pod each claim's "cannot start" note is out for: one refused (409, the
        # claim changed meanwhile) is said again, or the claim would never show why.
        self._told_out: dict[ClaimKey, Key] = {}
        # Nodes that refused each VM's pinned launcher pod (VMI key = the VM's name), until
        # when, and the node's state then: a set of template claims loses its claims, and
        # their rejectedNodes, with the failed VMI, so the VM keeps them here (seed 004).
        self._vm_rejections: dict[Key, dict[str, _Rejection]] = {}
        # Whether this leader has looked at every rejection since it started leading: a
        # node may have changed while no replica led.
        self._rejections_looked = False
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

    def nodes_changed(self, nodes: set[str]) -> None:
        if not self._rejections_looked:
            self._rejections_looked = True
            nodes = nodes | {name for _ns, name in self.view.raw[keys.NODE.kind]}
        if nodes:
            self.forget_rejections(nodes)

    def run(self, now: float) -> None:
        """Gated launcher pods: create the template claims, place the whole set on one
        node, and pin and ungate the pod in one update once every claim is bound there."""
        self._resend_placed()
        for pod_key, pod in self._gated_due():
            at = self._start_set(pod_key, pod)
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
                gate.held_for_start(self.view.claim(c.key), at.vmi_key[1])
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
            if pod is not None and not self.handle.writing((PodPin.what, *pod_key)):
                yield pod_key, pod

    def _unreadable(self, at: _StartSet, now: float) -> bool:
        """Whether the VMI's claims annotation cannot be read (it names no claim then), said."""
        problem = gate.claims_ref_problem(at.vmi)
        if problem is not None:
            # Ungated, its GPU requests would reach the scheduler uncounted: it waits.
            self._not_placed(at, AdmissionReason.MALFORMED_ANNOTATION.value, problem, now)
        return problem is not None

    def _not_its_set(self, at: _StartSet, now: float) -> bool:
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

    def _claims_ready(self, at: _StartSet, now: float) -> list[ClaimInfo] | None:
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
        claims = [c for c in infos if c is not None]
        mismatch = self._request_mismatch(at.pod, claims)
        if mismatch is not None:
            # Ungated, the surplus would be a GPU outside every budget and record.
            self._not_placed(at, ClaimReason.REQUESTS_BEYOND_CLAIMS.value, mismatch, now)
            return None
        return claims

    def _place(self, at: _StartSet, claims: list[ClaimInfo], now: float) -> str | None:
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
        decision = self.snapshot.place_for_start(
            claims, now, allowed, exclude=self._vm_refused(at.vmi_key, now)
        )
        if isinstance(decision, Refusal):
            self._not_placed(at, str(decision.reason), decision.message, now)
            return None
        return decision.node

    def _bind(self, at: _StartSet, claims: list[ClaimInfo], target: str, now: float) -> bool:
        """Bind (or move) to ``target`` each claim not held there yet; True when any was."""
        vmi_key, vmi_uid = at.vmi_key, vmi_pods.owning_vmi_uid(at.pod)
        moving = [c for c in claims if not (c.holds_node and c.node == target)]
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

    def _start_set(self, pod_key: Key, pod: dict[str, Any]) -> _StartSet | None:
        """The VMI a launcher pod starts and the keys of its claims (held ones and those of
        its claim templates), or None when the pod is not one of ours."""
        vmi_name = vmi_pods.owning_vmi(pod)
        if vmi_name is None:
            return None
        vmi_key = (translate.namespace_of(pod), vmi_name)
        vmi = self.view.vmi_object(vmi_key)
        if vmi is None or translate.meta(vmi).get("uid") != vmi_pods.owning_vmi_uid(pod):
            return None  # not seen yet, or the view still has an earlier VMI of that name
        return _StartSet(pod_key, pod, vmi_key, vmi, gate.claim_keys(vmi_key, vmi))

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
        for claim in claims:
            klass = self.snapshot.gpu_class(claim.class_name)
            if klass is None or not klass.resource_name:
                return None  # a class gone: placement refuses the set and says so
            cover[klass.resource_name] = cover.get(klass.resource_name, 0) + claim.count
        return launcher.request_mismatch(pod, self.view.gpu_names, cover)

    def _vm_refused(self, vmi_key: Key, now: float) -> set[str]:
        """Nodes that refused this VM's launcher pod and have not changed since, within the
        rejection's expiry; expired and changed entries are dropped."""
        entries = self._vm_rejections.get(vmi_key)
        if not entries:
            return set()
        still: dict[str, _Rejection] = {}
        for node, entry in entries.items():
            node_obj = self.view.node(node)
            if (
                entry.until > now
                and node_obj is not None
                and gate.node_state(node_obj) == entry.state
            ):
                still[node] = entry
        if still:
            self._vm_rejections[vmi_key] = still
        else:
            del self._vm_rejections[vmi_key]
        return set(still)

    def _create_templates(self, at: _StartSet, now: float) -> bool:
        """Create the VMI's template claims that do not exist yet; True while any is
        missing. Their budget and capacity are judged with the set, at placement. One the
        API server refused as invalid is not sent again for this VMI: the set waits, and
        says why."""
        vmi = at.vmi
        ref = gate.claims_ref_of(vmi) or ClaimsRequest()
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
            elif not self.handle.writing((TemplateClaimCreate.what, *key)):
                heard = partial(self._template_heard, key, uid)
                self.handle.send(TemplateClaimCreate(*key, body, heard=heard))
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
            nodes = gate.volume_nodes(volumes.volumes, self.view.raw[keys.NODE.kind].values())
            self._volume_nodes[volumes.volumes] = None if nodes is None else frozenset(nodes)
        return self._volume_nodes[volumes.volumes], volumes.unbound

    def _not_placed(self, at: _StartSet, reason: str, why: str, now: float) -> None:
        """A set with nowhere to go keeps its pod gated; say so once per reason, on the
        claims (condition Placed) and on the VMI (a Warning event)."""
        said = f"{reason}: {why}"
        if self._gate_told.get(at.pod_key) == said:
            return
        self._gate_told[at.pod_key] = said
        message = f"the VM's GPU set cannot start anywhere yet: {why}"
        self.handle.event(at.vmi, EventReason.SET_NOT_PLACED.value, message, True, kind=keys.VMI)
        cond = conditions.condition(keys.CONDITION_PLACED, False, reason, message, now)
        for key in at.members:
            obj = self.view.claim(key)
            if obj is not None:
                self._told_out[key] = at.pod_key
                # A template claim that waits for room shows Pending, as an order does.
                body = claim_status.waiting_patch(obj, cond)
                self.handle.send(ClaimNote(*key, body, Note.PLACED, heard=self._placed_heard))

    def _pin(self, at: _StartSet, node: str | None) -> None:
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

    def refusals(self, now: float) -> None:
        """A pinned pod the scheduler refuses for lack of any resource it requests (the GPU
        name, cpu, memory, KubeVirt's devices, storage, a pod slot) on a node that is Ready,
        uncordoned and still serves the set: delete the pod and record the node, with its
        state, in every claim's rejectedNodes and against the VM, so the next launcher pod
        goes elsewhere."""
        self._keep_rejections_written(now)
        for pod_key in self.view.pinned_pods():
            pod = self.view.pod(pod_key)
            if pod is None or self.handle.writing((PodPin.what, *pod_key)):
                continue
            found = self._start_set(pod_key, pod)
            node = vmi_pods.pinned_node(pod)
            if found is None or node is None or not found.members:
                continue
            vmi_key, vmi, members = found.vmi_key, found.vmi, found.members
            claims = [c for k in members if (c := self.snapshot.claim(k)) is not None]
            if len(claims) != len(members) or self.handle.in_flight(members):
                continue
            refusal = gate.refused_for_resources(pod)
            if refusal is None:
                continue
            classes = [self.snapshot.gpu_class(c.class_name) for c in claims]
            stay = any(k is not None and k.on_cordon is OnCordon.STAY for k in classes)
            node_obj = self.view.node(node)
            if not gate.node_may_reject(node_obj, stay) or not all(
                self.snapshot.serves(node, c.class_name) for c in claims
            ):
                continue  # waiting for the node, not refused by it
            assert node_obj is not None
            state = gate.node_state(node_obj)
            expires = now + self.config.rejection_ttl
            until = translate.rfc3339(expires)
            lacking = ", ".join(refusal.resources)
            said = (
                f"node {node} refused the launcher pod for lack of {lacking} "
                f"({refusal.message}); the set skips {node} until {until} or until the "
                "node's allocatable, taints or readiness change"
            )
            cond = conditions.condition(
                keys.CONDITION_PLACED, False, ClaimReason.NODE_REFUSED, said, now
            )
            self._vm_rejections.setdefault(vmi_key, {})[node] = _Rejection(expires, state, cond)
            for claim in claims:
                # The pin's Placed note is over: one still out, or to be sent again after a
                # race, must not land after this refusal and say the pod is pinned.
                self._placed_sent.pop(claim.key, None)
                self._placed_due.pop(claim.key, None)
                obj = self.view.claim(claim.key)
                if obj is None:
                    continue
                rejected = (*claim.rejected, RejectedNode(node, expires))
                body = gate.rejection_patch(obj, node, until, translate.rfc3339(now), state, cond)
                self.handle.decide(
                    replace(claim, rejected=rejected), Decision(*claim.key, body, "Reject")
                )
            self.handle.event(
                vmi,
                EventReason.NODE_REJECTED.value,
                f"the scheduler refused launcher pod {pod_key[1]} on node {node} for lack of "
                f"{lacking} ({refusal.message}); the pod is deleted and the VM's GPU set skips "
                f"{node} until {until} or until the node's allocatable, taints or readiness "
                "change",
                True,
                kind=keys.VMI,
            )
            self._delete_pod(pod_key, pod)

    def _keep_rejections_written(self, now: float) -> None:
        """A rejection kept against a VM is written on each of its claims that lacks it: the
        write that recorded it can lose a race (a note on the claim in between answers 409)
        after the refused pod is gone, and nothing would record it again. The note that won
        the race is most often the pin's own Placed note: a claim that still says it is
        pinned to the refusing node is told the refusal again with the entry."""
        for vmi_key, entries in list(self._vm_rejections.items()):
            vmi = self.view.vmi_object(vmi_key)
            if vmi is None:
                continue
            for key in gate.claim_keys(vmi_key, vmi):
                claim, obj = self.snapshot.claim(key), self.view.claim(key)
                if claim is None or obj is None or self.handle.in_flight((key,)):
                    continue
                missing = [
                    (node, entry)
                    for node, entry in entries.items()
                    if entry.until > now and not any(r.node == node for r in claim.rejected)
                ]
                if not missing:
                    continue
                node, entry = missing[0]
                rejected = (*claim.rejected, RejectedNode(node, entry.until))
                told = entry.told if gate.says_pinned_to(obj, node) else None
                body = gate.rejection_patch(
                    obj,
                    node,
                    translate.rfc3339(entry.until),
                    translate.rfc3339(now),
                    entry.state,
                    told,
                )
                self.handle.decide(
                    replace(claim, rejected=rejected), Decision(*key, body, "Reject")
                )

    def _delete_pod(self, pod_key: Key, pod: dict[str, Any]) -> None:
        self.handle.send(PodDelete(*pod_key, translate.meta(pod).get("uid")))

    def forget_rejections(self, nodes: set[str]) -> None:
        """Rejections of nodes whose allocatable, taints or readiness changed since they
        refused (the state recorded in each rejectedNodes entry, so a new leader judges them
        as the old one would) go, on the claims and against the VMs."""
        states = {}
        for node in nodes:
            node_obj = self.view.node(node)
            states[node] = gate.node_state(node_obj) if node_obj is not None else None
        for vmi_key in list(self._vm_rejections):
            entries = self._vm_rejections[vmi_key]
            for node in [n for n in entries if n in states and entries[n].state != states[n]]:
                del entries[node]
            if not entries:
                del self._vm_rejections[vmi_key]
        for claim in list(self.snapshot.claims()):
            if not claim.rejected or self.handle.in_flight((claim.key,)):
                continue
            if not any(r.node in states for r in claim.rejected):
                continue
            obj = self.view.claim(claim.key)
            changed = gate.stale_rejections(obj, states) if obj is not None else []
            body = gate.without_rejections(obj, changed) if obj is not None and changed else None
            if body is not None:
                kept = tuple(r for r in claim.rejected if r.node not in changed)
                self.handle.decide(
                    replace(claim, rejected=kept), Decision(*claim.key, body, "Unreject")
                )
