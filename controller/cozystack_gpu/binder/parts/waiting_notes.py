"""Why each waiting claim waits, told on the claim (its Bound condition, the Pending phase
of an order not bound yet): once per distinct reason, at most ``WAIT_NOTES_PER_S`` writes a
second, and none while a placement write is out, so a burst of orders that do not fit never
takes the API server's time from the binds. A note not written now is written on a later
pass."""

from __future__ import annotations

from collections.abc import Iterable

from cozystack_gpu import metrics
from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.claims import ClaimNote, Note
from cozystack_gpu.binder.parts.handle import BinderPart, PartHandle
from cozystack_gpu.binder.rules import claim_status
from cozystack_gpu.model import Action, ClaimKey

# "Why it waits" condition writes a second, at most; a few refusals are told at once (the
# bucket holds this many). Each costs the API server as much as a bind: measured on 2
# cores, 100 a second behind 10,000 refused orders tripled the bind latency of the orders
# that fit.
WAIT_NOTES_PER_S = 20


class WaitingNotes(BinderPart):
    def __init__(self, handle: PartHandle) -> None:
        super().__init__(handle)
        self._written: dict[ClaimKey, tuple[str, str]] = {}  # what each claim was told
        self._counted: set[ClaimKey] = set()  # refusals counted in the metric once
        self._budget = float(WAIT_NOTES_PER_S)
        self._refilled = 0.0

    def refill(self, now: float) -> None:
        self._budget = min(
            WAIT_NOTES_PER_S, self._budget + (now - self._refilled) * WAIT_NOTES_PER_S
        )
        self._refilled = now

    def tell(self, waits: Iterable[Action], now: float, *, placing: bool) -> None:
        """Orders never judged before are told first: a new order shows Pending at once,
        even while a new leader tells a backlog of older waiting claims their changed
        reasons."""
        waits = list(waits)
        for fresh in (True, False):
            for action in waits:
                self._tell(action, now, fresh=fresh, placing=placing)

    def forget(self, key: ClaimKey) -> None:
        """The claim was decided, went, or its note did not land: tell it again if it waits."""
        self._written.pop(key, None)

    def _tell(self, action: Action, now: float, *, fresh: bool, placing: bool) -> None:
        """Say on each waiting claim why it waits, once per distinct reason; only on claims
        with no phase yet when ``fresh``, only on the others when not.

        At most WAIT_NOTES_PER_S such writes a second, and none while a placement write is
        out: a burst of orders that do not fit must not take the API server's time from
        the binds. A note not written now is written on a later pass.
        """
        refusal = action.refusal
        if refusal is None or placing or self._budget < 1:
            return  # placements first; the next pass (at most REPLAN_S away) says it
        said = (str(refusal.reason), refusal.message)
        cond = claim_status.waiting_condition(refusal, now)
        for key in action.claims:
            if self._budget < 1:
                return
            if self._written.get(key) == said:
                continue
            obj = self.view.claim(key)
            if obj is None or fresh == bool((obj.get("status") or {}).get("phase")):
                continue
            self._written[key] = said
            if key not in self._counted:
                self._counted.add(key)
                metrics.REFUSALS.labels(str(refusal.reason)).inc()
            if not claim_status.waiting_note_due(obj, cond):
                continue
            self._budget -= 1
            # Not a placement: queued behind every bind and not held in flight, so a burst
            # of refusals never delays or blocks a bind.
            body = claim_status.waiting_patch(obj, cond)
            self.handle.send(ClaimNote(*key, body, Note.WAIT, heard=self._heard))

    def _heard(self, answer: Answer) -> None:
        if not answer.ok and isinstance(answer.call, ClaimNote):
            self.forget(answer.call.claim)
