"""The chart's Grafana dashboard and every one of its alerting rules against a real Prometheus.

Prometheus (built from source by tools/build-binaries.sh) scrapes a controller replica
(``python -m cozystack_gpu``) and a node agent (``python -m cozystack_gpu.agent`` on a sysfs
fixture of eight H100s, with a fake kubelet) every second, labelled as Prometheus
Operator's ServiceMonitor and PodMonitor would label them (``pod`` on the replica, ``node``
on the agent). The replica runs as its ServiceAccount under the chart's own RBAC
(``templates/rbac-controller.yaml``, with a token as its pod would have) and serves its
webhooks and /metrics over HTTPS; Prometheus scrapes /metrics as the chart's ServiceMonitor
does, with the token of a ServiceAccount bound to ``cozystack-gpu-metrics-reader``, which the
replica has the API server review. Through a scenario (a claim Lost with its failed node;
on the agent's node two units Attached and one Bound; an order too big to fit and one over
budget) every query of the dashboard runs through ``/api/v1/query`` and must return what
the scenario implies; the chart's rules, rendered by Helm with short thresholds, must turn
the Lost claim and the waiting order into firing alerts (``/api/v1/alerts``) while the
other five are quiet (the stale one for the agent's node: the failed node's report ages
unrefreshed).

Then each of the other five is made to fire by what would cause it in a cluster, never by a
metric written by hand:

- ``CozystackGPUNodeInventoryStale``: the node agent stops; its GPUNode is not refreshed
  within the replica's ``--inventory-stale-after``;
- ``CozystackGPUAdmissionRefusalsHigh``: the chart's webhook configurations point the real
  kube-apiserver at the replica, and the poor tenant keeps ordering over its budget;
- ``CozystackGPUSettingsWriteFailing`` and ``CozystackGPUAdmissionErrors``: the replica's
  Role loses its ConfigMap rule; a new GPU node's resource name cannot be written into
  gpu-settings, and a hoster's new GPUClass cannot be judged (the class webhook reads and
  records its admissions in a ConfigMap), so the API server refuses it with a 500;
- ``CozystackGPUNoBinderLeader``: the only replica is killed.

docs/operations.md ("Dashboard and alerts") shows each query with the result seen here, and
what made each alert fire, and the dashboard's picture (docs/images/dashboard.svg), drawn
here from the queries' results and compared byte for byte with the committed one:
``COZYSTACK_GPU_UPDATE_PICTURES=1`` writes it instead.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from admission_env import (
    MetricsReader,
    configurations,
    helm_template,
    install,
    refusal,
    remove,
)
from admission_env import wait_forgotten as wait_webhooks_forgotten
from binder_env import Corner
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import cluster, dashboard_picture, sysfs_scenarios, tenants
from cozystack_gpu_testkit.chart import CHART
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, unless, wait_for
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port
from cozystack_gpu_testkit.prometheus import PrometheusProcess, Target

pytestmark = pytest.mark.apiserver

DASHBOARD = CHART / "files" / "dashboards" / "cozystack-gpu.json"
H100 = "nvidia.com/GH100_H100_SXM5_80GB"
# Grafana replaces $__rate_interval by at least four scrape intervals (2m behind the
# ServiceMonitor's 30s); with a 1 s scrape, 5m spans the whole scenario.
RATE_INTERVAL = "5m"
REPLICA = "dash-0"
# The agent writes its GPUNode every AGENT_PERIOD_S; the replica calls a report older than
# STALE_AFTER_S stale (--inventory-stale-after), so a running agent never is.
AGENT_PERIOD_S = 2
STALE_AFTER_S = 10
ACCOUNT = "cozystack-gpu-controller"  # the chart's ServiceAccount of the controller
PICTURE = Path(__file__).resolve().parents[3] / "docs" / "images" / "dashboard.svg"
UPDATE_PICTURES = "COZYSTACK_GPU_UPDATE_PICTURES"


def zero_or_not(value: float) -> str:
    return "0" if value == 0 else "> 0"


# What differs from run to run is drawn as what the scenario fixes about it (what the test
# asserts), each such panel's note saying so: per panel title, the note and the value drawn.
# - Pending claims count every claim waiting in the cluster, which is shared with the tests
#   before this one: the scenario's two orders are among them.
# - The bind latency quantiles are of this run's three binds, timed on a busy machine.
# - A rate over the window depends on when the scrapes fell, but whether it is 0 does not:
#   every labelled counter starts at 0, and the scenario makes the same events each run.
# - Reservation decisions are of every window in the cluster, and this scenario has none.
STAND_INS: dict[str, tuple[str, Callable[[float], str]]] = {
    "Pending claims": (
        "all claims waiting in the test cluster: at least the scenario's two orders",
        lambda _value: "≥ 2",
    ),
    "Bind latency": (
        "this run's three binds, which vary: 0 < p50 ≤ p95 ≤ p99 ≤ 60 s",
        lambda _value: "> 0 s",
    ),
    "Refusals by reason": ("rates vary with the scrapes' timing: shown as 0 or > 0", zero_or_not),
    "Binder decisions by step": (
        "rates vary with the scrapes' timing: shown as 0 or > 0",
        zero_or_not,
    ),
    # The counter has no class label and the scenario books no window: its rates are of the
    # windows other tests left in the shared cluster, which the replica decides on as leader.
    "Reservation decisions by outcome": (
        "the scenario books no window; others' windows in the test cluster may count",
        lambda _value: "≥ 0",
    ),
}


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


def stand_in(title: str, value: float) -> float | str:
    """A value as the picture draws it: as it came where the scenario fixes it, else what
    the scenario fixes about it (STAND_INS)."""
    return STAND_INS[title][1](value) if title in STAND_INS else value


def draw_dashboard(
    results: Mapping[str, list[dict[tuple[tuple[str, str], ...], float]]],
    ours: Callable[[dict[str, str]], bool],
    test_id: str,
) -> str:
    """The dashboard's picture from each query's result: this test's series only (the
    cluster is shared), named without the test's id (``h100-<id>`` is ``h100``), values
    that vary from run to run replaced by what the scenario fixes about them."""

    def named(labels: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        return tuple((k, v.replace(f"-{test_id}", "")) for k, v in labels)

    drawn = {
        title: [
            {named(k): stand_in(title, v) for k, v in result.items() if ours(dict(k))}
            for result in per_target
        ]
        for title, per_target in results.items()
    }
    caption = (
        f"Each query against a real Prometheus in the scenario of "
        f"controller/tests/integration/{Path(__file__).name} (rate interval {RATE_INTERVAL})"
    )
    board = json.loads(DASHBOARD.read_text())
    notes = {title: note for title, (note, _shown) in STAND_INS.items()}
    return dashboard_picture.render(board, drawn, notes, caption)


def compare_picture(svg: str, work: Path) -> None:
    """The committed picture is the one just drawn, or is written when asked to."""
    if os.environ.get(UPDATE_PICTURES) == "1":
        PICTURE.parent.mkdir(parents=True, exist_ok=True)
        PICTURE.write_text(svg, encoding="utf-8")
        return
    committed = PICTURE.read_text(encoding="utf-8") if PICTURE.exists() else ""
    if committed != svg:
        fresh = work / PICTURE.name
        fresh.write_text(svg, encoding="utf-8")
        diff = difflib.unified_diff(
            committed.splitlines(), svg.splitlines(), "committed", "drawn", lineterm=""
        )
        pytest.fail(
            f"docs/images/{PICTURE.name} is not the dashboard as drawn from this run's "
            f"queries (drawn: {fresh}). If the dashboard or the scenario changed on purpose, "
            f"draw it again with {UPDATE_PICTURES}=1 pytest "
            f"tests/integration/{Path(__file__).name}, look at it, and commit it:\n"
            + "\n".join(list(diff)[:60])
        )


class Agent:
    """The node agent as its own process, on a fixture tree, beside a fake kubelet."""

    def __init__(self, plane: ControlPlane, node: str, work: Path, port: int) -> None:
        self.root = sysfs_scenarios.h100_x8(work / "root").root
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
                    f"127.0.0.1:{free_port()}",
                    # /metrics: HTTPS, its own self-signed pair, reviewed tokens.
                    "--metrics-listen",
                    f"127.0.0.1:{self.port}",
                    "--poll",
                    "1",
                    "--period",
                    str(AGENT_PERIOD_S),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=15)
        self.kubelet.stop()


@dataclass
class Webhooks:
    """The replica's webhook server as the chart's configurations name it (what
    ``admission_env.configurations`` reads: ``namespace``, ``port``, ``ca_pem``), with its
    certificate files in a cert-manager Secret's layout."""

    namespace: str
    cert_dir: Path
    port: int = field(default_factory=free_port)
    ca: CertificateAuthority = field(default_factory=CertificateAuthority)
    installed: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        pair = self.ca.issue("cozystack-gpu-webhook", ip_addresses=("127.0.0.1",), server=True)
        pair.write(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        (self.cert_dir / "ca.crt").write_bytes(self.ca.cert_pem)

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem

    @property
    def args(self) -> tuple[str, ...]:
        return ("--webhook-port", str(self.port), "--webhook-cert-dir", str(self.cert_dir))

    def install(self, kube: Kube, suffix: str) -> None:
        """The chart's GPUClaim and GPUClass webhooks, pointed at the replica."""
        only = ("gpuclaim.gpu.cozystack.io", "gpuclass.gpu.cozystack.io")
        self.installed = configurations(self, suffix, only)
        install(kube.api, self.installed)

    def remove(self, kube: Kube, probe_namespace: str) -> None:
        """Until the API server calls them no more: they fail closed, and the cluster is
        shared with the tests after this one."""
        if self.installed:
            remove(kube.api, self.installed)
            wait_webhooks_forgotten(kube, probe_namespace)
            self.installed = []


class ChartRBAC:
    """The controller's ServiceAccount, ClusterRole, Role and bindings as the chart renders
    them in ``namespace`` (cluster-scoped names suffixed: the cluster is shared), and a
    kubeconfig with a token of that account, as its pod's projected token would give it."""

    def __init__(self, kube: Kube, namespace: str, suffix: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.rbac = client.RbacAuthorizationV1Api(kube.api)
        objects = helm_template("rbac-controller.yaml", namespace)
        objects += [
            obj
            for obj in helm_template("serviceaccounts.yaml", namespace)
            if obj["metadata"]["name"] == ACCOUNT
        ]
        self.cluster_scoped: list[tuple[str, str]] = []
        for obj in objects:
            kind = obj["kind"]
            if kind in ("ClusterRole", "ClusterRoleBinding"):
                obj["metadata"]["name"] += f"-{suffix}"
                if kind == "ClusterRoleBinding":
                    obj["roleRef"]["name"] += f"-{suffix}"
                self.cluster_scoped.append((kind, obj["metadata"]["name"]))
            if kind == "Role":
                self.role = obj
            create = {
                "ServiceAccount": lambda o: kube.core.create_namespaced_service_account(
                    namespace, o
                ),
                "ClusterRole": self.rbac.create_cluster_role,
                "ClusterRoleBinding": self.rbac.create_cluster_role_binding,
                "Role": lambda o: self.rbac.create_namespaced_role(namespace, o),
                "RoleBinding": lambda o: self.rbac.create_namespaced_role_binding(namespace, o),
            }[kind]
            create(obj)
        # The API server's authorizer sees new bindings a moment later: the replica would
        # start by failing to take its Lease.
        wait_for(lambda: self.allowed("update", "leases", "coordination.k8s.io"), 15, "RBAC")

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{ACCOUNT}"

    def allowed(self, verb: str, resource: str, group: str = "") -> bool:
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}",
                  "system:authenticated")  # fmt: skip
        return tenants.allowed(
            self.kube.api, self.user, verb, resource, namespace=self.namespace, group=group,
            groups=groups,
        )  # fmt: skip

    def kubeconfig(self, plane: ControlPlane, path: Path) -> Path:
        return plane.service_account_kubeconfig(self.namespace, ACCOUNT, path)

    def revoke_config_maps(self) -> None:
        """The Role without its ConfigMap rule (the Lease rule stays): an RBAC edit gone
        wrong. Returns once the authorizer refuses the account's ConfigMap writes."""
        rules = [r for r in self.role["rules"] if "configmaps" not in r["resources"]]
        assert len(rules) < len(self.role["rules"]), self.role["rules"]
        self.rbac.patch_namespaced_role(
            self.role["metadata"]["name"], self.namespace, {"rules": rules}
        )
        wait_for(lambda: not self.allowed("update", "configmaps"), 15, "the revocation")

    def delete(self) -> None:
        for kind, name in self.cluster_scoped:
            if kind == "ClusterRole":
                unless(404, lambda name=name: self.rbac.delete_cluster_role(name))
            else:
                unless(404, lambda name=name: self.rbac.delete_cluster_role_binding(name))


