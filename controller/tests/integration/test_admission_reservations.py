"""The GPUReservation webhook, called by the real kube-apiserver over HTTPS (SPEC §11): a
tenant's window is booked at create time when it fits, refused when it does not with what
is short and the earliest window that fits, and an on-demand order that would eat into a
booked window is refused by the claim webhook; cancelling the window gives its units back.

No binder runs here: the test writes a booking's status as the binder writes it."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Corner, Replica, refusal, serving
from kubernetes.client.rest import ApiException
from test_admission_catalog import CLAIM_HOOK, order

from cozystack_gpu import keys
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

HOOK = 'admission webhook "gpureservation.gpu.cozystack.io" denied the request: '
HOUR = datetime.timedelta(hours=1)


@pytest.fixture(scope="module")
def replica(
    control_plane: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    # A hoster's shorter limits: windows start at most 30 days ahead and last at most 2.
    args = ("--reservation-max-lead=30d", "--reservation-max-length=2d")
    with serving(control_plane, kube, tmp_path_factory.mktemp("booking"), args=args) as running:
        yield running


@pytest.fixture
def corner(kube: Kube, replica: Replica) -> Corner:
    return Corner(kube)


def tomorrow(hour: int) -> datetime.datetime:
    day = datetime.datetime.now(datetime.UTC).date() + datetime.timedelta(days=1)
    return datetime.datetime(day.year, day.month, day.day, hour, tzinfo=datetime.UTC)


def rfc3339(t: datetime.datetime) -> str:
    return translate.rfc3339(t.timestamp())


def reserve(
    kube: Kube,
    namespace: str,
    name: str,
    gpu_class: str,
    count: int,
    start: datetime.datetime,
    end: datetime.datetime,
    **kw: Any,
) -> Any:
    return kube.reservation(
        namespace, name, gpu_class, count, start.timestamp(), end.timestamp(), **kw
    )


def booked(kube: Kube, namespace: str, name: str, node: str) -> None:
    """Write a reservation's status as the binder writes a booking."""
    now = rfc3339(datetime.datetime.now(datetime.UTC))
    kube.custom.patch_namespaced_custom_object_status(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_RESERVATIONS,
        name,
        {"status": {"phase": "Booked", "nodeName": node, "bookedAt": now}},
    )


def admitted_once_seen(kube: Kube, namespace: str, name: str, *args: Any) -> Any:
    """Book once this replica's watches have what the window needs (its class and node):
    until then the webhook refuses what it cannot place, and each try is a dry run."""

    def fits() -> bool:
        try:
            reserve(kube, namespace, name, *args, dry_run="All")
        except ApiException as exc:
            if exc.status == 403 and "no node serves" in refusal(exc):
                return False
            raise
        return True

    wait_for(fits, 15, f"the replica to see what reservation {name} needs")
    return reserve(kube, namespace, name, *args)


def refused(kube: Kube, namespace: str, name: str, *args: Any) -> str:
    """The refusal of a booking, once the replica's watches show what the test wrote (each
    try is a dry run); then the same booking for real, refused the same way."""
    found: list[str] = []

    def refuses() -> bool:
        try:
            reserve(kube, namespace, name, *args, dry_run="All")
        except ApiException as exc:
            found[:] = [refusal(exc)]
            return "no node serves" not in found[0]
        return False

    wait_for(refuses, 15, f"reservation {name} to be refused")
    with pytest.raises(ApiException) as real:
        reserve(kube, namespace, name, *args)
    assert refusal(real.value) == found[0]
    return found[0]


