"""The demo's story: a platform, then seven acts, each a function whose outcome is checked.

Every act reads back what it did from the API server (or the hosts' sysfs trees) and stops the
demo when that is not what it expects (:mod:`.console`). The acts hand on what later acts need
(where claims were bound, which pod runs the VM) in :class:`Demo`.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.cli import main as kubectl_gpu
from cozystack_gpu.model import Reason
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import cluster, kubevirt
from cozystack_gpu_testkit.demo import platform
from cozystack_gpu_testkit.demo.console import (
    Console,
    DemoFailure,
    Mismatch,
    check,
    wait_until,
)
from cozystack_gpu_testkit.demo.hosts import (
    GPU_TAINT,
    HOSTS,
    L40S_24C,
    WORKER,
    Kubelets,
    advertised,
    build_host,
    check_socket_paths,
    host_root,
    pods_file,
)
from cozystack_gpu_testkit.metrics_scrape import scrape
from cozystack_gpu_testkit.objects import Kube, unless
from cozystack_gpu_testkit.webhook_route import host_address, route_service

ANSIBLE_DIR = Path(__file__).with_name("ansible")
# Seconds a playbook may take before the demo gives up on it (it takes about 20 on 2 cores).
ANSIBLE_TIMEOUT = 600
# The demo's chart values: what a hoster would set for this cluster.
CHART_VALUES: dict[str, Any] = {
    # No Cozystack here: the chart brings the Workload CRD of the usage records.
    "crds": {"workloads": True},
    # One local replica; it holds the Lease and serves the webhooks.
    "controller": {"replicas": 1, "logFormat": "text"},
    "rawNamePolicy": {"virtControllerUser": "system:serviceaccount:kubevirt:kubevirt-controller"},
    # The hoster's Prometheus may read /metrics (capacity is read from there below).
    "metrics": {
        "reader": {
            "subjects": [
                {"kind": "ServiceAccount", "name": "prometheus", "namespace": platform.NAMESPACE}
            ]
        }
    },
}
# Act 6's `helm upgrade`: a setting the hoster changes, so the controller's pod template
# changes (an env var) and the local kubelet rolls the pod.
UPGRADE_SETTING = ("rejectionTTLSeconds", "GPU_REJECTION_TTL", 300)
# Act 6's tenant: a user with the built-in admin role in its namespace (as Cozystack grants a
# tenant's users), and its VM whose claim template asks for more than its budget leaves.
TENANT_USER = "alice"
BURST = "burst"
BURST_TEMPLATE = {"name": "gpu", "class": "h100", "count": 1}
TENANTS = (
    # (namespace, ancestors, budget keys, vGPU entitlement)
    ("tenant-root", (), {keys.QUOTA_KEY_TOTAL: 12}, False),
    ("tenant-acme", ("tenant-root",), {keys.quota_key("h100"): 8}, False),
    (
        "tenant-acme-research",
        ("tenant-root", "tenant-acme"),
        {keys.quota_key("h100"): 2, keys.quota_key("l40s-24c"): 2},
        True,
    ),
)
RESEARCH = "tenant-acme-research"
ACME = "tenant-acme"
ORDERS = (
    # (namespace, claim, class, count)
    (RESEARCH, "train", "h100", 2),
    (RESEARCH, "desk", "l40s-24c", 1),
    (RESEARCH, "spare", "l40s-24c", 1),
    (ACME, "render", "l40s", 1),
)
VM = "desk-vm"
# The licensed vGPU class and the hoster's token Secret it names (ansible/inventory.yml).
LICENSED = "l40s-24c"
TOKEN_SECRET = "nls-token"
# A stand-in: a real one is the .tok file from the NVIDIA Licensing Portal.
STAND_IN_TOKEN = b"stand-in client configuration token (a real one comes from NVIDIA)\n"
FREE_AT_START = {"h100": 4, "l40s": 1, "l40s-24c": 6}
FREE_AT_END = {"h100": 2, "l40s": 0, "l40s-24c": 4}


@dataclass
class Options:
    dir: Path
    # Processes outlive the command (make demo); attached, they die with it (the e2e test).
    detach: bool = True
    # Show kubectl's tables; the shortened demo of the e2e test checks without showing.
    show: bool = True
    # Use the cluster $KUBECONFIG names instead of starting one.
    kubeconfig: str | None = None
    # What stops the demo, as the closing lines say it.
    down_command: str = "make demo-down"
    out: TextIO = field(default_factory=lambda: sys.stdout)


@dataclass
class Demo:
    options: Options
    console: Console
    state: platform.State
    api: Any = None
    kube: Kube = field(init=False)
    kubelets: Kubelets = field(init=False)
    pods: platform.LocalPods = field(init=False)
    controller: platform.LocalPod | None = None
    agents: dict[str, platform.LocalPod] = field(default_factory=dict)
    claim_nodes: dict[str, str] = field(default_factory=dict)
    launcher: str = ""
    # The chart values installed (act 6 upgrades from them).
    chart_values: dict[str, Any] = field(default_factory=dict)
    # The token the demo's "Prometheus" scrapes /metrics with.
    metrics_token: str = ""

    def connect(self) -> None:
        self.api = platform.admin_client(self.state.kubeconfig)
        self.kube = Kube(self.api)
        self.kubelets = Kubelets(self.kube, self.dir)
        self.pods = platform.LocalPods(self.state, self.api, self.options.detach)

    @property
    def dir(self) -> Path:
        return self.options.dir

    @property
    def logs(self) -> Path:
        return self.dir / "logs"

    def kubectl(self, *args: str) -> str:
        result = subprocess.run(
            [str(Path(self.state.bin_dir) / "kubectl"), "--kubeconfig", self.state.kubeconfig,
             *args],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        return result.stdout + result.stderr

    def show(self, *args: str) -> None:
        if self.options.show:
            self.console.show("kubectl " + " ".join(args), self.kubectl(*args))

    # --- reads -----------------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = unless(404, lambda: self.kube.get_claim(namespace, name))
        return found

    def workload(self, namespace: str, claim: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = unless(
            404,
            lambda: self.kube.custom.get_namespaced_custom_object(
                keys.WORKLOAD_GROUP,
                keys.WORKLOAD_VERSION,
                namespace,
                keys.WORKLOAD_PLURAL,
                f"gpuclaim-{claim}",
            ),
        )
        return found

    def gpunode(self, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = unless(
            404,
            lambda: self.kube.custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_NODES, name
            ),
        )
        return found

    def classes(self) -> dict[str, dict[str, Any]]:
        items = self.kube.custom.list_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES
        )["items"]
        return {c["metadata"]["name"]: c for c in items}

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = unless(404, lambda: self.kube.core.read_namespaced_pod(name, namespace))
        found: dict[str, Any] | None = (
            None if pod is None else self.api.sanitize_for_serialization(pod)
        )
        return found

    def ansible(self, playbook: str, log_name: str) -> list[str]:
        """Runs one of the demo's playbooks against the demo inventory with the collection
        from this repository; returns the PLAY RECAP lines and any warnings."""
        collections = self.dir / "collections"
        link = collections / "ansible_collections" / "cozystack" / "gpu"
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(cluster.REPO_ROOT)
        bin_dir = Path(sys.executable).parent
        env = {
            **os.environ,
            "ANSIBLE_COLLECTIONS_PATH": str(collections),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_RETRY_FILES_ENABLED": "0",
            "ANSIBLE_LOCALHOST_WARNING": "0",
            "ANSIBLE_INVENTORY_UNPARSED_WARNING": "0",
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        command = [
            str(bin_dir / "ansible-playbook"),
            "-i", str(ANSIBLE_DIR / "inventory.yml"),
            "-e", f"demo_dir={self.dir}",
            "-e", f"demo_kubeconfig={self.state.kubeconfig}",
            str(ANSIBLE_DIR / playbook),
        ]  # fmt: skip
        log = self.logs / log_name
        with log.open("w") as out:
            out.write("$ " + " ".join(command) + "\n")
            out.flush()
            result = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=ANSIBLE_TIMEOUT,
                check=False,
            )
        text = log.read_text()
        recap = text.split("PLAY RECAP", 1)[1].splitlines()[1:] if "PLAY RECAP" in text else []
        check(
            result.returncode == 0,
            f"ansible-playbook {playbook} to succeed",
            lambda: (
                f"exit status {result.returncode}; the end of {log}:\n"
                + "\n".join(text.splitlines()[-15:])
            ),
        )
        warnings = [ln for ln in text.splitlines() if ln.startswith("[WARNING]")]
        return [" ".join(line.split()) for line in recap if line.strip()] + warnings


# --- the platform ------------------------------------------------------------------------------


def platform_act(demo: Demo) -> None:
    """The control plane, the chart, and the controller replica behind the webhook Service."""
    console, state = demo.console, demo.state
    console.heading("The platform: a control plane, the chart, the controller")
    with console.step("control plane") as found:
        if demo.options.kubeconfig:
            found.append(f"USING THE CLUSTER AT $KUBECONFIG ({demo.options.kubeconfig}):")
            found.append("the demo creates Nodes, namespaces and the chart's release there")
        else:
            bin_dir = Path(state.bin_dir)
            plane = platform.start_plane(demo.dir, bin_dir, detach=demo.options.detach)
            state.kubeconfig = str(plane.kubeconfig)
            state.save()
            found.append(
                f"kube-apiserver {plane.version()} at {plane.server}, with kube-scheduler and "
                "kube-controller-manager"
            )
        demo.connect()
        if demo.options.kubeconfig:
            cluster.install_crds(demo.api, [cluster.kubevirt_crds(Path(state.bin_dir))])
        found.append(f"KubeVirt's CRDs (virt-operator {_kubevirt_version()}), no kubelets")

    with console.step("helm install cozystack-gpu controller/chart -n cozy-gpu") as found:
        values = json.loads(json.dumps(CHART_VALUES))
        if demo.options.kubeconfig and _foreign_workload_crd(demo):
            values["crds"]["workloads"] = False  # Cozystack's own, left alone
        output = platform.helm_install(state, values, demo.logs / "helm.log")
        status = next((ln for ln in output.splitlines() if ln.startswith("STATUS:")), "")
        check(status == "STATUS: deployed", "the release deployed", output)
        demo.chart_values = values
        found.append(f"{status}; values: {json.dumps(values)}")

    with console.step(f"the controller Deployment's pod, as a local process on {WORKER}") as found:
        demo.kubelets.register(WORKER, gpu=False)
        deployment = platform.installed(demo.api, "Deployment", "cozystack-gpu-controller")
        pod = demo.pods.start(
            deployment, "cozystack-gpu-controller-0", WORKER, demo.dir / "hosts" / WORKER
        )
        demo.controller = pod
        demo.pods.wait_ready(pod)
        service = platform.webhook_service(demo.api)
        route_service(demo.api, platform.NAMESPACE, service, host_address(), pod.ports["webhook"])
        wait_until(
            lambda: _webhook_answers(demo),
            expected=f"the API server to reach the webhooks through Service {service}",
            saw=lambda: _webhook_error(demo) + f"\n  controller log:\n{pod.log_tail()}",
            timeout=60,
        )
        lease = wait_until(
            lambda: _lease_holder(demo),
            expected="the replica to hold the binder Lease",
            saw=lambda: f"holder {_lease_holder(demo)!r}",
            timeout=60,
        )
        found.append(f"`python -m cozystack_gpu` with the Deployment's args and env; log {pod.log}")
        found.append(
            f"as ServiceAccount {platform.NAMESPACE}/{pod.obj['spec']['serviceAccountName']} "
            "(a token bound to its Pod), with the chart's RBAC"
        )
        found.append(f"webhook Service {service} → {host_address()}:{pod.ports['webhook']}")
        found.append(f"Lease cozy-gpu/{keys.LEASE_NAME_BINDER} held by {lease}")


def _foreign_workload_crd(demo: Demo) -> bool:
    """Does the cluster have a Workload CRD the chart did not install (Cozystack's)?"""
    try:
        crd = client.ApiextensionsV1Api(demo.api).read_custom_resource_definition(
            f"{keys.WORKLOAD_PLURAL}.{keys.WORKLOAD_GROUP}"
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    owner = (crd.metadata.annotations or {}).get("meta.helm.sh/release-name")
    return owner != platform.RELEASE


def _kubevirt_version() -> str:
    for line in (cluster.REPO_ROOT / "tools" / "versions.env").read_text().splitlines():
        if line.startswith("KUBEVIRT_VERSION="):
            return line.split("=", 1)[1].strip()
    return "unknown"


def _webhook_probe(demo: Demo) -> str | None:
    """None when the class webhook answered a dry-run offer, else the API server's error."""
    offer = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLASS,
        "metadata": {"name": "webhook-probe"},
        "spec": {
            "vendor": "NVIDIA",
            "model": "probe",
            "mode": "passthrough",
            "source": {"devicePlugin": {"resourceName": "example.com/probe"}},
        },
    }
    try:
        demo.kube.custom.create_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, offer, dry_run="All"
        )
    except ApiException as exc:
        return _message(exc)
    return None


