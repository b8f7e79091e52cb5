"""A GPUReservation as the booking model reads it (``translate.reservation_info``): its
window in epoch seconds whatever the offset it was written with, its phase and node, and
nothing held for a window that cannot be read."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu.model import ReservationPhase
from cozystack_gpu.objects import translate

MONDAY_9 = datetime.datetime(2026, 12, 14, 9, 0, tzinfo=datetime.UTC)


def reservation(start: str, end: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train",
            "namespace": "tenant-acme",
            "uid": "u-1",
            "creationTimestamp": "2026-12-06T12:00:00Z",
        },
        "spec": {"class": "h100", "count": 8, "start": start, "end": end},
        "status": status,
    }


def test_a_booked_reservation_reads_as_its_window_phase_and_node() -> None:
    info = translate.reservation_info(
        reservation(
            "2026-12-14T09:00:00Z", "2026-12-14T18:00:00Z", phase="Booked", nodeName="gpu-1"
        )
    )
    assert info is not None
    assert (info.namespace, info.name, info.uid, info.class_name, info.count) == (
        "tenant-acme",
        "train",
        "u-1",
        "h100",
        8,
    )
    nine = int(MONDAY_9.timestamp())
    assert (info.start, info.end) == (nine, nine + 9 * 3600)
    assert (info.phase, info.node) == (ReservationPhase.BOOKED, "gpu-1")
    assert info.holds_node and info.counts_budget


def test_a_new_reservation_is_pending_and_holds_nothing() -> None:
    info = translate.reservation_info(reservation("2026-12-14T09:00:00Z", "2026-12-14T18:00:00Z"))
    assert info is not None
    assert info.phase is ReservationPhase.PENDING
    assert not info.holds_node and not info.counts_budget


def test_a_window_that_cannot_be_read_holds_nothing() -> None:
    for start, end in (
        ("", "2026-12-14T18:00:00Z"),
        ("monday", "2026-12-14T18:00:00Z"),
        ("2026-12-14T18:00:00Z", "2026-12-14T09:00:00Z"),
        ("2026-12-14T09:00:30Z", "2026-12-14T18:00:00Z"),
    ):
        assert translate.reservation_info(reservation(start, end)) is None, (start, end)


def test_an_unknown_phase_reads_as_pending() -> None:
    info = translate.reservation_info(
        reservation("2026-12-14T09:00:00Z", "2026-12-14T18:00:00Z", phase="Running")
    )
    assert info is not None and info.phase is ReservationPhase.PENDING


@given(
    start_minute=st.integers(min_value=0, max_value=90 * 24 * 60),
    minutes=st.integers(min_value=1, max_value=30 * 24 * 60),
    offset_minutes=st.integers(min_value=-12 * 60, max_value=14 * 60),
)
def test_any_whole_minute_window_in_any_offset_is_the_same_instant(
    start_minute: int, minutes: int, offset_minutes: int
) -> None:
    start = MONDAY_9 + datetime.timedelta(minutes=start_minute)
    end = start + datetime.timedelta(minutes=minutes)
    zone = datetime.timezone(datetime.timedelta(minutes=offset_minutes))
    info = translate.reservation_info(
        reservation(start.astimezone(zone).isoformat(), end.astimezone(zone).isoformat())
    )
    assert info is not None
    assert (info.start, info.end) == (int(start.timestamp()), int(end.timestamp()))
    assert info.length == minutes * 60
