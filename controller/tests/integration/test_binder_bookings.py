"""The binder books reservations (SPEC §11) against the real API server: a window that fits
is booked on one node in the single loop, and orders then leave its units; a window that
does not fit waits saying why; two windows after the same last units get one booking.

No webhook runs here (each test has its own binder, binder_env.py): the binder judges every
window itself, as it must for one a lagging replica admitted."""

from __future__ import annotations

from typing import Any

import pytest
from binder_env import Env, condition
from prometheus_client import REGISTRY
from test_admission_reservations import tomorrow

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver


def reserve(kube: Kube, namespace: str, name: str, gpu_class: str, count: int) -> None:
    """Book ``count`` of the class tomorrow 09:00-18:00."""
    kube.reservation(
        namespace, name, gpu_class, count, tomorrow(9).timestamp(), tomorrow(18).timestamp()
    )


def reservation(env: Env, name: str) -> dict[str, Any]:
    return env.kube.get_reservation(env.tenant, name)


def wait_reservation(env: Env, name: str, phase: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = reservation(env, name)
        return obj if (obj.get("status") or {}).get("phase") == phase else None

    result: dict[str, Any] = wait_for(check, 15, f"reservation {name} {phase}")
    return result


def test_a_window_is_booked_on_one_node_and_orders_then_leave_its_units(env: Env) -> None:
    node = env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    decisions = ("cozystack_gpu_reservation_decisions_total", {"outcome": "Booked"})
    before = REGISTRY.get_sample_value(*decisions) or 0.0
    # The tenant's own booking: its role creates reservations; only the binder books them.
    reserve(env.tenant_admin(), env.tenant, "monday", gpu_class, 3)
    booked = wait_reservation(env, "monday", "Booked")
    assert (REGISTRY.get_sample_value(*decisions) or 0.0) == before + 1
    assert booked["status"]["nodeName"] == node
    assert booked["status"]["bookedAt"]
    cond = condition(booked, keys.CONDITION_BOOKED)
    assert (cond["status"], cond["reason"]) == ("True", "Booked")
    assert cond["message"].startswith(f"3 of class {gpu_class} booked on node {node} from ")
    # An order for good may take what the window leaves, not more.
    env.kube.claim(env.tenant, "two", gpu_class, 2)

    def refused() -> dict[str, Any] | None:
        found = condition(env.kube.get_claim(env.tenant, "two"))
        return found if found.get("reason") == "InsufficientCapacity" else None

    words = wait_for(refused, 15, "the order refused for the booked window")["message"]
    assert words == (
        f"no node serving class {gpu_class} has 2 free units; the largest has 1 (units "
        "reservations booked for their windows are not free to orders)"
    )
    env.kube.claim(env.tenant, "one", gpu_class, 1)
    assert env.wait_phase("one", "Bound")["status"]["nodeName"] == node


def test_a_window_that_does_not_fit_waits_saying_why(env: Env) -> None:
    env.node("n1", 2)
    gpu_class = env.gpu_class(maxCount=8)
    reserve(env.kube, env.tenant, "big", gpu_class, 4)
    waiting = wait_reservation(env, "big", "Pending")
    cond = condition(waiting, keys.CONDITION_BOOKED)
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientCapacity")
    assert cond["message"].startswith(f"no node serving class {gpu_class} has 4 units free"), cond
    assert "nodeName" not in waiting["status"]


def test_two_windows_after_the_same_last_units_get_one_booking(env: Env) -> None:
    env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    # Both written before the binder's next pass can see either booked.
    reserve(env.kube, env.tenant, "first", gpu_class, 3)
    reserve(env.kube, env.tenant, "second", gpu_class, 3)

    def settled() -> list[str] | None:
        phases = sorted(
            (reservation(env, n).get("status") or {}).get("phase") or ""
            for n in ("first", "second")
        )
        return phases if phases == ["Booked", "Pending"] else None

    wait_for(settled, 15, "one window booked and the other waiting")
    assert wait_reservation(env, "first", "Booked"), "the one that came first is booked"


def test_a_booked_window_whose_node_goes_moves_and_is_lost_when_none_has_room(env: Env) -> None:
    first = env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    reserve(env.kube, env.tenant, "monday", gpu_class, 3)
    assert wait_reservation(env, "monday", "Booked")["status"]["nodeName"] == first
    second = env.node("n2", 4)
    # The node is cordoned before the window (a Move class): the booking moves.
    env.kube.cordon(first)

    def on(node: str) -> dict[str, Any] | None:
        obj = reservation(env, "monday")
        status = obj.get("status") or {}
        return obj if status.get("phase") == "Booked" and status.get("nodeName") == node else None

    moved = wait_for(lambda: on(second), 15, "the booking moved to the other node")
    cond = condition(moved, keys.CONDITION_BOOKED)
    assert cond["reason"] == "Moved"
    assert cond["message"].endswith(f"moved because its node {first} is cordoned"), cond
    # Now that node goes too, and no node serving the class has room: Lost, saying why.
    env.kube.core.delete_node(second)
    lost = wait_reservation(env, "monday", "Lost")
    assert "nodeName" not in lost["status"]
    cond = condition(lost, keys.CONDITION_BOOKED)
    assert cond["status"] == "False"
    assert cond["message"].startswith(f"lost: its node {second} is gone, and no node has room"), (
        cond
    )
    # A node with room comes: the Lost window is placed again, first.
    third = env.node("n3", 4)
    assert wait_reservation(env, "monday", "Booked")["status"]["nodeName"] == third