def _webhook_answers(demo: Demo) -> bool:
    return _webhook_probe(demo) is None


def _webhook_error(demo: Demo) -> str:
    return _webhook_probe(demo) or "it answers now"


def _lease_holder(demo: Demo) -> str | None:
    try:
        lease = client.CoordinationV1Api(demo.api).read_namespaced_lease(
            keys.LEASE_NAME_BINDER, platform.NAMESPACE
        )
    except ApiException:
        return None
    holder = lease.spec.holder_identity
    return str(holder) if holder else None


def _message(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(exc.body or exc)


# --- act 1 -------------------------------------------------------------------------------------


def act_hosts(demo: Demo) -> None:
    console = demo.console
    console.act(
        1,
        "Hosts",
        "Three GPU hosts boot; the host playbook lays them out; their agents report them.",
    )
    with console.step("three GPU hosts boot: sysfs trees, kubelets register their Nodes") as found:
        for host in HOSTS:
            build_host(demo.dir, host)
            demo.kubelets.register(host.name, gpu=True)
            found.append(f"{host.name}: {host.about}")

    with console.step("ansible-playbook hosts.yml: gpu_node_layout, node_labels") as found:
        recap = demo.ansible("hosts.yml", "ansible-hosts.log")
        for host in HOSTS:
            root = host_root(demo.dir, host.name)
            counts = {r: len(ids) for r, ids in advertised(root).items()}
            check(
                counts == host.advertises,
                f"{host.name}'s tree laid out as {host.advertises}",
                f"{counts}",
            )
            labels = demo.kube.core.read_node(host.name).metadata.labels or {}
            wanted = {**host.labels, keys.LABEL_NODE_LAYOUT_STATE: "applied"}
            missing = {k: v for k, v in wanted.items() if labels.get(k) != v}
            check(not missing, f"Node {host.name} labelled {wanted}", f"labels {labels}")
            found.append(
                f"{host.name}: " + ", ".join(f"{n} x {r}" for r, n in sorted(counts.items()))
            )
        found.extend(recap)
        found.append(f"log: {demo.logs / 'ansible-hosts.log'}")

    with console.step("device plugins advertise; kubelets serve pod-resources") as found:
        for host in HOSTS:
            devices = demo.kubelets.advertise(host.name)
            root = host_root(demo.dir, host.name)
            platform.spawn(
                demo.state,
                f"kubelet/{host.name}",
                [sys.executable, "-m", "cozystack_gpu_testkit.fake_kubelet",
                 "--socket", str(root / "var/lib/kubelet/pod-resources/kubelet.sock"),
                 "--sysfs-root", str(root), "--pods-file", str(pods_file(demo.dir, host.name))],
                log=demo.logs / f"kubelet-{host.name}.log",
                detach=demo.options.detach,
            )  # fmt: skip
            found.append(
                f"{host.name} allocatable: "
                + ", ".join(f"{r}: {len(ids)}" for r, ids in sorted(devices.items()))
            )

    with console.step("the agent DaemonSet's pods, one per GPU node, as local processes") as found:
        daemonset = platform.installed(demo.api, "DaemonSet", "cozystack-gpu-agent")
        spec = daemonset["spec"]["template"]["spec"]
        nodes = [
            n.metadata.name
            for n in demo.kube.core.list_node().items
            if platform.node_matches(spec, n.metadata.labels or {})
        ]
        check(
            sorted(nodes) == sorted(h.name for h in HOSTS),
            "the DaemonSet to select exactly the three GPU nodes",
            f"{sorted(nodes)}",
        )
        for node in sorted(nodes):
            name = f"cozystack-gpu-agent-{node}"
            demo.agents[node] = demo.pods.start(daemonset, name, node, host_root(demo.dir, node))
        for node, pod in sorted(demo.agents.items()):
            demo.pods.wait_ready(pod)
            found.append(f"{pod.name} on {node}: ready (its GPUNode written); log {pod.log}")
        found.append(
            "each as ServiceAccount cozy-gpu/cozystack-gpu-agent with a token bound to its Pod: "
            "the chart's own-node policy sees its node"
        )
        # Every chart pod runs now: the local kubelet takes them over (and the state file).
        pid = platform.start_local_kubelet(demo.state, detach=demo.options.detach)
        found.append(
            f"a local kubelet (pid {pid}) restarts these pods and the controller's when their "
            f"pod templates change, as a cluster rolls them; log {demo.logs}/local-kubelet.log"
        )

    with console.step("GPUNodes: the agents' inventory, the binder's conditions") as found:
        for host in HOSTS:
            wait_until(
                serving(demo, host.name, host.advertises),
                expected=f"GPUNode {host.name} with {host.advertises}, Ready and Advertised",
                saw=gpunode_summary(demo, host.name),
                timeout=60,
            )
            found.append(f"{host.name}: {_gpunode_summary(demo.gpunode(host.name))}")
    demo.show("get", "nodes", "-L", f"{keys.LABEL_NODE_LAYOUT},{keys.LABEL_NODE_LAYOUT_STATE}")
    demo.show("get", "gpunodes")


def _device_counts(gpunode: dict[str, Any] | None) -> dict[str, int]:
    counts: dict[str, int] = {}
    for device in ((gpunode or {}).get("status") or {}).get("devices") or []:
        if device.get("resourceName") and device.get("allocatable"):
            name = device["resourceName"]
            counts[name] = counts.get(name, 0) + int(device["allocatable"])
    return counts


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def serving(demo: Demo, name: str, wanted: dict[str, int]) -> Callable[[], bool]:
    return lambda: _gpunode_serving(demo, name, wanted)


def gpunode_summary(demo: Demo, name: str) -> Callable[[], str]:
    return lambda: _gpunode_summary(demo.gpunode(name))


def _gpunode_ready(demo: Demo, name: str) -> bool:
    return _condition(demo.gpunode(name), keys.CONDITION_READY).get("status") == "True"


def _gpunode_serving(demo: Demo, name: str, wanted: dict[str, int]) -> bool:
    node = demo.gpunode(name)
    return (
        _device_counts(node) == wanted
        and _condition(node, keys.CONDITION_READY).get("status") == "True"
        and _condition(node, keys.CONDITION_NAMES_ADVERTISED).get("status") == "True"
    )


def _gpunode_summary(node: dict[str, Any] | None) -> str:
    if node is None:
        return "no GPUNode"
    ready = _condition(node, keys.CONDITION_READY)
    advertised_ = _condition(node, keys.CONDITION_NAMES_ADVERTISED)
    return (
        f"devices {_device_counts(node)}; Ready={ready.get('status')} ({ready.get('reason')}), "
        f"ResourceNamesAdvertised={advertised_.get('status')} ({advertised_.get('reason')})"
    )


# --- act 2 -------------------------------------------------------------------------------------


def act_catalog(demo: Demo) -> None:
    console = demo.console
    console.act(2, "Catalog", "The hoster's offers, created with the gpu_class module.")
    with console.step(
        f"the vGPU guests' licence token: Secret {platform.NAMESPACE}/{TOKEN_SECRET}"
    ) as found:
        _token_secret(demo)
        found.append(
            f"key {keys.LICENSE_TOKEN_KEY}: a stand-in for the client configuration token; "
            "only the controller reads it"
        )

    with console.step("ansible-playbook catalog.yml: gpu_class, one per offer") as found:
        recap = demo.ansible("catalog.yml", "ansible-catalog.log")
        found.extend(recap)

    with console.step("capacity and free units per class") as found:
        wait_until(
            lambda: _free(demo) == FREE_AT_START,
            expected=f"free units per class {FREE_AT_START}",
            saw=lambda: f"{_free(demo)}",
            timeout=60,
        )
        capacity = wait_until(
            lambda: _capacity_is(demo, FREE_AT_START),
            expected=f"capacity per class (the controller's metrics) {FREE_AT_START}",
            saw=lambda: f"{_capacity(demo)}",
            timeout=30,
        )
        for name, cls in sorted(demo.classes().items()):
            spec = cls["spec"]
            lic = spec.get("license")
            found.append(
                f"{name}: {spec['mode']} {spec.get('profile') or spec['model']}, "
                f"capacity {capacity[name]}, free {cls['status']['free']}"
                + (
                    f", licensed ({lic['secretRef']['name']}/{lic['secretRef']['key']}, "
                    f"FeatureType {lic.get('featureType', keys.LICENSE_DEFAULT_FEATURE_TYPE)})"
                    if lic
                    else ""
                )
            )
    demo.show("get", "gpuclasses")


def _token_secret(demo: Demo) -> None:
    """The hoster's token Secret (kubectl create secret generic ... --from-file=...), marked
    as a licence token (kubectl label secret ... gpu.cozystack.io/license-token=true)."""
    body = {
        "metadata": {
            "name": TOKEN_SECRET,
            "labels": {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK},
        },
        "data": {keys.LICENSE_TOKEN_KEY: base64.b64encode(STAND_IN_TOKEN).decode()},
    }
    try:
        demo.kube.core.create_namespaced_secret(platform.NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        demo.kube.core.replace_namespaced_secret(TOKEN_SECRET, platform.NAMESPACE, body)


def _free(demo: Demo) -> dict[str, int | None]:
    return {n: (c.get("status") or {}).get("free") for n, c in demo.classes().items()}


def _capacity_is(demo: Demo, wanted: dict[str, int]) -> dict[str, int] | None:
    capacity = _capacity(demo)
    return capacity if capacity == wanted else None


def _capacity(demo: Demo) -> dict[str, int]:
    """cozystack_gpu_class_capacity_units from the controller's /metrics (capacity is for the
    hoster only: GPUClass status does not show it)."""
    assert demo.controller is not None
    status, text = scrape(
        demo.controller.ports["metrics"],
        _metrics_token(demo),
        base64.b64decode(
            demo.kube.core.read_namespaced_secret(
                "cozystack-gpu-webhook-tls", platform.NAMESPACE
            ).data["ca.crt"]
        ),
        server_name=f"cozystack-gpu-webhook.{platform.NAMESPACE}.svc",
    )
    check(status == 200, "/metrics to answer the hoster's Prometheus", f"{status} {text}")
    capacity: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith("cozystack_gpu_class_capacity_units{"):
            labels, value = line.rsplit(" ", 1)
            name = labels.split('class="', 1)[1].split('"', 1)[0]
            capacity[name] = int(float(value))
    return capacity


def _metrics_token(demo: Demo) -> str:
    """A token of the ServiceAccount CHART_VALUES binds to the metrics reader role, as the
    hoster's Prometheus pod would have."""
    if not demo.metrics_token:
        account = "prometheus"
        unless(
            409,
            lambda: demo.kube.core.create_namespaced_service_account(
                platform.NAMESPACE, {"metadata": {"name": account}}
            ),
        )
        demo.metrics_token = str(
            demo.kube.core.create_namespaced_service_account_token(
                account, platform.NAMESPACE, {"spec": {"expirationSeconds": 3600}}
            ).status.token
        )
    return demo.metrics_token


# --- act 3 -------------------------------------------------------------------------------------


def act_orders(demo: Demo) -> None:
    console = demo.console
    console.act(
        3,
        "Orders",
        "Tenants in a tree with budgets order claims; what does not fit is refused at once.",
    )
    with console.step("a tenant tree: budgets (ResourceQuota keys), vGPU entitlement") as found:
        for namespace, ancestors, budget, vgpu in TENANTS:
            labels = {f"{keys.TENANT_LABEL_PREFIX}{a}": "" for a in (*ancestors, namespace)}
            if vgpu:
                labels[keys.LABEL_VGPU_ENTITLEMENT] = keys.VGPU_ENTITLEMENT_VALUE
            demo.kube.namespace(namespace, labels)
            demo.kube.quota(namespace, budget)
            found.append(
                "  " * len(ancestors)
                + f"{namespace}: {', '.join(f'{k} {v}' for k, v in budget.items())}"
                + (", vGPU entitled" if vgpu else "")
            )

    copy = keys.license_copy_name(LICENSED)
    with console.step(f"class {LICENSED}'s licence reaches the vGPU-entitled tenant only") as found:
        entitled = [ns for ns, _a, _b, vgpu in TENANTS if vgpu]
        others = [ns for ns, _a, _b, vgpu in TENANTS if not vgpu]
        wait_until(
            lambda: _license_copies(demo) == entitled,
            expected=f"Secret {copy} in {', '.join(entitled)} only",
            saw=lambda: f"in {_license_copies(demo)}",
            timeout=30,
        )
        (where,) = entitled
        data = demo.kube.core.read_namespaced_secret(copy, where).data or {}
        token = base64.b64decode(data.get(keys.LICENSE_TOKEN_KEY, ""))
        check(token == STAND_IN_TOKEN, f"the copy to hold {TOKEN_SECRET}'s token", f"{token!r}")
        feature = base64.b64decode(data.get(keys.LICENSE_FEATURE_TYPE_KEY, "")).decode()
        for namespace in others:
            check(not _has_secret(demo, namespace, copy), f"no {copy} in {namespace}", "one")
        found.append(
            f"Secret {copy} in {where} (vGPU entitled) only: keys "
            f"{', '.join(sorted(data))} ({feature}), the controller's copy of {TOKEN_SECRET}"
        )
        found.append(f"no copy in {', '.join(others)} (not entitled)")

    for namespace, name, cls, count in ORDERS:
        with console.step(f"{namespace} orders {name}: {count} x {cls}") as found:
            demo.kube.claim(namespace, name, cls, count)
            bound = wait_until(
                in_phase(demo, namespace, name, "Bound"),
                expected=f"GPUClaim {namespace}/{name} Bound",
                saw=summary(demo, namespace, name),
                timeout=30,
            )
            demo.claim_nodes[name] = bound["status"]["nodeName"]
            wait_until(
                usage_record(demo, namespace, name),
                expected=f"usage record (Workload) gpuclaim-{name} in {namespace}",
                saw=lambda: "none",
                timeout=30,
            )
            found.append(
                f"Bound on {bound['status']['nodeName']}: "
                f"{_condition(bound, keys.CONDITION_BOUND).get('message')}; "
                f"usage record gpuclaim-{name}"
            )

    with console.step(f"{RESEARCH} orders 1 more h100: over its budget") as found:
        message = _refused(demo, RESEARCH, "more", "h100", 1)
        wanted = (
            f"budget {keys.quota_key('h100')} of {RESEARCH} (this namespace's own quota) "
            "allows 2: 2 in use"
        )
        check(wanted in message, f"a refusal saying '{wanted}…'", message)
        found.append(f"refused at create time: {message}")

    with console.step(f"{ACME} orders 4 x h100: more than any node has free") as found:
        message = _refused(demo, ACME, "big", "h100", 4)
        wanted = "no node serving class h100 has 4 free units; the largest has 2"
        check(wanted in message, f"a refusal saying '{wanted}'", message)
        found.append(f"refused at create time: {message}")
    demo.show("get", "gpuclaims", "-A")


def _license_copies(demo: Demo) -> list[str]:
    """The namespaces holding a copy of the licensed class's token, by the copies' label."""
    found = demo.kube.core.list_secret_for_all_namespaces(
        label_selector=f"{keys.LABEL_LICENSE_CLASS}={LICENSED}"
    )
    return sorted(s.metadata.namespace for s in found.items)


def _has_secret(demo: Demo, namespace: str, name: str) -> bool:
    return unless(404, lambda: demo.kube.core.read_namespaced_secret(name, namespace)) is not None


def in_phase(
    demo: Demo, namespace: str, name: str, phase: str
) -> Callable[[], dict[str, Any] | None]:
    return lambda: _phase_is(demo, namespace, name, phase)


def summary(demo: Demo, namespace: str, name: str) -> Callable[[], str]:
    return lambda: _claim_summary(demo, namespace, name)


def usage_record(demo: Demo, namespace: str, name: str) -> Callable[[], dict[str, Any] | None]:
    return lambda: demo.workload(namespace, name)


def left(demo: Demo, namespace: str, name: str, node: str) -> Callable[[], dict[str, Any] | None]:
    return lambda: _left(demo, namespace, name, node)


def _phase_is(demo: Demo, namespace: str, name: str, phase: str) -> dict[str, Any] | None:
    claim = demo.claim(namespace, name)
    if claim and (claim.get("status") or {}).get("phase") == phase:
        return claim
    return None


def _claim_summary(demo: Demo, namespace: str, name: str) -> str:
    claim = demo.claim(namespace, name)
    if claim is None:
        return f"no GPUClaim {namespace}/{name}"
    status = claim.get("status") or {}
    bound = _condition(claim, keys.CONDITION_BOUND)
    return (
        f"phase {status.get('phase')}, node {status.get('nodeName')}, attachedTo "
        f"{status.get('attachedTo')}, Bound condition {bound.get('reason')}: {bound.get('message')}"
    )


def _refused(demo: Demo, namespace: str, name: str, cls: str, count: int) -> str:
    """The create-time refusal of an order (the claim webhook's message)."""
    try:
        demo.kube.claim(namespace, name, cls, count)
    except ApiException as exc:
        message = _message(exc)
        prefix = "denied the request: "
        return message.split(prefix, 1)[1] if prefix in message else message
    raise Mismatch(
        f"the order {namespace}/{name} refused at create time",
        f"it was admitted: {_claim_summary(demo, namespace, name)}",
    )


# --- act 4 -------------------------------------------------------------------------------------


def act_vm(demo: Demo) -> None:
    console = demo.console
    console.act(
        4,
        "A VM starts",
        f"VM {VM} holds claim desk; KubeVirt's virt-controller, the webhooks, the controller "
        "and kube-scheduler start it.",
    )
    node = demo.claim_nodes["desk"]
    annotation = json.dumps({"claims": ["desk"]})
    watcher = kubevirt.LauncherWatch(demo.kube, RESEARCH, timeout=300)
    with console.step(f"VM {VM} names claim desk; virt-controller creates its VMI") as found:
        body = {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": VM},
            "spec": {
                "runStrategy": "Always",
                "template": {
                    "metadata": {
                        "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                        "annotations": {keys.ANNOTATION_CLAIMS: annotation},
                    },
                    "spec": {"domain": {"devices": {}, "memory": {"guest": "16Gi"}}},
                },
            },
        }
        demo.kube.custom.create_namespaced_custom_object(
            keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, body
        )
        vmi = wait_until(
            lambda: _vmi(demo),
            expected=f"KubeVirt's virt-controller to create VMI {VM}",
            saw=lambda: "no VMI",
            timeout=60,
        )
        gpus = vmi["spec"]["domain"]["devices"].get("gpus") or []
        wanted = [{"name": f"{keys.VMI_GPU_NAME_PREFIX}0", "deviceName": L40S_24C}]
        check(gpus == wanted, f"the VMI webhook to add gpus {wanted}", f"gpus {gpus}")
        claim = demo.claim(RESEARCH, "desk") or {}
        attached = (claim.get("status") or {}).get("attachedTo")
        check(
            attached == VM, f"claim desk attached to {VM}", _claim_summary(demo, RESEARCH, "desk")
        )
        found.append(
            f"template annotation {keys.ANNOTATION_CLAIMS}: {annotation}, "
            f"label {keys.LABEL_CLAIMS_REF}=true; VMI {VM} made by virt-controller"
        )
        found.append(f"VMI webhook: gpus {gpus}; desk.status.attachedTo={attached}")
        volume, disk = _license_disk(vmi)
        copy = keys.license_copy_name(LICENSED)
        check(
            (volume.get("secret") or {}).get("secretName") == copy
            and disk.get("serial") == keys.LICENSE_DISK_SERIAL,
            f"the VMI webhook to add volume {keys.LICENSE_VOLUME_NAME} of Secret {copy} and "
            f"its disk with serial {keys.LICENSE_DISK_SERIAL} ({LICENSED} is licensed)",
            f"volume {volume}, disk {disk}",
        )
        found.append(f"licence: volume {json.dumps(volume)}")
        found.append(
            f"licence: disk {json.dumps(disk)}: the guest reads the token from "
            f"/dev/disk/by-id/virtio-{keys.LICENSE_DISK_SERIAL}"
        )

    with console.step("virt-controller renders the launcher pod; the webhook gates it") as found:
        first = wait_until(
            lambda: watcher.versions[0] if watcher.versions else None,
            expected="virt-controller to create the launcher pod",
            saw=lambda: "no launcher pod",
            timeout=60,
        )
        demo.launcher = first["metadata"]["name"]
        gates = [g["name"] for g in first["spec"].get("schedulingGates") or []]
        check(
            keys.SCHEDULING_GATE_CLAIMS in gates,
            f"pod created with the scheduling gate {keys.SCHEDULING_GATE_CLAIMS}",
            f"gates {gates}",
        )
        tolerated = [t.get("key") for t in first["spec"].get("tolerations") or []]
        check(
            GPU_TAINT["key"] in tolerated,
            f"the class's toleration of {GPU_TAINT['key']} added to the pod",
            f"tolerations {first['spec'].get('tolerations')}",
        )
        (compute,) = [c for c in first["spec"]["containers"] if c["name"] == "compute"]
        limits = compute["resources"].get("limits") or {}
        check(
            limits.get(L40S_24C) == "1",
            f"KubeVirt's compute container to ask for {L40S_24C}: 1",
            f"limits {limits}",
        )
        found.append(f"{demo.launcher}: limits {limits}")
        found.append(f"schedulingGates {gates}; tolerations added for {GPU_TAINT['key']}")
    watcher.stop()

    with console.step("the controller pins and ungates it; kube-scheduler binds it") as found:
        bound = wait_until(
            lambda: _bound_pod(demo),
            expected=f"pod {demo.launcher} bound by kube-scheduler",
            saw=lambda: _pod_summary(demo),
            timeout=60,
        )
        pinned = vmi_pods.pinned_node(bound)
        check(
            pinned == node and not vmi_pods.is_gated(bound) and bound["spec"]["nodeName"] == node,
            f"pinned to {node} (desk's node), ungated, bound to {node}",
            _pod_summary(demo),
        )
        placed = _condition(demo.claim(RESEARCH, "desk"), keys.CONDITION_PLACED)
        check(
            placed.get("reason") == keys.ClaimReason.PINNED.value,
            "desk's Placed condition Pinned",
            f"{placed}",
        )
        found.append(f"node affinity metadata.name In [{pinned}], ungated: {placed['message']}")
        found.append(f"kube-scheduler bound {demo.launcher} to {bound['spec']['nodeName']}")

    with console.step("the VM runs: kubelet starts the pod, virt-handler the VMI") as found:
        devices = demo.kubelets.run_pod(node, RESEARCH, demo.launcher, {L40S_24C: 1})
        # As virt-handler on the kit's own plane: its virt-api keeps no one else's VMI
        # status write.
        handler = demo.kube if demo.options.kubeconfig else kubevirt.virt_handler(demo.kube)
        handler.vmi_phase(RESEARCH, VM, "Running", node)
        attached = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Attached"),
            expected="claim desk Attached",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        (address,) = devices[L40S_24C]
        wait_until(
            lambda: _device_used_by(demo, node, address, demo.launcher),
            expected=f"GPUNode {node} to show {address} used by {demo.launcher}",
            saw=lambda: f"{_device(demo, node, address)}",
            timeout=30,
        )
        check(
            demo.workload(RESEARCH, "desk") is not None,
            "desk's usage record while Attached",
            "none",
        )
        wait_until(
            lambda: keys.FINALIZER_CLAIM in _finalizers(demo, RESEARCH, "desk"),
            expected=f"desk protected by {keys.FINALIZER_CLAIM} while its VM runs",
            saw=lambda: f"finalizers {_finalizers(demo, RESEARCH, 'desk')}",
            timeout=30,
        )
        found.append(f"device plugin allocated {address}; VMI Running on {node}")
        message = _condition(attached, keys.CONDITION_BOUND).get("message")
        found.append(f"desk: {attached['status']['phase']} ({message})")
        found.append(f"GPUNode {node}: {address} used by pod {RESEARCH}/{demo.launcher}")
        found.append(f"desk carries {keys.FINALIZER_CLAIM}; its usage record stays")


def _license_disk(vmi: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The VMI's licence volume and disk (empty where the webhook added none)."""
    name = keys.LICENSE_VOLUME_NAME
    volumes = vmi["spec"].get("volumes") or []
    disks = vmi["spec"]["domain"]["devices"].get("disks") or []
    return (
        next((v for v in volumes if v.get("name") == name), {}),
        next((d for d in disks if d.get("name") == name), {}),
    )


def _vmi(demo: Demo) -> dict[str, Any] | None:
    found: dict[str, Any] | None = unless(
        404,
        lambda: demo.kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, RESEARCH, keys.VMI.plural, VM
        ),
    )
    return found


def _finalizers(demo: Demo, namespace: str, name: str) -> list[str]:
    claim = demo.claim(namespace, name) or {}
    return list((claim.get("metadata") or {}).get("finalizers") or [])


def _bound_pod(demo: Demo) -> dict[str, Any] | None:
    pod = demo.pod(RESEARCH, demo.launcher)
    return pod if pod and pod["spec"].get("nodeName") else None


def _pod_summary(demo: Demo) -> str:
    pod = demo.pod(RESEARCH, demo.launcher)
    if pod is None:
        return f"no pod {demo.launcher}"
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
    return (
        f"gated {vmi_pods.is_gated(pod)}, pinned to {vmi_pods.pinned_node(pod)}, nodeName "
        f"{pod['spec'].get('nodeName')}, PodScheduled {scheduled.get('status')} "
        f"{scheduled.get('reason', '')} {scheduled.get('message', '')}"
    )


def _device(demo: Demo, node: str, address: str) -> dict[str, Any]:
    for device in ((demo.gpunode(node) or {}).get("status") or {}).get("devices") or []:
        if device.get("pciAddress") == address:
            return dict(device)
    return {}


def _device_used_by(demo: Demo, node: str, address: str, pod: str) -> bool:
    return any(p.get("name") == pod for p in _device(demo, node, address).get("pods") or [])


# --- act 5 -------------------------------------------------------------------------------------


def act_life(demo: Demo) -> None:
    console = demo.console
    console.act(
        5,
        "Life goes on",
        "Maintenance moves a hold; a node fails; claims follow; usage records follow them.",
    )
    spare_node = demo.claim_nodes["spare"]
    with console.step(f"kubectl cordon {spare_node}: the unattached hold spare moves") as found:
        demo.kube.cordon(spare_node)
        moved = wait_until(
            lambda: _moved(demo, "spare", spare_node),
            expected=f"claim spare Bound on another node than {spare_node}",
            saw=lambda: _claim_summary(demo, RESEARCH, "spare"),
            timeout=30,
        )
        reason = _condition(moved, keys.CONDITION_BOUND)
        check(reason.get("reason") == keys.ClaimReason.MOVED.value, "reason Moved", f"{reason}")
        desk = demo.claim(RESEARCH, "desk") or {}
        check(
            (desk.get("status") or {}).get("nodeName") == demo.claim_nodes["desk"],
            "desk (attached to the running VM) to stay",
            _claim_summary(demo, RESEARCH, "desk"),
        )
        demo.claim_nodes["spare"] = moved["status"]["nodeName"]
        found.append(f"spare → {moved['status']['nodeName']}: {reason.get('message')}")
        found.append(f"desk stays on {demo.claim_nodes['desk']}: attached to the running VM")

    with console.step(f"kubectl uncordon {spare_node}: the maintenance is over") as found:
        demo.kube.cordon(spare_node, False)
        wait_until(
            lambda: _gpunode_ready(demo, spare_node),
            expected=f"GPUNode {spare_node} Ready again",
            saw=lambda: _gpunode_summary(demo.gpunode(spare_node)),
            timeout=30,
        )
        spare = demo.claim(RESEARCH, "spare") or {}
        check(
            (spare.get("status") or {}).get("nodeName") == demo.claim_nodes["spare"],
            "spare to keep the node it moved to",
            _claim_summary(demo, RESEARCH, "spare"),
        )
        found.append(f"spare keeps {demo.claim_nodes['spare']}: holds keep the nodes they moved to")

    failed = demo.claim_nodes["desk"]
    stranded = [
        (ns, name) for ns, name, _cls, _n in ORDERS
        if name not in ("desk", "train") and demo.claim_nodes[name] == failed
    ]  # fmt: skip
    with console.step(f"{failed} fails: its kubelet stops reporting (NotReady)") as found:
        demo.kubelets.ready(failed, False)
        lost = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Lost"),
            expected="claim desk (attached to the VM on the failed node) Lost",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        wait_until(
            lambda: demo.workload(RESEARCH, "desk") is None,
            expected="desk's usage record gone while it is Lost",
            saw=lambda: "gpuclaim-desk still there",
            timeout=30,
        )
        message = _condition(lost, keys.CONDITION_BOUND).get("message")
        found.append(f"desk Lost: {message}; usage record gone")
        for ns, name in stranded:
            # An unattached hold on the failed node leaves it, or goes Lost with nowhere to go.
            claim = wait_until(
                left(demo, ns, name, failed),
                expected=f"claim {ns}/{name} off {failed} (moved, or Lost with nowhere to go)",
                saw=summary(demo, ns, name),
                timeout=30,
            )
            status = claim["status"]
            message = _condition(claim, keys.CONDITION_BOUND).get("message")
            where = f" on {status['nodeName']}" if status.get("nodeName") else ""
            found.append(f"{name}: {status['phase']}{where} ({message})")
        vmi_wait = _condition(demo.claim(RESEARCH, "desk"), keys.CONDITION_BOUND)
        found.append(f"desk waits: {vmi_wait.get('reason')}: {vmi_wait.get('message')}")

    with console.step(f"the operator stops VM {VM} (its node is dead)") as found:
        # virtctl stop: runStrategy Halted; virt-controller deletes the VMI.
        demo.kube.custom.patch_namespaced_custom_object(
            keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, VM,
            {"spec": {"runStrategy": "Halted"}},
        )  # fmt: skip
        # Nothing on a dead node confirms the pod's end: forced, as an operator would.
        demo.kube.core.delete_namespaced_pod(demo.launcher, RESEARCH, grace_period_seconds=0)
        demo.kubelets.forget_pod(RESEARCH, demo.launcher)
        wait_until(
            lambda: True if _vmi(demo) is None else None,
            expected=f"virt-controller to delete VMI {VM} once its pod is gone",
            saw=lambda: f"VMI {VM} phase {((_vmi(demo) or {}).get('status') or {}).get('phase')}",
            timeout=60,
        )
        found.append(f"runStrategy Halted: virt-controller deleted VMI {VM}")
        rebound = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Bound"),
            expected="claim desk rebound once its VMI is gone",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        reason = _condition(rebound, keys.CONDITION_BOUND)
        check(
            reason.get("reason") == keys.ClaimReason.REBOUND.value
            and rebound["status"]["nodeName"] != failed,
            f"desk Rebound on another node than {failed}",
            _claim_summary(demo, RESEARCH, "desk"),
        )
        wait_until(
            lambda: demo.workload(RESEARCH, "desk"),
            expected="desk's usage record back once it is Bound",
            saw=lambda: "none",
            timeout=30,
        )
        demo.claim_nodes["desk"] = rebound["status"]["nodeName"]
        found.append(f"desk Rebound on {rebound['status']['nodeName']}: {reason.get('message')}")
        found.append("usage record gpuclaim-desk back")

    with console.step(f"{failed} is repaired: Ready again") as found:
        demo.kubelets.ready(failed, True)
        for ns, name in stranded:
            claim = wait_until(
                in_phase(demo, ns, name, "Bound"),
                expected=f"claim {ns}/{name} Bound again",
                saw=summary(demo, ns, name),
                timeout=30,
            )
            wait_until(
                usage_record(demo, ns, name),
                expected=f"usage record gpuclaim-{name} back",
                saw=lambda: "none",
                timeout=30,
            )
            demo.claim_nodes[name] = claim["status"]["nodeName"]
            found.append(
                f"{name}: Bound on {claim['status']['nodeName']} "
                f"({_condition(claim, keys.CONDITION_BOUND).get('reason')}); usage record back"
            )
        wait_until(
            lambda: _gpunode_ready(demo, failed),
            expected=f"GPUNode {failed} Ready again",
            saw=lambda: _gpunode_summary(demo.gpunode(failed)),
            timeout=30,
        )
        found.append(f"GPUNode {failed}: {_gpunode_summary(demo.gpunode(failed))}")
    demo.show("get", "workloads", "-A")


def _moved(demo: Demo, name: str, old: str) -> dict[str, Any] | None:
    claim = _phase_is(demo, RESEARCH, name, "Bound")
    if claim and claim["status"].get("nodeName") not in (None, old):
        return claim
    return None


def _left(demo: Demo, namespace: str, name: str, node: str) -> dict[str, Any] | None:
    claim = demo.claim(namespace, name)
    status = (claim or {}).get("status") or {}
    if claim and (status.get("phase") == "Lost" or status.get("nodeName") not in (None, node)):
        return claim
    return None


# --- act 6 -------------------------------------------------------------------------------------


def act_day_two(demo: Demo) -> None:
    console = demo.console
    console.act(
        6,
        "Day two",
        "The hoster upgrades the chart; a tenant asks why its VM waits; the hoster looks at "
        "the nodes.",
    )
    value_name, env_name, value = UPGRADE_SETTING
    assert demo.controller is not None
    pod_name = demo.controller.name
    with console.step(
        f"helm upgrade --set controller.settings.{value_name}={value}: the pod is rolled"
    ) as found:
        old_pid = _local_pid(demo, pod_name)
        old_value = _process_env(old_pid).get(env_name)
        values = json.loads(json.dumps(demo.chart_values))
        values["controller"].setdefault("settings", {})[value_name] = value
        output = platform.helm_install(demo.state, values, demo.logs / "helm.log")
        revision = next((ln for ln in output.splitlines() if ln.startswith("REVISION:")), "")
        new_pid = wait_until(
            lambda: _rolled(demo, pod_name, old_pid),
            expected=f"the local kubelet to restart pod {pod_name} from the new template, Ready",
            saw=lambda: (
                f"pid {_local_pid(demo, pod_name)}; the local kubelet's log:\n"
                + _tail(demo.logs / "local-kubelet.log")
            ),
            timeout=60,
        )
        new_value = _process_env(new_pid).get(env_name)
        check(new_value == str(value), f"{env_name}={value} in the new process", f"{new_value}")
        wait_until(
            lambda: _webhook_answers(demo),
            expected="the webhooks answered by the new process (the Service's port is kept)",
            saw=lambda: _webhook_error(demo),
            timeout=60,
        )
        lease = wait_until(
            lambda: _lease_holder(demo),
            expected="the new process to hold the binder Lease",
            saw=lambda: f"holder {_lease_holder(demo)!r}",
            timeout=60,
        )
        found.append(f"{revision}; the Deployment's pod template changed ({env_name})")
        found.append(
            f"{pod_name}: pid {old_pid} → {new_pid}, {env_name} {old_value} → {new_value}; "
            f"Ready, Lease held by {lease}, webhooks answering"
        )

    claim_name = keys.template_claim_name(BURST, str(BURST_TEMPLATE["name"]))
    with console.step(
        f"{TENANT_USER} ({RESEARCH}'s admin) starts VM {BURST}: a claim template of "
        f"{BURST_TEMPLATE['count']} x {BURST_TEMPLATE['class']}, beyond its budget"
    ) as found:
        _tenant_admin(demo, RESEARCH, TENANT_USER)
        _start_burst(demo, _as_user(demo, TENANT_USER))
        waiting = wait_until(
            lambda: _placed_reason(demo, claim_name),
            expected=f"template claim {claim_name} Pending, its Placed condition saying why",
            saw=summary(demo, RESEARCH, claim_name),
            timeout=60,
        )
        check(
            waiting.get("reason") == Reason.BUDGET_EXCEEDED.value,
            f"{claim_name} waiting on its budget ({Reason.BUDGET_EXCEEDED.value})",
            f"{waiting}",
        )
        found.append(
            f"RoleBinding {RESEARCH}/{TENANT_USER}-admin: ClusterRole admin (the chart's claim "
            f"roles and KubeVirt's VM rights aggregate into it) for user {TENANT_USER}, who "
            f"creates the VM itself"
        )
        found.append(f"GPUClaim {claim_name}: Pending; the launcher pod stays gated")

    with console.step(f"{TENANT_USER} asks about its VM, with its own rights (--as)") as found:
        argv = ["explain", "vm", BURST, "-n", RESEARCH, "--as", TENANT_USER]
        code, lines, err = _kubectl_gpu(demo, *argv)
        check(code == 0, "kubectl gpu explain vm to exit 0", f"exit {code}: {err}")
        text = "\n".join(lines)
        check(claim_name in text, f"the VM's claim {claim_name} named", text)
        found.append("$ kubectl gpu " + " ".join(argv))
        found.extend("  " + line for line in lines)

    with console.step(f"{TENANT_USER} asks why, with its own rights (--as)") as found:
        argv = ["explain", "claim", claim_name, "-n", RESEARCH, "--as", TENANT_USER]
        code, lines, err = _kubectl_gpu(demo, *argv)
        check(code == 0, "kubectl gpu explain to exit 0", f"exit {code}: {err}")
        text = "\n".join(lines)
        check(
            "Phase:      Pending" in text and Reason.BUDGET_EXCEEDED.value in text,
            "the claim's phase and its reason",
            text,
        )
        seen = [n for n in (*(h.name for h in HOSTS), WORKER, "render", ACME + "/") if n in text]
        check(not seen, "no node and no other tenant's claim named to a tenant", f"{seen}")
        found.append("$ kubectl gpu " + " ".join(argv))
        found.extend("  " + line for line in lines)

    with console.step("the hoster looks at the nodes") as found:
        code, lines, err = _kubectl_gpu(demo, "top", "nodes")
        check(code == 0, "kubectl gpu top nodes to exit 0", f"exit {code}: {err}")
        listed = {line.split()[0] for line in lines[1:] if line.split()}
        check(
            listed == {h.name for h in HOSTS},
            "a row per GPU node and class",
            "\n".join(lines),
        )
        found.append("$ kubectl gpu top nodes")
        found.extend("  " + line for line in lines)
        code, _lines, err = _kubectl_gpu(demo, "top", "nodes", "--as", TENANT_USER)
        check(code == 1, f"top as {TENANT_USER} refused (exit 1)", f"exit {code}")
        found.append(f"as {TENANT_USER}: exit {code}: {err.strip()}")


# KubeVirt's own kubevirt.io:admin role aggregates VM rights into admin; the demo's
# platform has no virt-operator to install it, so the demo installs its equivalent when the
# cluster lacks it.
KUBEVIRT_ADMIN = "kubevirt.io:admin"
DEMO_KUBEVIRT_ADMIN = platform.DEMO_KUBEVIRT_ADMIN


def _tenant_admin(demo: Demo, namespace: str, user: str) -> None:
    """The built-in admin role in ``namespace`` for ``user`` (the chart's claim roles and
    KubeVirt's VM rights aggregate into it): what a tenant's user has, and no more."""
    rbac = client.RbacAuthorizationV1Api(demo.api)
    if unless(404, lambda: rbac.read_cluster_role(KUBEVIRT_ADMIN)) is None and (
        unless(404, lambda: rbac.read_cluster_role(DEMO_KUBEVIRT_ADMIN)) is None
    ):
        rbac.create_cluster_role(
            {
                "metadata": {
                    "name": DEMO_KUBEVIRT_ADMIN,
                    "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"},
                },
                "rules": [
                    {
                        "apiGroups": [keys.KUBEVIRT_GROUP],
                        "resources": ["virtualmachines", "virtualmachineinstances"],
                        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                    }
                ],
            }
        )

    def aggregated() -> bool:
        rules = rbac.read_cluster_role("admin").rules or []
        return any("virtualmachines" in (r.resources or []) for r in rules) and any(
            keys.PLURAL_CLAIMS in (r.resources or []) for r in rules
        )

    wait_until(
        lambda: aggregated() or None,
        expected="claim and VM rights aggregated into ClusterRole admin",
        saw=lambda: "not yet",
        timeout=60,
    )
    binding = {
        "metadata": {"name": f"{user}-admin"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }  # fmt: skip
    if unless(404, lambda: rbac.read_namespaced_role_binding(f"{user}-admin", namespace)) is None:
        rbac.create_namespaced_role_binding(namespace, binding)


def _as_user(demo: Demo, user: str) -> Kube:
    """The demo's cluster as ``user`` (impersonated: the API server judges its rights)."""
    api = cluster.kubeconfig_client(demo.state.kubeconfig)
    api.set_default_header("Impersonate-User", user)
    return Kube(api)


def _start_burst(demo: Demo, tenant: Kube) -> None:
    annotation = json.dumps({"claimTemplates": [BURST_TEMPLATE]})
    body = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": BURST},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {
                    "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                    "annotations": {keys.ANNOTATION_CLAIMS: annotation},
                },
                "spec": {"domain": {"devices": {}, "memory": {"guest": "16Gi"}}},
            },
        },
    }
    tenant.custom.create_namespaced_custom_object(
        keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, body
    )