def test_a_tenant_books_a_window_and_one_that_no_longer_fits_is_offered_the_earliest(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    node = corner.node("n1", 4)
    gpu_class = corner.gpu_class("h100")
    nine, six = tomorrow(9), tomorrow(18)
    # A dry run that fits writes nothing; the tenant's own booking is admitted.
    reserve_args = (gpu_class, 4, nine, six)
    admitted_once_seen(tenant_admin, namespace, "monday", *reserve_args)
    booked(kube, namespace, "monday", node)
    # Inside that window nothing is left; the earliest hour that fits starts as it ends.
    assert refused(tenant_admin, namespace, "more", gpu_class, 1, nine + HOUR, nine + 2 * HOUR) == (
        f"{HOOK}no node serving class {gpu_class} has 1 unit free from "
        f"{rfc3339(nine + HOUR)} to {rfc3339(nine + 2 * HOUR)}; the largest has 0 then; the "
        f"earliest window of 1h that fits starts at {rfc3339(six)}"
    )
    # After it, the node is free again.
    reserve(tenant_admin, namespace, "evening", gpu_class, 4, six, six + HOUR)


def test_an_order_that_would_eat_into_a_booked_window_is_refused_until_it_is_cancelled(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    node = corner.node("n1", 4)
    gpu_class = corner.gpu_class("h100")
    corner.bound(namespace, "running", gpu_class, node=node)
    admitted_once_seen(tenant_admin, namespace, "window", gpu_class, 3, tomorrow(9), tomorrow(18))
    booked(kube, namespace, "window", node)
    message = (
        f"{CLAIM_HOOK}no node serving class {gpu_class} has 1 free unit; the largest has 0 "
        "(units reservations booked for their windows are not free to orders)"
    )

    def order_refused() -> bool:
        try:
            order(tenant_admin, namespace, "for-good", gpu_class, 1, dry_run="All")
        except ApiException as exc:
            return refusal(exc) == message
        return False

    wait_for(order_refused, 15, "the order to be refused for the booked window")
    # Cancelled, the window gives its units back to orders at once.
    kube.custom.delete_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, "window"
    )

    def order_fits() -> bool:
        try:
            order(tenant_admin, namespace, "for-good", gpu_class, 1, dry_run="All")
        except ApiException:
            return False
        return True

    wait_for(order_fits, 15, "the order to fit once the window is cancelled")


def test_a_window_in_the_past_too_long_or_over_budget_is_refused_saying_what_fixes_it(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    corner.node("n1", 8)
    gpu_class = corner.gpu_class("h100")
    kube.quota(namespace, {keys.quota_key(gpu_class): 2})
    yesterday = tomorrow(9) - 2 * datetime.timedelta(days=1)
    past = refused(tenant_admin, namespace, "past", gpu_class, 1, yesterday, yesterday + HOUR)
    assert past.startswith(f"{HOOK}the window starts at {rfc3339(yesterday)}, before now"), past
    long = refused(
        tenant_admin, namespace, "long", gpu_class, 1, tomorrow(9), tomorrow(9) + 3 * 24 * HOUR
    )
    assert long == (
        f"{HOOK}the window lasts 3d; a window lasts at most 2d (reservations.maxLength, which "
        "the hoster sets): book a shorter window"
    )
    over = refused(tenant_admin, namespace, "over", gpu_class, 3, tomorrow(9), tomorrow(18))
    assert over.startswith(
        f"{HOOK}budget gpu.cozystack.io/{gpu_class} of {namespace} (this namespace's own "
        "quota) allows 2: 0 in use and 0 booked at the busiest moment of the window, the "
        "reservation asks 3 more"
    ), over
    # Within the budget, booked; then an order beside it finds the budget's room taken.
    reserve(tenant_admin, namespace, "two", gpu_class, 2, tomorrow(9), tomorrow(18))
    node = corner.name("n1")
    booked(kube, namespace, "two", node)

    def order_refused() -> str | None:
        try:
            order(tenant_admin, namespace, "extra", gpu_class, 1, dry_run="All")
        except ApiException as exc:
            return refusal(exc) if "booked by reservations" in refusal(exc) else None
        return None

    words = wait_for(order_refused, 15, "the order to be refused for the booked budget")
    assert "allows 2: 0 in use and 2 booked by reservations at their busiest moment" in words
