"""Attachments, the binder part that follows claims to their VMIs: a held claim attached to
the live VMI that names it, Bound ⇄ Attached as VMIs start and end (an attachment an earlier
release's webhook wrote whose VMI never appeared goes after its grace), and VMIs
pinned to a node that is gone before they ever ran there, deleted so the VM starts again
elsewhere with its claims."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.calls.start_path import VmiDelete
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules import attachment as attachment_rules
from cozystack_gpu.binder.rules import claim_status
from cozystack_gpu.cluster.view import Key
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import attachment, translate

# The decision steps of attachments, beside the planner's (metrics and status writes).
ATTACHMENT_STEPS = ("Attach", "Detach")


class Attachments(BinderPart):
    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        # Attachments judged to stay as they are: the claim version and VMI state they were
        # judged on, and until when that holds (an attachment waiting for its VMI expires).
        self._judged: dict[ClaimKey, tuple[int, Any, float]] = {}
        # VMIs deleted (by uid): one is deleted once, though the view shows it until the
        # watch brings its end (KubeVirt's finalizers keep it a while).
        self._vmi_deletes: set[tuple[Key, str]] = set()

    def run(self, now: float) -> None:
        """Bound ⇄ Attached transitions, and attachments that never saw their VMI."""
        grace = self.config.attachment_grace
        attachments = self.view.attachments()
        judged = self._judged
        if len(judged) > 2 * sum(len(m) for _v, m in attachments) + 64:
            attached = {key for _v, members in attachments for key in members}
            self._judged = judged = {k: v for k, v in judged.items() if k in attached}
        for vmi_key, members in attachments:
            vmi = self.view.vmi(vmi_key)
            for key in list(members):
                if self.handle.in_flight((key,)):
                    continue
                obj = self.view.claim(key)
                if obj is None:
                    continue
                # Judged already against this very claim version and VMI state, and no
                # grace ran out since: the answer is the same (every turn would otherwise
                # judge every attachment again, thousands at a time).
                version = translate.resource_version(obj)
                last = judged.get(key)
                if last is not None and last[0] == version and last[1] == vmi and now < last[2]:
                    continue
                seen = self.view.attachment_seen_at(key, now)
                change = attachment_rules.attachment_change(obj, vmi, now, grace, seen)
                if change is None:
                    judged[key] = (version, vmi, _judged_until(obj, vmi, grace, seen))
                    continue
                body = claim_status.attachment_patch(obj, change, now)
                info = self.view.claim_info(key, now)
                step = (
                    ATTACHMENT_STEPS[0] if change.phase is Phase.ATTACHED else ATTACHMENT_STEPS[1]
                )
                if info is None:
                    continue  # gone since it was read above
                attached_to = None if change.clear_attachment else info.attached_to
                self.handle.decide(
                    replace(info, phase=change.phase, attached_to=attached_to),
                    Decision(key.namespace, key.name, body, step),
                )

    def attach_started(self, now: float) -> None:
        """Attach the claims a live VMI names to it, by uid, once the binder sees the VMI.

        The VMI webhook judges a start and writes nothing (SPEC §7), so this is the one
        place a held claim becomes a VMI's. One claim named by two live VMIs goes to the one
        seen first; the other's launcher pod waits at the gate, which says why.
        """
        for vmi in self.view.holding_vmis():
            for name in vmi.held_claims:
                key = ClaimKey(vmi.namespace, name)
                if self.handle.in_flight((key,)):
                    continue
                obj = self.view.claim(key)
                change = attachment_rules.start_attachment(obj, vmi)
                if change is None or obj is None:
                    continue
                info = self.view.claim_info(key, now)
                if info is None:
                    continue
                decided = replace(info, phase=Phase.ATTACHED, attached_to=vmi.name, vmi_live=True)
                body = claim_status.attachment_patch(obj, change, now)
                self.handle.decide(decided, Decision(*key, body, ATTACHMENT_STEPS[0]))

    def release_stuck_vmis(self) -> None:
        """Delete a VMI pinned to a node that is gone before it ever ran there.

        Its launcher pod can never be scheduled, so it would hold its Lost claims forever;
        deleted, the VM starts again and its claims move with it.
        """
        if self._vmi_deletes:  # forget those the watch saw go
            self._vmi_deletes = {d for d in self._vmi_deletes if self.view.vmi(d[0]) is not None}
        for vmi_key, members in self.view.attachments():
            vmi = self.view.vmi(vmi_key)
            if vmi is None or (vmi_key, vmi.uid) in self._vmi_deletes:
                continue
            if not attachment_rules.vmi_never_ran(vmi):
                continue
            stuck = False
            for key in members:
                claim = self.view.claim(key)
                status = (claim or {}).get("status") or {}
                # A claim Lost for want of room has no node: its set rebinds (and its pod
                # starts) once room appears, so that is no reason to delete the VMI.
                node = status.get("nodeName")
                if (
                    status.get("phase") == Phase.LOST.value
                    and node
                    and self.view.node(node) is None
                ):
                    stuck = True
            if stuck:
                sent = (vmi_key, vmi.uid)
                self._vmi_deletes.add(sent)
                self.handle.send(VmiDelete(*vmi_key, heard=partial(self._vmi_deleted, sent)))

    def _vmi_deleted(self, sent: tuple[Key, str], answer: Answer) -> None:
        if not answer.ok:
            self._vmi_deletes.discard(sent)  # tried again on the next turn


def _judged_until(
    claim: dict[str, Any], vmi: translate.VMIState | None, grace: float, seen: float | None
) -> float:
    """Until when an attachment judged to stay as it is stays so while nothing changes: for
    ever once its VMI is seen (the VMI's end is an event), until its grace runs out while
    it waits for its VMI."""
    attached = attachment.attachment_of(claim)
    if attached is None:
        return float("inf")
    if vmi is not None and attachment.same_vmi(attached, vmi) is not False:
        return float("inf")
    starts = [t for t in (attached.at, seen) if t is not None]
    return (max(starts) if starts else 0.0) + grace