def _placed_reason(demo: Demo, name: str) -> dict[str, Any] | None:
    """A Pending claim's Placed condition once the binder has judged its VM's set."""
    claim = _phase_is(demo, RESEARCH, name, "Pending")
    placed = _condition(claim, keys.CONDITION_PLACED)
    return placed if placed.get("status") == "False" and placed.get("reason") else None


def _kubectl_gpu(demo: Demo, *argv: str) -> tuple[int, list[str], str]:
    """``kubectl gpu ...`` (the plugin's main, in this process) with the demo's kubeconfig:
    its exit status, its output lines and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = kubectl_gpu.main(["--kubeconfig", demo.state.kubeconfig, *argv], out)
    return code, out.getvalue().splitlines(), err.getvalue()


def _local_pid(demo: Demo, pod: str) -> int | None:
    """The pid of a local pod's process now (the local kubelet writes the state)."""
    state = platform.State.load(demo.dir)
    return None if state is None else state.processes.get(f"pod/{pod}")


def _rolled(demo: Demo, pod: str, old: int | None) -> int | None:
    pid = _local_pid(demo, pod)
    obj = demo.pod(platform.NAMESPACE, pod)
    ready = _condition(obj, "Ready").get("status") == "True"
    return pid if pid is not None and pid != old and ready else None


