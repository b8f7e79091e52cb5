"""The platform: control plane, a real node where the machine runs one, the chart, the
controller (pods on the real node, else a local process) and its webhooks."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.demo import node_pods, platform, run_state
from cozystack_gpu_testkit.demo.acts.common import (
    CHART_VALUES,
    Demo,
    serving,
)
from cozystack_gpu_testkit.demo.console import Mismatch, check, wait_until
from cozystack_gpu_testkit.demo.hosts import WORKER
from cozystack_gpu_testkit.webhook_route import host_address, route_service


def platform_act(demo: Demo) -> None:
    """The control plane, the chart, and the controller replicas behind the webhook Service:
    pods on a real node where this machine runs one, else a local process."""
    console, state = demo.console, demo.state
    console.heading("The platform: a control plane, the chart, the controller")
    no_node = _control_plane(demo)
    if no_node is None:
        _real_node(demo)

    with console.step("helm install cozystack-gpu controller/chart -n cozy-gpu") as found:
        values = json.loads(json.dumps(CHART_VALUES))
        if demo.options.kubeconfig and _foreign_workload_crd(demo):
            values["crds"]["workloads"] = False  # Cozystack's own, left alone
        if demo.node is not None:
            values["image"] = node_pods.image_values(demo.node, demo.dir)
            # A hoster's: two replicas and their PodDisruptionBudget.
            values["controller"]["replicas"] = 2
        output = platform.helm_install(state, values, demo.logs / "helm.log", demo.options.chart)
        status = next((ln for ln in output.splitlines() if ln.startswith("STATUS:")), "")
        check(status == "STATUS: deployed", "the release deployed", output)
        demo.chart_values = values
        found.append(f"{status}; values: {json.dumps(values)}")

    if demo.node is not None:
        _controller_pods(demo)
    else:
        _controller_process(demo, no_node or "")


def _control_plane(demo: Demo) -> str | None:
    """Starts the demo's plane (or connects to $KUBECONFIG's); returns why the controller
    runs without a real node (None: it runs on one)."""
    console, state = demo.console, demo.state
    no_node: str | None
    with console.step("control plane") as found:
        if demo.options.kubeconfig:
            no_node = "the cluster at $KUBECONFIG is not this machine's"
            found.append(f"USING THE CLUSTER AT $KUBECONFIG ({demo.options.kubeconfig}):")
            found.append(
                "the demo creates Nodes, namespaces and the chart's release there, each "
                f"labelled {run_state.MARK}={state.run} (what `make demo-down` removes)"
            )
        else:
            bin_dir = Path(state.bin_dir)
            try:
                no_node = node_pods.why_not(bin_dir, demo.options.node)
            except ValueError as exc:
                raise Mismatch("a real node for the controller's pods", str(exc)) from None
            plane = platform.start_plane(
                demo.dir,
                bin_dir,
                detach=demo.options.detach,
                controllers=cluster.CONTROLLERS if no_node else node_pods.NODE_CONTROLLERS,
            )
            demo.plane = plane
            state.kubeconfig = str(plane.kubeconfig)
            state.save()
            found.append(
                f"kube-apiserver {plane.version()} at {plane.server}, with kube-scheduler and "
                "kube-controller-manager"
            )
        demo.connect()
        if demo.options.kubeconfig:
            # Only those it lacks: a cluster's own KubeVirt CRDs are not the demo's to change.
            crds = [cluster.kubevirt_crds(Path(state.bin_dir))]
            cluster.install_crds(demo.api, crds, replace=False)
        found.append(
            f"KubeVirt's CRDs (virt-operator {_kubevirt_version()}); the GPU hosts' kubelets "
            "are simulated"
        )
    return no_node


def _real_node(demo: Demo) -> None:
    with demo.console.step(f"a real node, {WORKER}: containerd and kubelet") as found:
        assert demo.plane is not None
        node = node_pods.start(demo.plane, WORKER, detach=demo.options.detach)
        demo.node = node
        platform.record_node(demo.dir, node)
        # The run's mark, as on every Node the demo makes.
        demo.kube.core.patch_node(WORKER, {"metadata": {"labels": demo.state.mark}})
        info = (node.node() or {}).get("status", {}).get("nodeInfo", {})
        found.append(
            f"Node {WORKER} Ready: kubelet {info.get('kubeletVersion')}, "
            f"{info.get('containerRuntimeVersion')}; its logs in {node.layout.workdir}"
        )
        found.append("the controller's pods run there; the GPU hosts below stay simulated")


def _controller_pods(demo: Demo) -> None:
    """The Deployment's two pods, from the image, Running on the real node."""
    with demo.console.step(f"the controller Deployment's pods on the real node {WORKER}") as found:
        pods = wait_until(
            lambda: node_pods.rolled_out(demo.api),
            expected=f"Deployment {node_pods.DEPLOYMENT}'s 2 pods Running and Ready on {WORKER}",
            saw=lambda: _pods_seen(demo),
            timeout=180,
        )
        nodes = {p.spec.node_name for p in pods}
        check(nodes == {WORKER}, f"the pods on {WORKER}", f"{nodes}")
        lease = serving(demo)
        image = pods[0].spec.containers[0].image
        found.append(f"{node_pods.describe(pods)}: image {image}, run by containerd")
        found.append(
            f"webhook Service {platform.webhook_service(demo.api)} → the pods' addresses "
            "(its EndpointSlice)"
        )
        found.append(f"Lease cozy-gpu/{keys.LEASE_NAME_BINDER} held by {lease}")
    demo.show("get", "pods", "-n", run_state.NAMESPACE, "-o", "wide")
    demo.show("get", "pdb", "-n", run_state.NAMESPACE)


def _pods_seen(demo: Demo) -> str:
    pods = node_pods.controller_pods(demo.api)
    if not pods:
        return "no pods"
    return (
        "\n".join(
            f"{p.metadata.name} on {p.spec.node_name}: {p.status.phase}; "
            f"{[(s.name, s.ready, s.restart_count) for s in p.status.container_statuses or []]}"
            for p in pods
        )
        + f"\n  last pod's log:\n{node_pods.node_log(demo.node, pods[-1].metadata.name)}"
    )


def _controller_process(demo: Demo, no_node: str) -> None:
    state = demo.state
    with demo.console.step(
        f"the controller Deployment's pod, as a local process on {WORKER}"
    ) as found:
        demo.kubelets.register(WORKER, gpu=False)
        deployment = run_state.installed(demo.api, "Deployment", "cozystack-gpu-controller")
        pod = demo.pods.start(
            deployment, "cozystack-gpu-controller-0", WORKER, demo.dir / "hosts" / WORKER
        )
        demo.controller = pod
        demo.pods.wait_ready(pod)
        service = platform.webhook_service(demo.api)
        route_service(
            demo.api, run_state.NAMESPACE, service, host_address(), pod.ports["webhook"],
            labels=state.mark,
        )  # fmt: skip
        lease = serving(demo, log=pod.log_tail)
        found.append(f"no real node: {no_node}")
        found.append(f"`python -m cozystack_gpu` with the Deployment's args and env; log {pod.log}")
        found.append(
            f"as ServiceAccount {run_state.NAMESPACE}/{pod.obj['spec']['serviceAccountName']} "
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
    return owner != run_state.RELEASE


def _kubevirt_version() -> str:
    for line in (cluster.REPO_ROOT / "tools" / "versions.env").read_text().splitlines():
        if line.startswith("KUBEVIRT_VERSION="):
            return line.split("=", 1)[1].strip()
    return "unknown"
