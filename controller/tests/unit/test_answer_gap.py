"""The upgrade test's webhook gap is never lost: a rollout that ends the moment the webhook
answers again once stopped the probes inside the gap, which then read 0.0 s while the order
in flight had been refused for 1.5 s (CI, 2026-12-04)."""

from __future__ import annotations

import threading
import time

import pytest

from cozystack_gpu_testkit.answer_gap import Gap

PERIOD_S = 0.1


class FakeTime:
    """A clock that moves only when the probe sleeps: each probe is one period later."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        time.sleep(0.001)  # lets the test's thread run


class Outage:
    """Answers ``answered_first`` probes, then refuses until the change is over (the gap's
    exit began) and ``refused_after`` more probes were refused, then answers again; or
    never again."""

    def __init__(self, answered_first: int, refused_after: int | None) -> None:
        self.answered_first = answered_first
        self.refused_after = refused_after
        self.calls = 0
        self.refused_calls = threading.Event()
        self.answered_five = threading.Event()
        self.gap: Gap | None = None
        self._after = 0

    def __call__(self) -> bool:
        self.calls += 1
        if self.calls <= self.answered_first:
            if self.calls == 5:
                self.answered_five.set()
            return True
        self.refused_calls.set()
        assert self.gap is not None
        if self.gap._closing.is_set() and self.refused_after is not None:
            self._after += 1
            return self._after > self.refused_after
        return False


def _rollout(outage: Outage, *, refused_before_the_end: bool = True, **kwargs: float) -> Gap:
    fake = FakeTime()
    gap = Gap(outage, period_s=PERIOD_S, clock=fake.clock, sleep=fake.sleep, **kwargs)
    outage.gap = gap
    with gap:
        # The change ends while the webhook refuses, or once it answered five probes.
        ended = outage.refused_calls if refused_before_the_end else outage.answered_five
        assert ended.wait(10)
    return gap


def test_a_gap_still_open_when_the_rollout_ends_is_measured_to_its_next_answer() -> None:
    gap = _rollout(Outage(answered_first=3, refused_after=4))
    assert gap.closed
    assert gap.refused >= 4
    # Every refused probe is a period of gap: none of it is lost.
    assert gap.longest_s == pytest.approx(gap.refused * PERIOD_S)


def test_a_gap_that_never_closes_counts_to_the_end_of_the_wait() -> None:
    gap = _rollout(Outage(answered_first=2, refused_after=None), close_within_s=1.0)
    assert not gap.closed
    # Refused from the third probe to the deadline, a second after the change ended.
    assert gap.longest_s >= 1.0
    assert gap.longest_s == pytest.approx((gap.refused - 1) * PERIOD_S)


def test_a_webhook_that_answers_throughout_has_no_gap() -> None:
    gap = _rollout(Outage(answered_first=10**9, refused_after=0), refused_before_the_end=False)
    assert gap.closed and gap.refused == 0 and gap.probes >= 5
    assert gap.longest_s == pytest.approx(0.0, abs=1e-9)


def test_a_change_that_fails_stops_the_probing_at_once() -> None:
    outage = Outage(answered_first=2, refused_after=None)
    fake = FakeTime()
    gap = Gap(outage, period_s=PERIOD_S, clock=fake.clock, sleep=fake.sleep)
    outage.gap = gap
    with pytest.raises(RuntimeError), gap:
        assert outage.refused_calls.wait(10)
        raise RuntimeError("the rollout timed out")
    # Not the two minutes the gap would wait to close: the next probe ends it.
    assert gap._thread is not None and not gap._thread.is_alive()
    assert not gap.closed and fake.now < 60
