"""The controller's /metrics, scraped from a running controller process, against the
cluster the test built: per-class capacity, claimed units by phase and free units, bind
latency, refusals by reason and per-node occupancy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admission_env import MetricsReader
from prometheus_client.parser import text_string_to_metric_families

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for

pytestmark = pytest.mark.apiserver

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(replica: ControllerProcess, token: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(replica.metrics(token)):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.fixture
def controller(
    control_plane: ControlPlane, api_client: Any, tmp_path: Path
) -> Iterator[tuple[ControllerProcess, str]]:
    install_extra_crds(api_client)
    test_id = uuid.uuid4().hex[:8]
    namespace = f"ctl-{test_id}"
    kube = Kube(api_client)
    kube.namespace(namespace)
    # Scraped as the hoster's Prometheus: a token bound to the chart's reader role.
    reader = MetricsReader(kube, namespace, test_id)
    replica = ControllerProcess(control_plane, namespace, "metrics-0", tmp_path, metrics=True)
    try:
        yield replica, reader.token
    finally:
        replica.stop()
        reader.delete()


def test_metrics_tell_the_cluster_the_binder_sees(
    controller: tuple[ControllerProcess, str], api_client: Any
) -> None:
    replica, token = controller
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    selector = {"test.cozystack.io/id": test_id}
    resource = f"nvidia.com/GPU_{test_id}"
    tenant, poor = f"tenant-{test_id}", f"poor-{test_id}"
    kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
    kube.namespace(poor, {f"tenant.cozystack.io/{poor}": ""})
    gpu_class = f"h100-{test_id}"
    kube.gpu_class(gpu_class, resource, selector=selector)
    kube.quota(poor, {f"gpu.cozystack.io/{gpu_class}": 0})
    serving, failing = f"n1-{test_id}", f"n2-{test_id}"
    kube.gpu_node(serving, resource, 4, labels=selector)
    kube.gpu_node(failing, resource, 1, labels=selector)

    def phase(name: str, namespace: str = tenant) -> str | None:
        return (kube.get_claim(namespace, name).get("status") or {}).get("phase")

    # One Attached claim on the node that will fail, which makes it Lost.
    kube.claim(tenant, "lost", gpu_class, 1)
    wait_for(lambda: phase("lost") == "Bound", 30, "the first bind")
    node_of_lost = kube.get_claim(tenant, "lost")["status"]["nodeName"]
    kube.attach(tenant, "lost", "vm-lost")
    kube.vmi(tenant, "vm-lost", claims=["lost"], phase="Running", node=node_of_lost)
    wait_for(lambda: phase("lost") == "Attached", 30, "the attachment")
    kube.node_status(node_of_lost, ready=False)
    wait_for(lambda: phase("lost") == "Lost", 30, "the claim to go Lost")
    ready = serving if node_of_lost == failing else failing
    # One Attached and one Bound claim on the Ready node, two refused orders.
    kube.claim(tenant, "attached", gpu_class, 1)
    kube.claim(tenant, "bound", gpu_class, 1)
    wait_for(lambda: phase("attached") == phase("bound") == "Bound", 30, "two binds")
    kube.attach(tenant, "attached", "vm")
    kube.vmi(tenant, "vm", claims=["attached"], phase="Running", node=ready)
    wait_for(lambda: phase("attached") == "Attached", 30, "the second attachment")
    # 3 units: within maxCount (the largest node's 4) but over the 2 left on the Ready node.
    # The refusal counts come from this test's own orders, not from what earlier tests left.
    kube.claim(tenant, "too-big", gpu_class, 3)
    kube.claim(poor, "over-budget", gpu_class, 1)
    wait_for(lambda: phase("too-big") == "Pending", 30, "the large order to wait")
    wait_for(lambda: phase("over-budget", poor) == "Pending", 30, "the poor order to wait")
    for namespace, name, reason in (
        (tenant, "too-big", "InsufficientCapacity"),
        (poor, "over-budget", "BudgetExceeded"),
    ):
        told = kube.get_claim(namespace, name)["status"]["conditions"]
        assert [c["reason"] for c in told if c["type"] == keys.CONDITION_BOUND] == [reason]

    ready_units = 4 if ready == serving else 1

    def published() -> Samples | None:
        samples = scrape(replica, token)
        wanted = {
            ("cozystack_gpu_class_capacity_units", (("class", gpu_class),)): ready_units,
            ("cozystack_gpu_class_free_units", (("class", gpu_class),)): ready_units - 2,
        }
        for phase_name, units in (("Bound", 1), ("Attached", 1), ("Lost", 1)):
            key = (
                "cozystack_gpu_class_claimed_units",
                (("class", gpu_class), ("phase", phase_name)),
            )
            wanted[key] = units
        return samples if all(samples.get(k) == v for k, v in wanted.items()) else None

    samples = wait_for(published, 30, "the class metrics to match the cluster")
    assert (value(samples, "cozystack_gpu_bind_latency_seconds_count") or 0) >= 3
    for reason in ("InsufficientCapacity", "BudgetExceeded"):
        assert (value(samples, "cozystack_gpu_refusals_total", reason=reason) or 0) >= 1, reason
    node_units = {
        state: value(
            samples, "cozystack_gpu_node_units", node=ready, resource=resource, state=state
        )
        for state in ("capacity", "claimed", "raw")
    }
    assert node_units == {"capacity": ready_units, "claimed": 2, "raw": 0}
    assert value(samples, "cozystack_gpu_binder_leader") == 1
