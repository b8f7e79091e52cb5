"""A binder whose replica stops leading sends nothing more, not even what it had queued;
one whose Lease lapses for a moment and is renewed loses no decision.

Found by the fault suite (partition scenario): the loop stops deciding at the renew
deadline, but the writer went on sending the decisions already queued until the elector
got round to stopping the binder, which behind a slow or cut connection came seconds after
another replica had taken the Lease. A write decided on the old leader's view and sent
while the new leader binds can double-book a node: resourceVersions only guard the claim
written, not the units of the node.

Here the binder reaches the real API server through a proxy that makes every write slow,
so decisions queue up in its writer; then leadership ends.

Also found by the fault suite (slow API server): a renewal that came back late left the
Lease lapsed for an instant in the middle of a pass. The pass had already taken its
placements into the snapshot; their writes were dropped unsent, so those orders, decided
in the binder's mind and never changed again by anyone, stayed without a phase for good.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import Corner

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.model import Plan, Step
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds, wait_for
from cozystack_gpu_testkit.proxy import Proxy

pytestmark = pytest.mark.apiserver

WORKERS = 2
ORDERS = 40


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


@pytest.fixture
def slow_api(control_plane: ControlPlane) -> Iterator[Any]:
    port = int(control_plane.server.rsplit(":", 1)[1])
    with Proxy(("127.0.0.1", port)) as proxy:
        api = control_plane.api_client()
        api.configuration.host = f"https://{proxy.address}"
        yield api, proxy


def bound(kube: Kube, tenant: str) -> int:
    return sum(1 for c in kube.claims(tenant) if (c.get("status") or {}).get("phase") == "Bound")


def test_a_binder_that_stops_leading_sends_none_of_its_queued_writes(
    kube: Kube, corner: Corner, slow_api: tuple[Any, Proxy]
) -> None:
    api, proxy = slow_api
    tenant = corner.tenant
    corner.nodes(4, ORDERS // 4)
    gpu_class = corner.gpu_class()

    leading = [True]
    binder = Binder(
        api,
        binder_config(corner.controller_ns, write_workers=WORKERS),
        is_leader=lambda: leading[0],
    )
    binder.start()
    try:
        assert binder.synced.wait(30), "the binder did not finish its first listing"
        with proxy.slowed(0.3):
            for i in range(ORDERS):
                kube.claim(tenant, f"vm-{i:02d}", gpu_class, 1)
            wait_for(lambda: binder.writer.pending() >= 10, 30, "writes queued behind a slow link")
            leading[0] = False
            sent_before = binder.status_writes
            bound_before = bound(kube, tenant)
            time.sleep(4.0)  # many round trips: a writer still draining would send on
        sent_after = binder.status_writes - sent_before
        # Workers that had taken a job just before the end may still send it: no more.
        assert sent_after <= WORKERS, f"{sent_after} claim writes sent after leadership ended"
        assert bound(kube, tenant) - bound_before <= WORKERS
    finally:
        binder.stop()


def test_orders_decided_in_the_moment_the_lease_lapsed_are_written_once_it_is_renewed(
    kube: Kube, corner: Corner, api_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    corner.nodes(2, 8)
    gpu_class = corner.gpu_class()

    leading = [True]
    config = binder_config(corner.controller_ns)
    binder = Binder(api_client, config, is_leader=lambda: leading[0])
    act = binder._act
    lapsed: list[int] = []

    def act_as_the_lease_lapses(result: Plan, now: float) -> None:
        """The first pass that binds runs with the Lease lapsed (the turn began leading);
        it is renewed right after."""
        binds = sum(len(a.claims) for a in result.actions if a.step is Step.BIND)
        if lapsed or not binds:
            act(result, now)
            return
        leading[0] = False
        try:
            act(result, now)
        finally:
            lapsed.append(binds)
            leading[0] = True

    monkeypatch.setattr(binder, "_act", act_as_the_lease_lapses)
    binder.start()
    try:
        assert binder.synced.wait(30), "the binder did not finish its first listing"
        for i in range(6):
            kube.claim(corner.tenant, f"vm-{i}", gpu_class, 1)
        wait_for(lambda: lapsed, 30, "a pass that binds while the Lease lapsed")
        wait_for(lambda: bound(kube, corner.tenant) == 6, 30, "every order Bound after renewal")
    finally:
        binder.stop()
