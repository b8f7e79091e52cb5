"""Races and failures with real controller processes: two replicas, one Lease.

Each replica is `python -m cozystack_gpu` (kopf, the Lease, the binder) against the real
API server, with a short Lease so take-overs happen within seconds.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from binder_env import Corner
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.fault_suite import LEASE_ARGS
from cozystack_gpu_testkit.invariants import Invariants, Scope
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for

pytestmark = pytest.mark.apiserver

UNITS = 10
CREATORS = 50


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


@contextmanager
def replicas(
    plane: ControlPlane, namespace: str, names: list[str], log_dir: Path
) -> Iterator[dict[str, ControllerProcess]]:
    # A short Lease, so take-overs happen within seconds.
    running = {
        name: ControllerProcess(plane, namespace, name, log_dir, *LEASE_ARGS) for name in names
    }
    try:
        yield running
    finally:
        for replica in running.values():
            replica.stop()


def holder(kube: Kube, namespace: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(
            keys.LEASE_NAME_BINDER, namespace
        )
    except ApiException:
        return None
    return lease.spec.holder_identity or None


def setup_cluster(corner: Corner, nodes: int, gpus: int) -> str:
    """``nodes`` nodes of ``gpus`` units and a class that orders at most ``gpus``."""
    corner.nodes(nodes, gpus)
    return corner.gpu_class(maxCount=gpus)


def order_concurrently(kube: Kube, tenant: str, gpu_class: str, count: int) -> None:
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def create(i: int) -> None:
        barrier.wait()
        try:
            kube.claim(tenant, f"vm-{i:02d}", gpu_class, 1)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def checker(kube: Kube, tenant: str, test_id: str) -> Invariants:
    """The fault suite's invariants, on this test's tenant and nodes."""
    scope = Scope(frozenset({tenant}), {"test.cozystack.io/id": test_id})
    return Invariants(kube.api, scope)


def assert_invariants(invariants: Invariants, kube: Kube, tenant: str) -> list[dict[str, Any]]:
    """Every rule that holds at every moment (capacity, budgets, no claim bound twice...),
    then the tenant's claims."""
    found = invariants.check()
    assert not found, "\n".join(str(v) for v in found)
    return kube.claims(tenant)


def bound(claims: list[dict[str, Any]]) -> int:
    return sum(1 for c in claims if (c.get("status") or {}).get("phase") == "Bound")


def test_racing_orders_for_the_last_units_bind_exactly_that_many(
    control_plane: ControlPlane, kube: Kube, corner: Corner, tmp_path: Path
) -> None:
    test_id, controller_ns, tenant = corner.id, corner.controller_ns, corner.tenant
    gpu_class = setup_cluster(corner, nodes=5, gpus=2)
    invariants = checker(kube, tenant, test_id)
    with replicas(control_plane, controller_ns, ["r1", "r2"], tmp_path):
        wait_for(lambda: holder(kube, controller_ns), timeout=30, what="a leader")
        order_concurrently(kube, tenant, gpu_class, CREATORS)

        def settled() -> list[dict[str, Any]] | None:
            claims = assert_invariants(invariants, kube, tenant)
            waiting = [c for c in claims if (c.get("status") or {}).get("conditions")]
            return claims if bound(claims) == UNITS and len(waiting) == CREATORS else None

        claims = wait_for(settled, timeout=60, what=f"{UNITS} bound and every claim told")
    assert bound(claims) == UNITS
    pending = [c for c in claims if (c.get("status") or {}).get("phase") == "Pending"]
    assert len(pending) == CREATORS - UNITS, "every order that did not bind waits as Pending"


def test_killing_the_leader_mid_burst_hands_over_and_keeps_the_invariant(
    control_plane: ControlPlane, kube: Kube, corner: Corner, tmp_path: Path
) -> None:
    test_id, controller_ns, tenant = corner.id, corner.controller_ns, corner.tenant
    gpu_class = setup_cluster(corner, nodes=5, gpus=2)
    invariants = checker(kube, tenant, test_id)
    with replicas(control_plane, controller_ns, ["r1", "r2"], tmp_path) as running:
        leader = wait_for(lambda: holder(kube, controller_ns), timeout=30, what="a leader")
        creators = threading.Thread(
            target=order_concurrently, args=(kube, tenant, gpu_class, CREATORS)
        )
        creators.start()
        wait_for(lambda: bound(kube.claims(tenant)) >= 3, timeout=30, what="some binds")
        running[leader].kill()
        creators.join()
        other = "r2" if leader == "r1" else "r1"
        wait_for(lambda: holder(kube, controller_ns) == other, timeout=30, what="the take-over")

        def settled() -> list[dict[str, Any]] | None:
            claims = assert_invariants(invariants, kube, tenant)
            return claims if bound(claims) == UNITS else None

        wait_for(settled, timeout=60, what=f"{UNITS} bound after the take-over")
    assert "leads: binder binds" in (tmp_path / f"{other}.log").read_text()


def test_a_restart_between_decisions_converges_with_nothing_lost(
    control_plane: ControlPlane, kube: Kube, corner: Corner, tmp_path: Path
) -> None:
    test_id, controller_ns, tenant = corner.id, corner.controller_ns, corner.tenant
    gpu_class = setup_cluster(corner, nodes=10, gpus=4)
    invariants = checker(kube, tenant, test_id)
    with replicas(control_plane, controller_ns, ["solo"], tmp_path) as running:
        wait_for(lambda: holder(kube, controller_ns), timeout=30, what="a leader")
        for i in range(30):
            kube.claim(tenant, f"vm-{i:02d}", gpu_class, 1)
        wait_for(lambda: bound(kube.claims(tenant)) >= 1, timeout=30, what="a first bind")
        running["solo"].kill()
    before = {
        c["metadata"]["name"]: c["status"]["nodeName"]
        for c in kube.claims(tenant)
        if (c.get("status") or {}).get("phase") == "Bound"
    }
    again = tmp_path / "again"
    again.mkdir()
    with replicas(control_plane, controller_ns, ["solo"], again):

        def settled() -> list[dict[str, Any]] | None:
            claims = assert_invariants(invariants, kube, tenant)
            return claims if bound(claims) == 30 else None

        claims = wait_for(settled, timeout=60, what="every claim bound after the restart")
    after = {c["metadata"]["name"]: c["status"]["nodeName"] for c in claims}
    assert before, "the kill came after at least one bind"
    moved = {name for name, node in before.items() if after[name] != node}
    assert not moved, f"claims bound before the restart moved: {moved}"
    nodes = {c["status"]["nodeName"] for c in claims}
    # Best fit packs: 30 single units on 4-GPU nodes fill 8 nodes, the 8th with 2.
    assert len(nodes) == 8, nodes
