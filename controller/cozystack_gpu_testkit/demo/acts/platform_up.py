"""The platform: control plane, KubeVirt stand-in, the chart, the controller and its webhooks."""

from __future__ import annotations

import json
from pathlib import Path

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.demo import platform, run_state
from cozystack_gpu_testkit.demo.acts.common import (
    CHART_VALUES,
    Demo,
    _lease_holder,
    _webhook_answers,
    _webhook_error,
)
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.demo.hosts import WORKER
from cozystack_gpu_testkit.webhook_route import host_address, route_service


def platform_act(demo: Demo) -> None:
    """The control plane, the chart, and the controller replica behind the webhook Service."""
    console, state = demo.console, demo.state
    console.heading("The platform: a control plane, the chart, the controller")
    with console.step("control plane") as found:
        if demo.options.kubeconfig:
            found.append(f"USING THE CLUSTER AT $KUBECONFIG ({demo.options.kubeconfig}):")
            found.append(
                "the demo creates Nodes, namespaces and the chart's release there, each "
                f"labelled {run_state.MARK}={state.run} (what `make demo-down` removes)"
            )
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
            # Only those it lacks: a cluster's own KubeVirt CRDs are not the demo's to change.
            crds = [cluster.kubevirt_crds(Path(state.bin_dir))]
            cluster.install_crds(demo.api, crds, replace=False)
        found.append(f"KubeVirt's CRDs (virt-operator {_kubevirt_version()}), no kubelets")

    with console.step("helm install cozystack-gpu controller/chart -n cozy-gpu") as found:
        values = json.loads(json.dumps(CHART_VALUES))
        if demo.options.kubeconfig and _foreign_workload_crd(demo):
            values["crds"]["workloads"] = False  # Cozystack's own, left alone
        output = platform.helm_install(state, values, demo.logs / "helm.log", demo.options.chart)
        status = next((ln for ln in output.splitlines() if ln.startswith("STATUS:")), "")
        check(status == "STATUS: deployed", "the release deployed", output)
        demo.chart_values = values
        found.append(f"{status}; values: {json.dumps(values)}")

    with console.step(f"the controller Deployment's pod, as a local process on {WORKER}") as found:
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
