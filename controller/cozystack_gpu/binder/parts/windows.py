"""The binder's windows (SPEC §11): a booked reservation's start, the warning before its
end, and its end.

- At ``start`` a Booked reservation turns Active; then the claim of its name is made
  (``rules.windows.window_claim``) and bound onto the booked node. The model counts the
  window and that claim once (``booking`` gives the claim's units back while the window
  lasts), so the bind takes nothing an order could have had.
- At ``end - warnBefore`` the Ending condition and an Event on the reservation, and an Event
  on each VMI using the claim, say when it ends.
- At ``end`` the VMs using the claim are halted (a VMI without a VM is deleted), the claim
  is deleted (its finalizer keeps it, as any held claim, until its VMI has stopped) and the
  reservation is Ended, whatever phase it had (a Lost or Pending one held no units).

No watch event says that a moment has come: the part keeps each reservation's next moment
in a heap, fed by the reservations the view saw change, and looks at a reservation again
each turn until what its moment asks is done (each step waits for the write before it).
Deleting a reservation needs nothing here: the garbage collector deletes its claim.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import replace

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.calls.reservations import ReservationStatus
from cozystack_gpu.binder.calls.start_path import ClaimCreate, ClaimDelete, VmHalt, VmiDelete
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules import claim_status, windows
from cozystack_gpu.keys import ClaimReason, Phase
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.model.reservations import ReservationInfo, ReservationPhase
from cozystack_gpu.objects import MutableObj, translate
from cozystack_gpu.objects.conditions import condition
from cozystack_gpu.objects.translate import meta

HOLDING = (ReservationPhase.BOOKED, ReservationPhase.ACTIVE)


class Windows(BinderPart):
    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._moments: list[tuple[float, ClaimKey]] = []  # (when, reservation), a heap
        self._work: set[ClaimKey] = set()  # reservations whose moment came, not yet done
        self._seen_all = False

    def took_over(self) -> None:
        """A new term: every reservation's moments are looked at afresh."""
        self._seen_all = False

    def changed(self, reservations: Iterable[ClaimKey], claims: Iterable[ClaimKey]) -> None:
        """Reservations the view saw change, and claims (a window's claim has its
        reservation's key): their moments are worked out again."""
        raw = self.view.reservations
        for key in (*reservations, *claims):
            if raw.get(key) is not None:
                self._plan(key)

    def _plan(self, key: ClaimKey) -> None:
        obj = self.view.reservations.get(key)
        info = translate.reservation_info(obj) if obj is not None else None
        if info is None:
            return
        if info.phase is ReservationPhase.ENDED:
            if self.view.claim(key) is not None:
                self._work.add(key)  # its claim's delete may not have landed
            return
        warn = info.end - self.config.reservation_warn_before
        for moment in (info.start, warn, info.end):
            heapq.heappush(self._moments, (moment, key))
        self._work.add(key)  # a moment already past is acted on at once

    def run(self, now: float) -> None:
        if not self._seen_all:
            self._seen_all = True
            for key in self.view.reservations.keys():  # noqa: SIM118 (a method, not a dict)
                self._plan(key)
        while self._moments and self._moments[0][0] <= now:
            self._work.add(heapq.heappop(self._moments)[1])
        for key in sorted(self._work):
            if self._step(key, now):
                self._work.discard(key)

    def _step(self, key: ClaimKey, now: float) -> bool:
        """Do what the reservation's moment asks; True once nothing is left until its next
        moment (which the heap holds)."""
        obj = self.view.reservations.get(key)
        info = translate.reservation_info(obj) if obj is not None else None
        if obj is None or info is None:
            return True
        if self.handle.writing((ReservationStatus.what, *key)):
            return False  # judged again on what the write leaves
        if info.phase is ReservationPhase.ENDED:
            self._delete_claim(obj, info)
            return True
        if now >= info.end:
            return self._end(obj, info, now)
        if now < info.start or info.phase not in HOLDING:
            return True
        if info.phase is ReservationPhase.BOOKED:
            self._send(key, windows.active_patch(obj, info, now), "window-open")
            self.handle.event(
                obj, windows.ACTIVE_REASON, f"window open: {windows.bound_words(info)}", False,
                kind=keys.GPU_RESERVATION,
            )  # fmt: skip
            return False
        if not self._claim_bound(obj, info, now):
            return False
        if now >= info.end - self.config.reservation_warn_before and not windows.warned(obj):
            self._warn(obj, info, now)
        return True

    def _claim_bound(self, obj: MutableObj, info: ReservationInfo, now: float) -> bool:
        """The window's claim made and bound on the booked node; True once it is (or once
        another claim of its name is found, which the reservation then says)."""
        key = info.key
        claim = self.view.claim(key)
        if claim is None:
            if not self.handle.writing((ClaimCreate.what, *key)):
                made = windows.window_claim(obj, info)
                self.handle.send(ClaimCreate(key.namespace, key.name, made))
            return False
        if not windows.made_by(claim, obj):
            taken = windows.taken_patch(obj, windows.name_taken(claim, info), now)
            if taken is not None:
                self._send(key, taken, "window-claim-taken")
                self.handle.event(
                    obj, windows.CLAIM_TAKEN_REASON, windows.name_taken(claim, info), True,
                    kind=keys.GPU_RESERVATION,
                )  # fmt: skip
            return True  # looked at again when that claim changes (``changed``)
        current = self.handle.snapshot.claim(key)
        if current is None or self.handle.in_flight([key]):
            return False
        if current.phase is not Phase.PENDING:
            return True  # bound (or, its node gone, Lost: rebound as any hold)
        snap = self.handle.snapshot
        if info.node is None or snap.node(info.node) is None:
            return False  # its node went at the start: the bookings part places it again
        klass = snap.gpu_class(info.class_name)
        if klass is not None and snap.free(info.node, klass.resource_name) < info.count:
            # The window before it on the node still holds them (its VM is stopping): the
            # claim waits for them, never over the node's capacity.
            return False
        if self.handle.vacated_in_flight(info.node):
            return False  # a claim's move off the node is not answered yet: its pod may run on
        bound = replace(current, phase=Phase.BOUND, node=info.node, bound_at=now)
        cond = condition(
            keys.CONDITION_BOUND, True, ClaimReason.BOUND, windows.bound_words(info), now
        )
        body = claim_status.claim_status_patch(claim, bound, cond)
        self.handle.decide(bound, Decision(key.namespace, key.name, body, "bind"))
        return False

    def _warn(self, obj: MutableObj, info: ReservationInfo, now: float) -> None:
        words = windows.ending_words(info, now)
        self._send(info.key, windows.ending_patch(obj, info, now), "window-ending")
        self.handle.event(obj, windows.ENDING_REASON, words, True, kind=keys.GPU_RESERVATION)
        for vmi_name in self._users(info):
            vmi = self.view.vmi_object((info.namespace, vmi_name))
            if vmi is not None:
                self.handle.event(vmi, windows.ENDING_REASON, words, True, kind=keys.VMI)

    def _end(self, obj: MutableObj, info: ReservationInfo, now: float) -> bool:
        """Halt the claim's VMs, delete the claim, then say Ended; True once Ended is out."""
        for vmi_name in self._users(info):
            self._stop(info.namespace, vmi_name)
        self._delete_claim(obj, info)
        self._send(info.key, windows.ended_patch(obj, info, now), "window-ended")
        self.handle.event(
            obj, windows.ENDED_REASON, windows.ended_words(info), False, kind=keys.GPU_RESERVATION
        )
        return False  # done when the view shows it Ended (``_step``)

    def _delete_claim(self, obj: MutableObj, info: ReservationInfo) -> None:
        """The window's claim deleted (its finalizer keeps it until its VMI has stopped)."""
        key = info.key
        claim = self.view.claim(key)
        if claim is None or not windows.made_by(claim, obj) or meta(claim).get("deletionTimestamp"):
            return
        if not self.handle.writing((ClaimDelete.what, *key)):
            why = f"GPUReservation {info.name}'s window ended"
            uid = str(meta(claim).get("uid") or "")
            self.handle.send(ClaimDelete(key.namespace, key.name, uid, why))

    def _users(self, info: ReservationInfo) -> list[str]:
        """The live VMIs using the window's claim: the one it is attached to."""
        vmi = self.view.attached_vmi(info.key)
        return [vmi.name] if vmi is not None and not vmi.final else []

    def _stop(self, namespace: str, vmi_name: str) -> None:
        """Halt the VM that runs the VMI; a VMI of no VM is deleted."""
        vmi = self.view.vmi_object((namespace, vmi_name))
        if vmi is None:
            return
        vm = _owning_vm(vmi)
        if vm is not None:
            if not self.handle.writing((VmHalt.what, namespace, vm)):
                self.handle.send(VmHalt(namespace, vm, windows.HALT_PATCH))
        elif not self.handle.writing((VmiDelete.what, namespace, vmi_name)):
            self.handle.send(VmiDelete(namespace, vmi_name))

    def _send(self, key: ClaimKey, body: MutableObj, label: str) -> None:
        self.handle.send(ReservationStatus(key.namespace, key.name, body, label))


def _owning_vm(vmi: MutableObj) -> str | None:
    for ref in meta(vmi).get("ownerReferences") or []:
        if ref.get("kind") == keys.VM.kind and ref.get("controller"):
            return str(ref.get("name") or "") or None
    return None
