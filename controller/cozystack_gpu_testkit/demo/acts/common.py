"""What every act of the demo shares: the :class:`Demo` it hands on, the story's names, and
the reads more than one act checks with.
"""

from __future__ import annotations

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
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import cluster, kubevirt, tenants
from cozystack_gpu_testkit.demo import existing_cluster, local_pods, node_pods, run_state
from cozystack_gpu_testkit.demo.console import Console, check, wait_until
from cozystack_gpu_testkit.demo.hosts import Kubelets
from cozystack_gpu_testkit.objects import Kube, unless

ANSIBLE_DIR = Path(__file__).parent.with_name("ansible")  # demo/ansible, beside acts/
# Seconds a playbook may take before the demo gives up on it (it takes about 20 on 2 cores).
ANSIBLE_TIMEOUT = 600
# Act 5's window lasts minutes, not hours: the hoster's limits on windows are as short, so
# its warning (warnBefore) comes inside it and a window a day ahead is too far (maxLead).
WINDOW_WARN_S = 30
WINDOW_MAX_LEAD = "1h"
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
                {
                    "kind": "ServiceAccount",
                    "name": existing_cluster.FOREIGN_SERVICE_ACCOUNT,
                    "namespace": run_state.NAMESPACE,
                }
            ]
        }
    },
    "reservations": {"maxLead": WINDOW_MAX_LEAD, "warnBefore": f"{WINDOW_WARN_S}s"},
}
# Act 7's `helm upgrade`: a setting the hoster changes, so the controller's pod template
# changes (an env var) and the local kubelet rolls the pod.
UPGRADE_SETTING = ("rejectionTTLSeconds", "GPU_REJECTION_TTL", 300)
# Act 7's VM, whose claim template asks for more than its tenant's budget leaves.
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
# Each ordering tenant's user: the built-in admin role in its namespace (as Cozystack grants a
# tenant's users), into which the chart's claim roles and KubeVirt's VM rights aggregate.
# Every tenant step of the story is that user's, judged by the API server (impersonation).
TENANT_USER = "alice"
TENANT_USERS = {RESEARCH: TENANT_USER, ACME: "bob"}
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
    # The chart to install, and the code behind image references (run_state.State.images):
    # a recorded release's, for the upgrade test; this checkout's by default.
    chart: Path = run_state.CHART
    images: dict[str, str] = field(default_factory=dict)
    # A real node for the controller's pods (node_pods.CHOICES): auto where this machine
    # can run one, yes or no.
    node: str = "auto"
    out: TextIO = field(default_factory=lambda: sys.stdout)


