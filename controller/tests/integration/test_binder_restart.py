"""The binder through a kube-apiserver restart in the middle of a burst (same etcd).

Writes in flight when the server goes away end in a connection error, not an API answer;
each must still come back to the loop as a result (failed, then judged again), or its claim
stays "in flight" and blocks every later plan that would touch it. Every order must end
Bound once the server is back.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from binder_env import Corner
from kubernetes.client.rest import ApiException

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit import faults
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds, wait_for

pytestmark = pytest.mark.apiserver

ORDERS = 1500
NODES = 30
GPUS = 50  # ORDERS units in all: every order fits
CREATORS = 8
DOWN_S = 5.0
SETTLE_S = 180.0  # the issue saw 1,397 orders still unbound 180 s after such a restart


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


def create_until_done(kube: Kube, tenant: str, name: str, gpu_class: str) -> None:
    """Orders one unit, retrying while the API server is away (a create that landed
    without an answer reads as AlreadyExists on the retry)."""
    while True:
        try:
            kube.claim(tenant, name, gpu_class, 1)
            return
        except ApiException as exc:
            if exc.status == 409:
                return
        except Exception:  # connection refused or reset while the server restarts
            pass
        time.sleep(0.2)


def bound_count(kube: Kube, tenant: str, capacity: int) -> int:
    held: dict[str, int] = {}
    for claim in kube.claims(tenant):
        status = claim.get("status") or {}
        if status.get("phase") == "Bound":
            held[status["nodeName"]] = held.get(status["nodeName"], 0) + claim["spec"]["count"]
    over = {node: units for node, units in held.items() if units > capacity}
    assert not over, f"nodes over capacity: {over}"
    return sum(held.values())


def test_every_order_is_bound_after_the_api_server_restarts_mid_burst(
    control_plane: ControlPlane, kube: Kube, corner: Corner
) -> None:
    tenant = corner.tenant
    corner.nodes(NODES, GPUS)
    gpu_class = corner.gpu_class()

    binder = Binder(control_plane.api_client(), binder_config(corner.controller_ns))
    binder.start()
    creators: list[threading.Thread] = []
    try:
        assert binder.synced.wait(30), "the binder did not finish its first listing"
        for c in range(CREATORS):
            # Each creator has its own connection pool, as tenants would.
            client_kube = Kube(control_plane.api_client(pool_size=2))
            names = [f"vm-{i:04d}" for i in range(c, ORDERS, CREATORS)]

            def create(names: list[str] = names, k: Kube = client_kube) -> None:
                for name in names:
                    create_until_done(k, tenant, name, gpu_class)

            creators.append(threading.Thread(target=create, name=f"creator-{c}", daemon=True))
        for thread in creators:
            thread.start()
        wait_for(lambda: binder.stats.binds >= ORDERS // 3, 120, f"{ORDERS // 3} binds")
        outage = faults.restart(control_plane, faults.APISERVER, down_s=DOWN_S)
        back = time.monotonic()
        for thread in creators:
            thread.join(120)
            assert not thread.is_alive(), "creating the orders took more than 2 minutes"

        last = 0
        deadline = back + SETTLE_S
        while time.monotonic() < deadline:
            last = bound_count(kube, tenant, GPUS)
            if last == ORDERS:
                break
            time.sleep(1.0)
        settled = time.monotonic() - back
        print(
            f"\n[restart] down {outage.down_s:.1f} s, ready in {outage.ready_s:.1f} s; "
            f"{last} of {ORDERS} orders Bound {settled:.1f} s after the server was back "
            f"({binder.stats.conflicts} writes refused or failed, judged again)"
        )
        assert last == ORDERS, f"{ORDERS - last} orders unbound {SETTLE_S:.0f} s after the restart"
        assert binder.failure is None
        assert not binder.dead_threads()
    finally:
        binder.stop()