@pytest.fixture
def world(control_plane: ControlPlane, api_client: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    install_extra_crds(api_client)
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    controller_ns = f"dash-{test_id}"
    kube.namespace(controller_ns)
    webhooks = Webhooks(controller_ns, tmp_path / "webhook-certs")
    made: dict[str, Any] = {"kube": kube, "id": test_id, "webhooks": webhooks}
    try:
        # The replica as its pod runs it: its ServiceAccount's token, the chart's RBAC.
        rbac = made["rbac"] = ChartRBAC(kube, controller_ns, test_id)
        # Prometheus scrapes as the hoster binds it: a ServiceAccount bound to the chart's
        # cozystack-gpu-metrics-reader, its token sent over HTTPS.
        made["reader"] = MetricsReader(kube, controller_ns, test_id)
        made["replica"] = ControllerProcess(
            control_plane,
            controller_ns,
            REPLICA,
            tmp_path,
            "--inventory-stale-after",
            str(STALE_AFTER_S),
            *webhooks.args,
            metrics=True,
            kubeconfig=rbac.kubeconfig(control_plane, tmp_path / "controller.kubeconfig"),
        )
        # As the webhook Service waits for it: orders reach a replica that can judge them.
        replica = made["replica"]
        wait_for(lambda: replica.ready()[0] == 200, 60, "the replica ready")
        yield made
    finally:
        # The webhooks go before the replica that answers them (they fail closed).
        webhooks.remove(kube, controller_ns)
        for part in ("prometheus", "agent", "replica"):
            if part in made:
                made[part].stop()
        # The cluster is shared: what this test made must not meet the tests after it.
        Corner(kube, test_id, f"tenant-{test_id}", controller_ns).clean_up()
        unless(404, lambda: kube.core.delete_namespace(f"poor-{test_id}"))
        for part in ("rbac", "reader"):
            if part in made:
                made[part].delete()


def alert_rules(work: Path) -> Path:
    """The chart's PrometheusRule as Helm renders it, thresholds short enough for a test:
    each alert fires at its first evaluation over the threshold, and any refusal rate is
    high."""
    now = {"for": "0s"}
    values = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "alerts": {
                    "noLeader": now,
                    "ordersWaiting": {"afterSeconds": 5},
                    "lostClaims": now,
                    "inventoryStale": now,
                    "admissionRefusals": {"perSecond": 0, **now},
                    "admissionErrors": {"count": 0, **now},
                    "settingsWrite": now,
                },
            }
        }
    }
    (rule,) = helm_template("alerts.yaml", "cozy-gpu", values)
    path = work / "alerts.yaml"
    path.write_text(yaml.safe_dump(rule["spec"]))
    return path