@dataclass
class Demo:
    options: Options
    console: Console
    state: run_state.State
    api: Any = None
    kube: Kube = field(init=False)
    kubelets: Kubelets = field(init=False)
    pods: local_pods.LocalPods = field(init=False)
    # The controller: a local process (``controller``) or, on a real node (``node``, a
    # node.RealNode), the Deployment's pods there.
    controller: local_pods.LocalPod | None = None
    node: Any = None
    plane: cluster.ControlPlane | None = None  # the demo's own (None on $KUBECONFIG's)
    agents: dict[str, local_pods.LocalPod] = field(default_factory=dict)
    claim_nodes: dict[str, str] = field(default_factory=dict)
    launcher: str = ""
    # The chart values installed (act 7 upgrades from them).
    chart_values: dict[str, Any] = field(default_factory=dict)
    # The token the demo's "Prometheus" scrapes /metrics with.
    metrics_token: str = ""
    # The clients acting as each tenant's user, by user.
    tenant_clients: dict[str, Kube] = field(default_factory=dict)

    def connect(self) -> None:
        self.api = run_state.admin_client(self.state.kubeconfig)
        self.kube = Kube(self.api)
        self.kubelets = Kubelets(self.kube, self.dir, mark=self.state.mark)
        self.pods = local_pods.LocalPods(self.state, self.api, self.options.detach)

    def as_tenant(self, namespace: str) -> Kube:
        """The demo's cluster as ``namespace``'s user (impersonated: the API server judges
        its rights, and its audit log names that user)."""
        user = TENANT_USERS[namespace]
        if user not in self.tenant_clients:
            api = cluster.kubeconfig_client(self.state.kubeconfig)
            self.tenant_clients[user] = tenants.impersonating(api, user)
        return self.tenant_clients[user]

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

    def metrics_endpoint(self) -> tuple[str, int]:
        """Where the leader's /metrics answers: its local process's port, or its pod's
        address on the real node."""
        if self.node is not None:
            return node_pods.metrics_endpoint(self.api, _lease_holder(self))
        assert self.controller is not None
        return "127.0.0.1", self.controller.ports["metrics"]

    # --- reads -----------------------------------------------------------------------------

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        found: dict[str, Any] | None = unless(404, lambda: self.kube.get_claim(namespace, name))
        return found

    def workload(self, namespace: str, claim: str) -> dict[str, Any] | None:
        """A claim's usage record."""
        return self.record(namespace, f"gpuclaim-{claim}")

    def record(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A usage record (Workload) by its name."""
        found: dict[str, Any] | None = unless(
            404,
            lambda: self.kube.custom.get_namespaced_custom_object(
                keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, namespace, keys.WORKLOAD_PLURAL, name
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
            # The run's mark, on what the playbooks make (the catalog's classes).
            "-e", json.dumps({"demo_labels": self.state.mark}),
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


# --- reads more than one act checks with: webhooks, Lease, GPUNodes, claims, the VMI ----------


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


def serving(
    demo: Demo, holders: set[str] | None = None, log: Callable[[], str] | None = None
) -> str:
    """Waits for the API server to reach the webhooks through the chart's Service and for a
    replica (one of ``holders``, when given) to hold the binder Lease; returns the holder.
    ``log``: what the controller wrote, shown when it does not come."""
    wait_until(
        lambda: _webhook_answers(demo),
        expected="the API server to reach the webhooks through the chart's Service",
        saw=lambda: _webhook_error(demo) + (f"\n  controller log:\n{log()}" if log else ""),
        timeout=60,
    )
    return wait_until(
        lambda: h if (h := _lease_holder(demo)) and (holders is None or h in holders) else None,
        expected=f"{'one of ' + str(sorted(holders)) if holders else 'a replica'} to hold "
        "the binder Lease",
        saw=lambda: f"holder {_lease_holder(demo)!r}",
        timeout=60,
    )


def _lease_holder(demo: Demo) -> str | None:
    try:
        lease = client.CoordinationV1Api(demo.api).read_namespaced_lease(
            keys.LEASE_NAME_BINDER, run_state.NAMESPACE
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


def _free(demo: Demo) -> dict[str, int | None]:
    return {n: (c.get("status") or {}).get("free") for n, c in demo.classes().items()}


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


def _vmi(demo: Demo, namespace: str = RESEARCH, name: str = VM) -> dict[str, Any] | None:
    """A VMI (act 4's by default)."""
    found: dict[str, Any] | None = unless(
        404,
        lambda: demo.kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, name
        ),
    )
    return found


def _virt_handler(demo: Demo) -> Kube:
    """Who writes a VMI's phase as virt-handler: its ServiceAccount on the kit's own plane
    (its virt-api keeps no one else's VMI status write), the admin on a cluster of one's own."""
    return demo.kube if demo.options.kubeconfig else kubevirt.virt_handler(demo.kube)


def _bound_pod(demo: Demo, namespace: str, name: str) -> dict[str, Any] | None:
    """A pod once kube-scheduler has bound it to a node."""
    pod = demo.pod(namespace, name)
    return pod if pod and pod["spec"].get("nodeName") else None


def _pod_summary(demo: Demo, namespace: str, name: str) -> str:
    """Where a launcher pod stands: gated, pinned, bound, and why not scheduled."""
    pod = demo.pod(namespace, name)
    if pod is None:
        return f"no pod {name}"
    conditions = (pod.get("status") or {}).get("conditions") or []
    scheduled: dict[str, Any] = next((c for c in conditions if c["type"] == "PodScheduled"), {})
    return (
        f"gated {vmi_pods.is_gated(pod)}, pinned to {vmi_pods.pinned_node(pod)}, nodeName "
        f"{pod['spec'].get('nodeName')}, PodScheduled {scheduled.get('status')} "
        f"{scheduled.get('reason', '')} {scheduled.get('message', '')}"
    )


def _device(demo: Demo, node: str, address: str) -> dict[str, Any]:
    """A device of a GPUNode by its PCI address (empty where it has none)."""
    for device in ((demo.gpunode(node) or {}).get("status") or {}).get("devices") or []:
        if device.get("pciAddress") == address:
            return dict(device)
    return {}


def _device_used_by(demo: Demo, node: str, address: str, pod: str) -> bool:
    return any(p.get("name") == pod for p in _device(demo, node, address).get("pods") or [])


def _left(demo: Demo, namespace: str, name: str, node: str) -> dict[str, Any] | None:
    claim = demo.claim(namespace, name)
    status = (claim or {}).get("status") or {}
    if claim and (status.get("phase") == "Lost" or status.get("nodeName") not in (None, node)):
        return claim
    return None
