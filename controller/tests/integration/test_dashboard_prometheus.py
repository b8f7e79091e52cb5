"""The chart's Grafana dashboard and alerting rules against a real Prometheus.

Prometheus (built from source by tools/build-binaries.sh) scrapes a controller replica
(``python -m cozystack_gpu``) and a node agent (``python -m cozystack_gpu.agent`` on a sysfs
fixture of eight H100s, with a fake kubelet) every second, labelled as Prometheus
Operator's ServiceMonitor and PodMonitor would label them (``pod`` on the replica, ``node``
on the agent). Through a scenario (a claim Lost with its failed node; on the agent's node
two units Attached and one Bound; an order too big to fit and one over budget) every query
of the dashboard runs through ``/api/v1/query`` and must return what the scenario implies;
the chart's rules, rendered by Helm with short thresholds, must turn the Lost claim and the
waiting order into firing alerts (``/api/v1/alerts``), and nothing else of this class.

docs/operations.md ("Dashboard and alerts") shows each query with the result seen here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_env import CHART, helm_template
from binder_env import Corner

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import cluster, sysfs_tree
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, unless, wait_for
from cozystack_gpu_testkit.ports import free_port
from cozystack_gpu_testkit.prometheus import PrometheusProcess, Target

pytestmark = pytest.mark.apiserver

DASHBOARD = CHART / "files" / "dashboards" / "cozystack-gpu.json"
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
# Grafana replaces $__rate_interval by at least four scrape intervals (2m behind the
# ServiceMonitor's 30s); with a 1 s scrape, 5m spans the whole scenario.
RATE_INTERVAL = "5m"
REPLICA = "dash-0"


def dashboard_queries() -> dict[str, list[str]]:
    """Each panel's title and its queries, $__rate_interval replaced."""
    board = json.loads(DASHBOARD.read_text())
    return {
        panel["title"]: [
            t["expr"].replace("$__rate_interval", RATE_INTERVAL) for t in panel["targets"]
        ]
        for panel in board["panels"]
    }


def vector(prom: PrometheusProcess, expr: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in prom.query(expr)}


class Agent:
    """The node agent as its own process, on a fixture tree, beside a fake kubelet."""

    def __init__(self, plane: ControlPlane, node: str, work: Path, port: int) -> None:
        self.root = sysfs_tree.h100_x8(work / "root").root
        self.devices = plugin_devices(sysfs.read_inventory(str(self.root)))
        self.kubelet = FakeKubelet(str(work / "kubelet.sock"))
        self.kubelet.set(allocatable=self.devices)
        self.kubelet.start()
        self.port = port
        self.log = work / "agent.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "cozystack_gpu.agent",
                    "--node",
                    node,
                    "--sysfs-root",
                    str(self.root),
                    "--pod-resources-socket",
                    str(work / "kubelet.sock"),
                    "--kubeconfig",
                    str(plane.kubeconfig),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--poll",
                    "1",
                    "--period",
                    "10",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)
        self.kubelet.stop()


@pytest.fixture
def world(control_plane: ControlPlane, api_client: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    install_extra_crds(api_client)
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    controller_ns = f"dash-{test_id}"
    kube.namespace(controller_ns)
    replica = ControllerProcess(control_plane, controller_ns, REPLICA, tmp_path, metrics=True)
    made: dict[str, Any] = {"kube": kube, "id": test_id, "replica": replica}
    try:
        yield made
    finally:
        for part in ("prometheus", "agent"):
            if part in made:
                made[part].stop()
        replica.stop()
        # The cluster is shared: what this test made must not meet the tests after it.
        Corner(kube, test_id, f"tenant-{test_id}", controller_ns).clean_up()
        unless(404, lambda: kube.core.delete_namespace(f"poor-{test_id}"))


def alert_rules(work: Path) -> Path:
    """The chart's PrometheusRule as Helm renders it, thresholds short enough for a test."""
    values = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "alerts": {"lostClaims": {"for": "0s"}, "ordersWaiting": {"afterSeconds": 5}},
            }
        }
    }
    (rule,) = helm_template("alerts.yaml", "cozy-gpu", values)
    path = work / "alerts.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


