"""The order of a leader's turn (``Binder._turn``): a migration's records go out first, and
what is answered while the parts run is taken in twice in the turn (before the gate, before
the publisher), so a target pod whose set is recorded is pinned in the turn it came in
(issue 44: at 1,000 VMs a turn takes about a second, and a target waited for the next drain
where a start did not)."""

from __future__ import annotations

import copy
from typing import Any

from test_decision_counts import BOUND, NS, _claim, _nowhere

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer, Outcome
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.model import ClaimKey
from cozystack_gpu_testkit.objects import binder_config

NOW = 1_800_000_000.0
KEY = ClaimKey(NS, "c")
TARGET = {"node": "n2", "migrationUID": "mig-1", "since": "2026-12-01T10:00:00Z"}
PARTS = (
    ("migrations", "run"),
    ("attachments", "run"),
    ("attachments", "attach_started"),
    ("publisher", "protect"),
    ("migrations", "place_gated"),
    ("gatekeeper", "run"),
    ("rejections", "run"),
    ("bookings", "run"),
    ("windows", "run"),
    ("attachments", "release_stuck_vmis"),
    ("publisher", "publish"),
)


def _recording(binder: Binder, calls: list[str], on: dict[str, Any] | None = None) -> None:
    """Every part's step of the turn replaced by one that writes its name in ``calls`` (and
    does what ``on`` gives for it)."""
    for part, step in PARTS:
        name = f"{part}.{step}"

        def record(*_args: Any, _name: str = name) -> None:
            calls.append(_name)
            if on and _name in on:
                on[_name]()

        setattr(getattr(binder, part), step, record)


def _record_sent_and_answered(binder: Binder, calls: list[str]) -> None:
    """As the migrations part does: a record of the claim sent; its answer comes back to
    the loop's queue while the turn goes on (the writer's thread)."""
    binder.view.apply(keys.GPU_CLAIM.kind, _claim(1, copy.deepcopy(BOUND)), deleted=False)
    body = {"metadata": {"resourceVersion": "1"}, "status": {"migration": TARGET}}

    def heard(answer: Answer) -> None:
        calls.append(f"answered:{answer.outcome.name}")

    call = Decision(NS, "c", body, "migrate", heard=heard)
    binder._out[call.key] += 1
    binder.inflight.add(call.claim)
    landed = _claim(2, {**copy.deepcopy(BOUND), "migration": TARGET})
    binder._threads.queue.put(Answer(call, Outcome.WRITTEN, obj=landed))


def _turn_answered_during(step: str | None) -> tuple[Binder, list[str]]:
    """One turn of a fresh binder whose parts record their steps; a record's answer comes
    back while ``step`` runs (none with None). The binder and the steps, in order."""
    binder = Binder(_nowhere(), binder_config("ctl"))
    binder.snapshot = binder.view.build_snapshot(NOW)
    calls: list[str] = []
    on = {step: lambda: _record_sent_and_answered(binder, calls)} if step else None
    _recording(binder, calls, on=on)
    binder._turn(NOW)
    return binder, calls


def test_a_record_answered_while_the_turn_runs_is_taken_in_before_the_gate_pins() -> None:
    binder, calls = _turn_answered_during("migrations.run")
    assert calls.index("migrations.run") == 0, "the records go out first"
    answered = calls.index("answered:WRITTEN")
    assert calls.index("publisher.protect") < answered < calls.index("migrations.place_gated")
    assert calls.index("migrations.place_gated") < calls.index("gatekeeper.run")
    assert not binder.inflight, "the answer released the claim for the rest of the turn"
    claim = binder.snapshot.claim(KEY)
    assert claim is not None and claim.migration is not None
    assert claim.migration.node == "n2", "the snapshot took in what the answer brought"


def test_a_record_sent_at_the_gate_and_answered_during_the_plan_pins_before_the_turn_ends() -> None:
    """A target pod that came in the first catch-up has its record sent there; its answer,
    in while the gate and the plan run, is taken in before the publisher."""
    _binder, calls = _turn_answered_during("gatekeeper.run")
    answered = calls.index("answered:WRITTEN")
    assert calls.index("attachments.release_stuck_vmis") < answered
    assert answered < calls.index("migrations.place_gated") < calls.index("publisher.publish")
    assert calls[-1] == "publisher.publish"


def test_a_turn_in_which_nothing_was_answered_places_the_gated_targets_once() -> None:
    _binder, calls = _turn_answered_during(None)
    assert "migrations.place_gated" not in calls, "nothing new: run placed them already"
    assert [c for c in calls if c.startswith("gatekeeper")] == ["gatekeeper.run"]
