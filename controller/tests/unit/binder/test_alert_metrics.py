"""The metrics the chart's alerts read that the binder computes beside placement: the age
of each class's oldest waiting order and whether the settings ConfigMap write fails."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, cast

from prometheus_client import REGISTRY

from cozystack_gpu import metrics
from cozystack_gpu.binder.calls.base import Answer, Outcome
from cozystack_gpu.binder.calls.reports import Settings
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import (
    ClaimInfo,
    ClaimKey,
    ReservationInfo,
    ReservationPhase,
    Snapshot,
    booked_by_class,
)

OLDEST = "cozystack_gpu_class_oldest_waiting_order_timestamp_seconds"


def claim(name: str, class_name: str, created: float) -> ClaimInfo:
    return ClaimInfo(namespace="t", name=name, class_name=class_name, count=1, created=created)


def test_each_class_reports_its_oldest_waiting_order_lost_claims_aside() -> None:
    snap = Snapshot.build(
        claims=[
            claim("a", "h100", 200.0),
            claim("b", "h100", 100.0),
            claim("c", "l40s", 300.0),
            claim("unknown-age", "t4", 0.0),
            replace(claim("lost", "l40s", 10.0), phase=Phase.LOST, node="n1"),
        ]
    )
    assert snap.oldest_waiting() == {"h100": 100.0, "l40s": 300.0}
    assert snap.waiting_count() == 4
    snap.remove_claim(ClaimKey("t", "b"))
    snap.upsert_claim(replace(claim("c", "l40s", 300.0), phase=Phase.BOUND, node="n1"))
    assert snap.oldest_waiting() == {"h100": 200.0}
    assert snap.waiting_count() == 2


def test_a_class_nothing_waits_for_any_more_loses_its_series() -> None:
    metrics.set_oldest_waiting({"alert-a": 100.0, "alert-b": 200.0})
    assert REGISTRY.get_sample_value(OLDEST, {"class": "alert-a"}) == 100.0
    assert REGISTRY.get_sample_value(OLDEST, {"class": "alert-b"}) == 200.0
    metrics.set_oldest_waiting({"alert-b": 250.0})
    assert REGISTRY.get_sample_value(OLDEST, {"class": "alert-a"}) is None
    assert REGISTRY.get_sample_value(OLDEST, {"class": "alert-b"}) == 250.0
    metrics.set_oldest_waiting({})
    assert REGISTRY.get_sample_value(OLDEST, {"class": "alert-b"}) is None


def test_the_settings_gauge_follows_the_last_write() -> None:
    call = Settings("cozy-gpu", {})
    view = cast(Any, object())  # a settings answer changes nothing in the view

    def failing() -> float | None:
        return REGISTRY.get_sample_value("cozystack_gpu_settings_write_failing")

    call.apply(Answer(call, Outcome.FAILED, error="403 Forbidden"), view)
    assert failing() == 1
    call.apply(Answer(call, Outcome.WRITTEN), view)
    assert failing() == 0


def test_known_label_values_start_at_zero_so_rates_see_the_first_event() -> None:
    metrics.start_at_zero(steps=["ZeroStep"], reasons=["ZeroReason"], webhooks=["zero-hook"])
    assert (
        REGISTRY.get_sample_value("cozystack_gpu_binder_decisions_total", {"step": "ZeroStep"}) == 0
    )
    assert REGISTRY.get_sample_value("cozystack_gpu_refusals_total", {"reason": "ZeroReason"}) == 0
    assert (
        REGISTRY.get_sample_value("cozystack_gpu_admission_errors_total", {"webhook": "zero-hook"})
        == 0
    )


def window(
    name: str, class_name: str, count: int, start: int, end: int, phase: str = "Booked"
) -> ReservationInfo:
    held = phase in ("Booked", "Active")
    return ReservationInfo("t", name, f"uid-{name}", class_name, count, start, end,
                           node="n1" if held else None, phase=ReservationPhase(phase))  # fmt: skip


def test_booked_units_are_counted_at_each_whole_hour_ahead_for_a_day() -> None:
    now = 36_000.0 + 600  # 10:10 on day one: the first hour counted is 11:00
    windows = [
        window("a", "h100", 8, 11 * 3600, 18 * 3600),  # 11:00-18:00: hours 0 to 6
        window("b", "h100", 2, 17 * 3600, 17 * 3600 + 60, "Active"),  # 17:00-17:01: hour 6
        window("c", "h100", 4, 9 * 3600, 10 * 3600 + 1800),  # ended at 10:30: none
        window("d", "l40s", 1, 30 * 3600, 40 * 3600),  # 06:00 next day on: hours 19 to 23
        # Booked on no node: they hold no units (the CLI's column counts the same).
        window("e", "h100", 16, 11 * 3600, 12 * 3600, "Lost"),
        window("f", "h100", 16, 11 * 3600, 12 * 3600, "Pending"),
        window("g", "h100", 16, 11 * 3600, 12 * 3600, "Ended"),
    ]
    hours = metrics.booked_by_hour(booked_by_class(windows), now)
    assert hours["h100"][:8] == [8, 8, 8, 8, 8, 8, 10, 0]
    assert sum(hours["h100"]) == 8 * 7 + 2
    assert hours["l40s"] == [0] * 19 + [1] * 5