def _process_env(pid: int | None) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)


def _tail(path: Path, lines: int = 10) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- act 7 -------------------------------------------------------------------------------------


def act_end(demo: Demo) -> None:
    console = demo.console
    console.act(7, "The end", "Classes, claims and nodes as they stand; the cluster stays up.")
    with console.step("the catalog, the holds and the nodes agree") as found:
        wait_until(
            lambda: _free(demo) == FREE_AT_END,
            expected=f"free units per class {FREE_AT_END}",
            saw=lambda: f"{_free(demo)}",
            timeout=30,
        )
        phases = {}
        for ns, name, _cls, _count in ORDERS:
            claim = demo.claim(ns, name) or {}
            phases[name] = (claim.get("status") or {}).get("phase")
        check(
            set(phases.values()) == {"Bound"},
            "every claim Bound (the VM is gone; holds stay)",
            f"{phases}",
        )
        for host in HOSTS:
            check(
                _gpunode_serving(demo, host.name, host.advertises),
                f"GPUNode {host.name} serving",
                _gpunode_summary(demo.gpunode(host.name)),
            )
        found.append(f"free per class {FREE_AT_END}; claims {phases}")
    demo.show("get", "gpuclasses")
    demo.show("get", "gpuclaims", "-A")
    demo.show("get", "gpunodes")
    demo.show("-n", platform.NAMESPACE, "get", "pods", "-o", "wide")