def test_every_dashboard_query_and_the_alerts_against_a_real_prometheus(
    world: dict[str, Any], control_plane: ControlPlane, tmp_path: Path
) -> None:
    kube: Kube = world["kube"]
    replica: ControllerProcess = world["replica"]
    test_id: str = world["id"]
    selector = {"test.cozystack.io/id": test_id}
    tenant, poor = f"tenant-{test_id}", f"poor-{test_id}"
    kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
    kube.namespace(poor, {f"tenant.cozystack.io/{poor}": ""})
    gpu_class = f"h100-{test_id}"
    kube.gpu_class(gpu_class, H100, selector=selector)
    kube.quota(poor, {f"gpu.cozystack.io/{gpu_class}": 0})
    agent_node, failing = f"agent-{test_id}", f"failing-{test_id}"
    kube.gpu_node(failing, H100, 1, labels=selector)

    # Scraped from the start, so the counters' rates cover every step below (the agent's
    # target is down until it runs).
    agent_port = free_port()
    prom = PrometheusProcess(
        cluster.binary_dir() / "prometheus",
        tmp_path / "prometheus",
        [
            Target(
                "cozystack-gpu-controller",
                f"127.0.0.1:{replica.metrics_port}",
                {"pod": REPLICA, "namespace": "cozy-gpu"},
            ),
            Target("cozystack-gpu-agent", f"127.0.0.1:{agent_port}", {"node": agent_node}),
        ],
        rule_files=[alert_rules(tmp_path)],
    )
    world["prometheus"] = prom
    # Its first scrape comes a few seconds after it starts (discovery's reload): before
    # that, the scenario's first decisions would be in the counters' first samples.
    wait_for(lambda: prom.query('up{job="cozystack-gpu-controller"} == 1'), 30, "a first scrape")

    def phase(name: str, namespace: str = tenant) -> str | None:
        return (kube.get_claim(namespace, name).get("status") or {}).get("phase")

    # One claim Attached on the one-GPU node, which then fails: Lost.
    kube.claim(tenant, "lost", gpu_class, 1)
    wait_for(lambda: phase("lost") == "Bound", 30, "the first bind")
    kube.attach(tenant, "lost", "vm-lost")
    kube.vmi(tenant, "vm-lost", claims=["lost"], phase="Running", node=failing)
    wait_for(lambda: phase("lost") == "Attached", 30, "the attachment")
    kube.node_status(failing, ready=False)
    wait_for(lambda: phase("lost") == "Lost", 30, "the claim to go Lost")

    # The agent's node: eight H100s on vfio-pci, reported by the real agent.
    kube.node(agent_node, labels=selector, allocatable={H100: 8})
    agent = Agent(control_plane, agent_node, tmp_path / "agent", agent_port)
    world["agent"] = agent

    def reported() -> Any:
        gpunode = unless(
            404,
            lambda: kube.custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, agent_node
            ),
        )
        return gpunode and (gpunode.get("status") or {}).get("devices")

    wait_for(reported, 30, "the agent's GPUNode")
    # Two units Attached and one Bound there; an order of all eight waits (five are free),
    # and one over its tenant's budget.
    kube.claim(tenant, "attached", gpu_class, 2)
    kube.claim(tenant, "bound", gpu_class, 1)
    wait_for(lambda: phase("attached") == phase("bound") == "Bound", 30, "two binds")
    kube.attach(tenant, "attached", "vm")
    kube.vmi(tenant, "vm", claims=["attached"], phase="Running", node=agent_node)
    wait_for(lambda: phase("attached") == "Attached", 30, "the second attachment")
    kube.claim(tenant, "too-big", gpu_class, 8)
    kube.claim(poor, "over-budget", gpu_class, 1)
    wait_for(lambda: phase("too-big") == "Pending", 30, "the large order to wait")
    wait_for(lambda: phase("over-budget", poor) == "Pending", 30, "the poor order to wait")

    ours = (("class", gpu_class),)
    expected: dict[str, dict[tuple[tuple[str, str], ...], float]] = {
        "Capacity per class": {ours: 8},
        "Free per class": {ours: 5},
        "Bound, attached and lost per class": {
            (("class", gpu_class), ("phase", "Attached")): 2,
            (("class", gpu_class), ("phase", "Bound")): 1,
            (("class", gpu_class), ("phase", "Lost")): 1,
        },
        "Per-node occupancy (units held / capacity)": {(("node", agent_node),): 3 / 8},
        "Per-node allocatable devices (node agent)": {
            (("node", agent_node), ("resource_name", H100)): 8
        },
        "Binder leader": {(("pod", REPLICA),): 1},
    }
    queries = dashboard_queries()
    assert set(expected) | {
        "Pending claims", "Bind latency", "Refusals by reason", "Binder decisions by step",
    } == set(queries)  # fmt: skip

    def ours_only(labels: dict[str, str]) -> bool:
        """Series of this test's class and nodes, or of none (the cluster is shared)."""
        return labels.get("class", gpu_class) == gpu_class and labels.get("node", agent_node) in (
            agent_node,
            failing,
        )

    def settled() -> bool:
        for title, want in expected.items():
            got = vector(prom, queries[title][0])
            if any(got.get(k) != v for k, v in want.items()):
                return False
        return True

    try:
        wait_for(settled, 60, "the dashboard's figures to match the scenario", interval=1)
    finally:
        seen = {title: [vector(prom, q) for q in qs] for title, qs in queries.items()}
        print(f"\ndashboard queries (rate interval {RATE_INTERVAL}):")
        for title, results in seen.items():
            for expr, result in zip(queries[title], results, strict=True):
                mine = {k: v for k, v in result.items() if ours_only(dict(k))}
                print(f"- {title}: {expr}\n    {mine}")
    # The series of other nodes and classes are others' (the cluster is shared); ours:
    for title, want in expected.items():
        got = vector(prom, queries[title][0])
        assert {k: got.get(k) for k in want} == want, title

    # Pending claims: every claim the binder leaves waiting in the cluster (shared with
    # other tests); this test's are the two orders and the Lost claim, whose rebind waits
    # for its VM (VMIStillRunning).
    (pending,) = vector(prom, queries["Pending claims"][0]).values()
    assert pending >= 3
    # Bind latency: this test's binds took a moment, well inside the last bucket.
    p50, p95, p99 = (next(iter(vector(prom, q).values())) for q in queries["Bind latency"])
    assert 0 < p50 <= p95 <= p99 <= 60, (p50, p95, p99)
    refusals = vector(prom, queries["Refusals by reason"][0])
    for reason in ("InsufficientCapacity", "BudgetExceeded", "VMIStillRunning"):
        assert refusals.get((("reason", reason),), 0) > 0, (reason, refusals)
    decisions = vector(prom, queries["Binder decisions by step"][0])
    for step in ("Bind", "Attach", "Lose"):
        assert decisions.get((("step", step),), 0) > 0, (step, decisions)

    # The alerts: the Lost claim and the order waiting longer than 5 s fire for this class;
    # a leader exists, so that alert is quiet.
    def firing() -> set[str]:
        return {
            a["labels"]["alertname"]
            for a in prom.alerts()
            if a["state"] == "firing" and a["labels"].get("class") in (gpu_class, None)
        }

    wanted = {"CozystackGPUClaimsLost", "CozystackGPUOrdersWaiting"}
    try:
        got_alerts = wait_for(lambda: wanted <= firing() and firing(), 30, "the alerts to fire")
    finally:
        print(f"alerts: {prom.alerts()}")
    assert "CozystackGPUNoBinderLeader" not in got_alerts