def firing(prom: PrometheusProcess) -> list[dict[str, str]]:
    """The labels of every firing alert."""
    return [a["labels"] for a in prom.alerts() if a["state"] == "firing"]


def as_tenant(plane: ControlPlane, kube: Kube, namespace: str) -> Kube:
    """A tenant admin of ``namespace`` (impersonated), who may order claims there."""
    user = f"admin@{namespace}"
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "order-gpus"},
            "rules": [{"apiGroups": [keys.GROUP], "resources": ["gpuclaims"], "verbs": ["create"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "order-gpus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "order-gpus",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return Kube(api)


def order(kube: Kube, namespace: str, gpu_class: str, dry_run: bool = False) -> str | None:
    """An order of one unit; the refusal's message, or None when it was admitted."""
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": f"again-{uuid.uuid4().hex[:6]}"},
        "spec": {"class": gpu_class, "count": 1},
    }
    extra: Mapping[str, str] = {"dry_run": "All"} if dry_run else {}
    try:
        kube.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, body, **extra
        )
    except ApiException as exc:
        if exc.status != 403:
            raise
        return refusal(exc)
    return None


def test_every_dashboard_query_and_every_alert_against_a_real_prometheus(
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

    # Scraped from the start, so the counters' rates cover every step below (the agent's
    # target is down until it runs).
    agent_port = free_port()
    token_file = tmp_path / "prometheus.token"
    token_file.write_text(world["reader"].token)
    prom = PrometheusProcess(
        cluster.binary_dir() / "prometheus",
        tmp_path / "prometheus",
        [
            Target(
                "cozystack-gpu-controller",
                f"127.0.0.1:{replica.metrics_port}",
                {"pod": REPLICA, "namespace": "cozy-gpu"},
                scheme="https",
                token_file=token_file,
                ca_file=world["webhooks"].cert_dir / "ca.crt",
            ),
            Target(
                "cozystack-gpu-agent",
                f"127.0.0.1:{agent_port}",
                {"node": agent_node},
                scheme="https",
                token_file=token_file,
                insecure=True,
            ),
        ],
        rule_files=[alert_rules(tmp_path)],
    )
    world["prometheus"] = prom
    # Its first scrape comes a few seconds after it starts (discovery's reload): before
    # that, the scenario's first decisions would be in the counters' first samples.
    wait_for(lambda: prom.query('up{job="cozystack-gpu-controller"} == 1'), 30, "a first scrape")

    def phase(name: str, namespace: str = tenant) -> str | None:
        return (kube.get_claim(namespace, name).get("status") or {}).get("phase")

    # One claim Attached on the one-GPU node, which then fails: Lost. Its GPUNode is written
    # once (no agent runs there) and is stale STALE_AFTER_S later: made now, it is fresh for
    # the bind.
    kube.gpu_node(failing, H100, 1, labels=selector)
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
        # The failed node's one unit is still held by its Lost claim.
        "Per-node occupancy (units held / capacity)": {
            (("node", agent_node),): 3 / 8,
            (("node", failing),): 1,
        },
        "Per-node allocatable devices (node agent)": {
            (("node", agent_node), ("resource_name", H100)): 8
        },
        "Binder leader": {(("pod", REPLICA),): 1},
        # No reservation of the class: each hour of the next 24 books none.
        "Units booked by reservations (next 24 h)": {
            (("class", gpu_class), ("hours_ahead", str(hour))): 0 for hour in range(24)
        },
    }
    queries = dashboard_queries()
    assert set(expected) | {
        "Pending claims", "Bind latency", "Refusals by reason", "Binder decisions by step",
        "Reservation decisions by outcome",
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

    # Pending claims: every claim waiting for a node in the cluster (shared with other
    # tests); this test's are the two orders (the Lost claim, whose rebind waits for its
    # VM, is in the Lost panel and alert instead).
    (pending,) = vector(prom, queries["Pending claims"][0]).values()
    assert pending >= 2
    # Bind latency: this test's binds took a moment, well inside the last bucket.
    p50, p95, p99 = (next(iter(vector(prom, q).values())) for q in queries["Bind latency"])
    assert 0 < p50 <= p95 <= p99 <= 60, (p50, p95, p99)
    refusals = vector(prom, queries["Refusals by reason"][0])
    for reason in ("InsufficientCapacity", "BudgetExceeded", "VMIStillRunning"):
        assert refusals.get((("reason", reason),), 0) > 0, (reason, refusals)
    decisions = vector(prom, queries["Binder decisions by step"][0])
    for step in ("Bind", "Attach", "Lose"):
        assert decisions.get((("step", step),), 0) > 0, (step, decisions)
    # Every outcome is a series from the start (the counter starts at 0 for each).
    outcomes = vector(prom, queries["Reservation decisions by outcome"][0])
    for outcome in ("Booked", "Moved", "Lost", "Waiting"):
        assert (("outcome", outcome),) in outcomes, (outcome, outcomes)

    # The picture, from the same queries asked again now that each has its scenario result.
    results = {title: [vector(prom, q) for q in qs] for title, qs in queries.items()}
    compare_picture(draw_dashboard(results, ours_only, test_id), tmp_path)

    # The alerts: the Lost claim and the order waiting longer than 5 s fire for this class;
    # a leader exists, so that alert is quiet, and so are those of the causes below.
    def of_class() -> set[str]:
        return {
            labels["alertname"]
            for labels in firing(prom)
            if labels.get("class") in (gpu_class, None)
        }

    wanted = {"CozystackGPUClaimsLost", "CozystackGPUOrdersWaiting"}
    try:
        got_alerts = wait_for(lambda: wanted <= of_class() and of_class(), 30, "the alerts to fire")
    finally:
        print(f"alerts: {prom.alerts()}")
    assert "CozystackGPUNoBinderLeader" not in got_alerts
    quiet = {
        "CozystackGPUAdmissionRefusalsHigh",
        "CozystackGPUAdmissionErrors",
        "CozystackGPUSettingsWriteFailing",
    }
    assert not quiet & got_alerts, got_alerts
    stale = [a for a in firing(prom) if a["alertname"] == "CozystackGPUNodeInventoryStale"]
    assert agent_node not in {a["node"] for a in stale}, stale

    five_causes_fire_the_other_alerts(
        world, control_plane, prom, gpu_class, poor=poor, agent_node=agent_node
    )


def five_causes_fire_the_other_alerts(
    world: dict[str, Any],
    plane: ControlPlane,
    prom: PrometheusProcess,
    gpu_class: str,
    *,
    poor: str,
    agent_node: str,
) -> None:
    """The five other alerts, each fired by what causes it in a cluster; each is quiet
    before (asserted by the caller)."""
    kube: Kube = world["kube"]
    replica: ControllerProcess = world["replica"]
    webhooks: Webhooks = world["webhooks"]
    rbac: ChartRBAC = world["rbac"]
    test_id: str = world["id"]
    expected = {
        # The agent's last report ages past --inventory-stale-after.
        "CozystackGPUNodeInventoryStale": {"node": agent_node, "severity": "warning"},
        "CozystackGPUAdmissionRefusalsHigh": {
            "webhook": "validate-gpuclaim",
            "reason": "BudgetExceeded",
            "severity": "warning",
        },
        "CozystackGPUAdmissionErrors": {"webhook": "validate-gpuclass", "severity": "critical"},
        "CozystackGPUSettingsWriteFailing": {"severity": "warning"},
        # Still there: the leader's gauges say so.
        "CozystackGPUClaimsLost": {"class": gpu_class, "severity": "warning"},
        "CozystackGPUOrdersWaiting": {"class": gpu_class, "severity": "warning"},
    }

    def seen(want: Mapping[str, Mapping[str, str]]) -> dict[str, bool]:
        now = firing(prom)
        return {name: {"alertname": name, **labels} in now for name, labels in want.items()}

    # The node agent stops (its pod gone, its node's kubelet down): its GPUNode ages from
    # now on, while the steps below run.
    world["agent"].stop()

    # The chart's claim and class webhooks, pointed at the replica by the real API server.
    # The poor tenant's orders over budget are refused there, and it keeps sending them.
    webhooks.install(kube, test_id)
    tenant = as_tenant(plane, kube, poor)
    wait_for(lambda: order(tenant, poor, gpu_class, dry_run=True), 30, "the webhooks to be called")
    refused = order(tenant, poor, gpu_class)
    assert refused is not None and "budget" in refused, refused

    # The replica's Role loses its ConfigMap rule. A new GPU node's resource name must go
    # into gpu-settings: that write is refused. A hoster's new class cannot be judged (the
    # class webhook reads and records the admissions in a ConfigMap): the API server
    # answers the webhook's 500.
    rbac.revoke_config_maps()
    selector = {"test.cozystack.io/id": test_id}  # Corner.clean_up deletes the node
    kube.gpu_node(f"new-{test_id}", f"nvidia.com/GPU_{test_id}", 1, labels=selector)
    with pytest.raises(ApiException) as caught:
        kube.gpu_class(f"l40s-{test_id}", f"nvidia.com/L40S_{test_id}", selector={"none": "x"})
    assert caught.value.status == 500, caught.value
    assert "GPU admission could not complete" in refusal(caught.value), refusal(caught.value)

    def all_fire() -> bool:
        # One more refused order each look: a tenant retrying what the rules refuse.
        assert order(tenant, poor, gpu_class) is not None
        return all(seen(expected).values())

    try:
        wait_for(all_fire, STALE_AFTER_S + 30, "four causes' alerts to fire", interval=0.5)
    finally:
        print(f"alerts: {firing(prom)}")
    assert "settings ConfigMap not written: 403" in replica.log.read_text(), replica.log_tail()

    # The only replica is killed (out of memory, its node lost). The webhooks go first:
    # they fail closed, and the cluster is shared.
    webhooks.remove(kube, poor)
    replica.kill()
    no_leader = {"CozystackGPUNoBinderLeader": {"severity": "critical"}}
    try:
        wait_for(lambda: all(seen(no_leader).values()), 30, "the leader alert", interval=0.5)
    finally:
        print(f"alerts: {firing(prom)}")