# --- the whole story ---------------------------------------------------------------------------


ACTS: tuple[Callable[[Demo], None], ...] = (
    platform_act,
    act_hosts,
    act_catalog,
    act_orders,
    act_vm,
    act_life,
    act_day_two,
    act_end,
)


def prepare(options: Options) -> Demo:
    """The demo's directory and state, before anything starts."""
    directory = options.dir
    directory.mkdir(parents=True, exist_ok=True)
    check_socket_paths(directory, lambda node: platform.pod_root(directory, node, "agent"))
    (directory / "logs").mkdir(exist_ok=True)
    state = platform.State(
        dir=str(directory),
        kubeconfig=options.kubeconfig or "",
        bin_dir=str(cluster.binary_dir()),
        own_plane=options.kubeconfig is None,
    )
    state.save()
    console = Console(directory / "logs", out=options.out, show_output=options.show)
    return Demo(options, console, state)


def play(demo: Demo) -> None:
    """Every act in order; raises :class:`DemoFailure` at the first step that fails.
    Whatever it started stays up (``platform.down`` stops it)."""
    for act in ACTS:
        act(demo)


def finish(demo: Demo) -> None:
    """The closing lines: how to reach the cluster, how to stop it."""
    say = demo.console.say
    say()
    say(f"The demo ran in {demo.console.elapsed():.0f} s. The cluster stays up:")
    say()
    say(f"  export KUBECONFIG={demo.state.kubeconfig}")
    # kubectl and helm from the built binaries, kubectl-gpu from this environment.
    say(f"  export PATH={demo.state.bin_dir}:{Path(sys.executable).parent}:$PATH")
    say("  kubectl get gpuclasses; kubectl get gpuclaims -A; kubectl get gpunodes")
    say(f"  kubectl gpu explain claim {keys.template_claim_name(BURST, 'gpu')} -n {RESEARCH} "
        f"--as {TENANT_USER}; kubectl gpu top classes")  # fmt: skip
    say()
    say("helm upgrade reaches the controller and agents: a local kubelet restarts their")
    say("processes when the pod templates change (its log: local-kubelet.log), e.g.")
    say(f"  helm upgrade {platform.RELEASE} {platform.CHART} -n {platform.NAMESPACE} "
        "--reuse-values --set controller.settings.writeWorkers=4")  # fmt: skip
    say()
    say(f"Logs: {demo.logs}/. Stop everything (controller, agents, kubelets, control plane):")
    say(f"  {demo.options.down_command}")


def fail(demo: Demo, failure: DemoFailure) -> None:
    say = demo.console.say
    say(failure.explain())
    if demo.state.kubeconfig:
        say(f"  the cluster is left up to look at: export KUBECONFIG={demo.state.kubeconfig}")
    say(f"  {demo.options.down_command} stops what the demo started")
