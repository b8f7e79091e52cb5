"""The nodes that refused a VM's pinned launcher pod (seed 000): the scheduler refused the
pod for lack of a resource on a node that is Ready and serves the set, so the pod is deleted
and the node recorded, with its state then, in each claim's rejectedNodes and against the
VM, and the next launcher pod goes elsewhere. A rejection goes when it expires or the node's
allocatable, taints or readiness change. The rules are in ``gate``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.calls.start_path import PodDelete, PodPin
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle, start_set
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import ClaimReason, EventReason, OnCordon
from cozystack_gpu.model import ClaimKey, RejectedNode
from cozystack_gpu.objects import conditions, translate, vmi_pods


class _Rejection(NamedTuple):
    """A node's refusal of a VM's pinned launcher pod, kept against the VM: until when, the
    node's state when it refused, and the NodeRefused condition its claims were told."""

    until: float
    state: str
    told: dict[str, Any]


class Rejections(BinderPart):
    """The rejections kept against each VM, and whether this leader has judged them all."""

    def __init__(
        self,
        handle: PartHandle,
        placed_over: Callable[[ClaimKey], None] = lambda key: None,
    ) -> None:
        super().__init__(handle)
        # Nodes that refused each VM's pinned launcher pod (VMI key = the VM's name), until
        # when, and the node's state then: a set of template claims loses its claims, and
        # their rejectedNodes, with the failed VMI, so the VM keeps them here (seed 004).
        self._vm_rejections: dict[Key, dict[str, _Rejection]] = {}
        # Whether this leader has looked at every rejection since it started leading: a
        # node may have changed while no replica led.
        self._rejections_looked = False
        # Told of each claim whose pinned pod was refused: its Placed note is over.
        self.placed_over = placed_over

    def nodes_changed(self, nodes: set[str]) -> None:
        if not self._rejections_looked:
            self._rejections_looked = True
            nodes = nodes | self.view.node_names()
        if nodes:
            self.forget(nodes)

    def refused_nodes(self, vmi_key: Key, now: float) -> set[str]:
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

    def run(self, now: float) -> None:
        """A pinned pod the scheduler refuses for lack of any resource it requests (the GPU
        name, cpu, memory, KubeVirt's devices, storage, a pod slot) on a node that is Ready,
        uncordoned and still serves the set: delete the pod and record the node, with its
        state, in every claim's rejectedNodes and against the VM, so the next launcher pod
        goes elsewhere."""
        self._keep_written(now)
        for pod_key in self.view.pinned_pods():
            pod = self.view.pod(pod_key)
            if pod is None or self.handle.writing((PodPin.what, *pod_key)):
                continue
            # First, as it rules out nearly every pod: every running VM's launcher pod stays
            # pinned, and this runs on every turn of the loop.
            refusal = gate.refused_for_resources(pod)
            if refusal is None:
                continue
            found = start_set(self.view, pod_key, pod)
            node = vmi_pods.pinned_node(pod)
            if found is None or node is None or not found.members:
                continue
            vmi_key, vmi, members = found.vmi_key, found.vmi, found.members
            claims = [c for k in members if (c := self.snapshot.claim(k)) is not None]
            if len(claims) != len(members) or self.handle.in_flight(members):
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
                self.placed_over(claim.key)
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

    def _keep_written(self, now: float) -> None:
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

    def forget(self, nodes: set[str]) -> None:
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
