"""What the binder writes on a reservation: the booking, and why one waits, told once."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import reservation_status
from cozystack_gpu.model import Reason, Refusal
from cozystack_gpu.model.reservations import ReservationInfo

NOW = 1_800_000_000.0
START = 1_800_086_400  # a day later, on a whole minute
INFO = ReservationInfo("tenant-a", "monday", "uid-1", "h100", 3, START, START + 9 * 3600)


def obj(status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "monday", "resourceVersion": "41"}, "status": status or {}}


def test_a_booking_names_its_node_and_window_and_is_guarded_by_the_version_it_saw() -> None:
    body = reservation_status.booked_patch(obj(), INFO, "gpu-01", NOW)
    assert body["metadata"] == {"resourceVersion": "41"}
    status = body["status"]
    assert (status["phase"], status["nodeName"]) == ("Booked", "gpu-01")
    assert status["bookedAt"] == "2027-01-15T08:00:00Z"
    (cond,) = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        keys.CONDITION_BOOKED,
        "True",
        "Booked",
    )
    assert cond["message"] == (
        "3 of class h100 booked on node gpu-01 from 2027-01-16T08:00:00Z to 2027-01-16T17:00:00Z"
    )


def test_why_a_window_waits_is_written_once_and_again_only_when_it_changes() -> None:
    short = Refusal(Reason.INSUFFICIENT_CAPACITY, "no node serving class h100 has 3 units free")
    body = reservation_status.waiting_patch(obj(), short, NOW)
    assert body is not None and body["status"]["phase"] == "Pending"
    (cond,) = body["status"]["conditions"]
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientCapacity")
    told = obj(body["status"])
    assert reservation_status.waiting_patch(told, short, NOW + 60) is None
    budget = Refusal(Reason.BUDGET_EXCEEDED, "budget gpu.cozystack.io/h100 of tenant-a allows 2")
    again = reservation_status.waiting_patch(told, budget, NOW + 120)
    assert again is not None
    assert again["status"]["conditions"][0]["reason"] == "BudgetExceeded"
