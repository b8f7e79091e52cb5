"""The order of a leader's turn (``Binder._turn``): a migration's records go out first, and
what is answered while a step runs is taken in before the next step, so a target pod whose
set is recorded is pinned in the turn it came in, as soon as the record is answered
(issue 44: at 1,000 VMs a busy turn takes a good part of a second, and a target waited for
the next drain where a start did not)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
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
# The steps of a turn, in order; the catch-up's placing of targets (``caught_up``) is
# recorded too.
STEPS = (
    ("migrations", "run"),
    ("attachments", "run"),
    ("attachments", "attach_started"),
    ("publisher", "protect"),
    ("gatekeeper", "run"),
    ("rejections", "run"),
    ("bookings", "run"),
    ("windows", "run"),
    ("dra_claims", "run"),
    ("attachments", "release_stuck_vmis"),
)
PARTS = (*STEPS, ("migrations", "caught_up"), ("publisher", "publish"))


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


@pytest.mark.parametrize("step", [f"{part}.{name}" for part, name in STEPS])
def test_what_is_answered_while_a_step_runs_is_taken_in_before_the_next_step(step: str) -> None:
    """Whichever step the record's answer comes back during, the target pod is placed on it
    (``caught_up``) before the turn's next step, not at the end of the turn."""
    _binder, calls = _turn_answered_during(step)
    answered = calls.index("answered:WRITTEN")
    assert calls[answered - 1] == step
    assert calls[answered + 1] == "migrations.caught_up"
    assert calls[-1] == "publisher.publish"


def test_a_record_answered_while_the_migrations_run_is_in_the_snapshot_for_the_gate() -> None:
    binder, calls = _turn_answered_during("migrations.run")
    assert calls.index("migrations.run") == 0, "the records go out first"
    assert calls.index("migrations.caught_up") < calls.index("attachments.run")
    assert not binder.inflight, "the answer released the claim for the rest of the turn"
    claim = binder.snapshot.claim(KEY)
    assert claim is not None and claim.migration is not None
    assert claim.migration.node == "n2", "the snapshot took in what the answer brought"


def test_a_turn_in_which_nothing_was_answered_places_the_gated_targets_once() -> None:
    _binder, calls = _turn_answered_during(None)
    assert "migrations.caught_up" not in calls, "nothing new: run placed them already"
    assert [c for c in calls if c.startswith("gatekeeper")] == ["gatekeeper.run"]
    assert [c for c in calls if not c.startswith("migrations.caught")] == [
        *(f"{part}.{name}" for part, name in STEPS),
        "publisher.publish",
    ]
