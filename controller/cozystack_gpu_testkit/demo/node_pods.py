"""The demo's real node: the chart's controller as pods from the image, on a real kubelet.

Where this machine can run one (``node.check_host``: root, ``make binaries``, Debian's runc and
CNI plugins, and no other real node holding the lock), the demo's worker is a real node
(containerd and kubelet, ``cozystack_gpu_testkit.node``): the controller image is built by
tools/build-image.sh and imported into its containerd, and the chart's Deployment runs there
as a hoster's cluster runs it (two replicas, its PodDisruptionBudget, its probes, the webhook
Service at the pods' addresses). The kube-controller-manager of the demo's plane runs the
workload controllers for it (``NODE_CONTROLLERS``).

What stays simulated: the three GPU hosts (fixture sysfs trees, a kubelet each that the demo
plays), so their agent pods are local processes (``local_pods``), and KubeVirt's virt-handler
(the kit plays it). The DaemonSet controller does not run: its pods on the simulated hosts
would wait for kubelets that do not exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, controller_image, node_host
from cozystack_gpu_testkit import node as node_kit
from cozystack_gpu_testkit.demo.run_state import NAMESPACE

DEPLOYMENT = "cozystack-gpu-controller"
NODE_CONTROLLERS = tuple(c for c in cluster.WORKLOAD_CONTROLLERS if c != "daemonset-controller")
# --node: auto runs one where the machine can, yes refuses to go on without one.
CHOICES = ("auto", "yes", "no")


def why_not(bin_dir: Path, wanted: str) -> str | None:
    """Why the demo runs without a real node (None: it runs on one). Raises ValueError where
    one was asked for (``wanted`` "yes") and cannot run."""
    if wanted == "no":
        return "not asked for (--node=no)"
    why = None
    try:
        node_kit.check_host(bin_dir)
        lock = node_host.NodeLock()
        lock.acquire(0)  # free now; the node takes it again when it starts
        lock.release()
    except (node_kit.NodeError, node_host.NodeBusy) as exc:
        why = str(exc)
    if why is not None and wanted == "yes":
        raise ValueError(f"a real node was asked for (--node=yes), but {why}")
    return why


def start(plane: cluster.ControlPlane, name: str, *, detach: bool) -> node_kit.RealNode:
    """A real node named ``name``, untainted: the scheduler places the controller's pods
    there as on any worker."""
    return node_kit.start(plane, name=name, taints=(), detach=detach, lock_timeout=30)


def image_values(node: node_kit.RealNode, scratch: Path) -> dict[str, Any]:
    """The chart's ``image`` values for this tree's image, built and imported into ``node``
    (no registry here: the kubelet never pulls it)."""
    repository, tag = controller_image.build_into(node, scratch).rsplit(":", 1)
    return {"repository": repository, "tag": tag, "pullPolicy": "Never"}


def _running_ready(pod: Any) -> bool:
    statuses = pod.status.container_statuses or []
    return pod.status.phase == "Running" and bool(statuses) and all(s.ready for s in statuses)


def controller_pods(api: Any) -> list[Any]:
    """The Deployment's pods, by name (those being deleted too)."""
    deployment = client.AppsV1Api(api).read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
    selector = ",".join(f"{k}={v}" for k, v in deployment.spec.selector.match_labels.items())
    pods = client.CoreV1Api(api).list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return sorted(pods, key=lambda p: p.metadata.name)


def rolled_out(api: Any) -> list[Any] | None:
    """The Deployment's pods once its rollout is done: every replica updated, Running and
    Ready, and no pod of an older template left; None before."""
    deployment = client.AppsV1Api(api).read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
    status, wanted = deployment.status, deployment.spec.replicas
    if (status.observed_generation or 0) < deployment.metadata.generation:
        return None
    if not (status.updated_replicas == status.ready_replicas == wanted == status.replicas):
        return None
    pods = controller_pods(api)
    if len(pods) != wanted or not all(
        _running_ready(p) and not p.metadata.deletion_timestamp for p in pods
    ):
        return None
    return pods


def describe(pods: list[Any]) -> str:
    return ", ".join(f"{p.metadata.name} ({p.status.pod_ip})" for p in pods)


def container_env(pod: Any, name: str) -> str | None:
    """The value of ``name`` in the pod's controller container, as kubelet started it."""
    for container in pod.spec.containers:
        for env in container.env or []:
            if env.name == name and env.value is not None:
                return str(env.value)
    return None


def metrics_endpoint(api: Any, holder: str | None) -> tuple[str, int]:
    """Where the Lease holder's /metrics answers: its pod's address and metrics port (the
    capacity gauges are the leader's)."""
    pods = {p.metadata.name: p for p in controller_pods(api)}
    pod = pods.get(holder or "")
    if pod is None or not pod.status.pod_ip:
        raise LookupError(f"no running controller pod holds {keys.LEASE_NAME_BINDER}: {holder}")
    for container in pod.spec.containers:
        for port in container.ports or []:
            if port.name == "metrics":
                return str(pod.status.pod_ip), int(port.container_port)
    raise LookupError(f"pod {pod.metadata.name} names no metrics port")


def node_log(node: node_kit.RealNode, pod: str) -> str:
    """The tail of a controller pod's container log, from the node's containerd."""
    return node.container_logs(NAMESPACE, pod)[-3000:]
