"""The chart as a hoster runs it, on the session's real node (``real_node_env``): ``helm
install`` of the chart with the image of this tree, and everything it runs runs as pods on
a real kubelet and containerd.

- The controller: 2 replicas of the Deployment, its PodDisruptionBudget, its probes, its
  webhook Service (kube-apiserver calls each replica at its pod address), each replica
  reaching kube-apiserver at the ``kubernetes`` Service as in a cluster.
- The node agent: the DaemonSet's pod, reading a fixture sysfs tree through its ``sys``
  hostPath value and kubelet's real pod-resources socket.
- Device plugins of the kit advertise the fixture tree's devices under the names the
  kubevirt-gpu-device-plugin gives them, so a launcher pod's GPU request is allocated by
  kubelet and reported back to the agent through pod-resources.

Still played by the kit: virt-controller (the launcher pod is written as it renders one)
and virt-handler (the VMI's phase). The node is the plane's only Node.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from real_node_env import (
    DAEMONSET,
    DEPLOYMENT,
    HELM_TIMEOUT,
    NAMESPACE,
    NODE_TOLERATION,
    RELEASE,
    WEBHOOK_SERVICE,
    chart_values,
    delete_namespace,
    fresh_namespace,
    helm,
    launcher_pod,
    pods_of,
)

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import cluster, device_plugin, sysfs_scenarios
from cozystack_gpu_testkit import node as node_kit
from cozystack_gpu_testkit.answer_gap import Gap
from cozystack_gpu_testkit.chart import CHART
from cozystack_gpu_testkit.fake_kubelet import plugin_devices
from cozystack_gpu_testkit.local_cluster import hand_crds_to_helm
from cozystack_gpu_testkit.objects import (
    Kube,
    install_extra_crds,
    message_of,
    order_webhook_answers,
    wait_for,
)

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

CLASS = "real-h100"


@dataclass
class Installed:
    plane: cluster.ControlPlane
    node: node_kit.RealNode
    kube: Kube
    # Resource name -> the device IDs the kit's plugin advertises for it.
    advertised: dict[str, list[str]]
    plugins: dict[str, device_plugin.DevicePlugin]

    @property
    def passthrough(self) -> str:
        """A passthrough resource name of the fixture tree (device IDs are PCI addresses)."""
        return next(r for r, ids in sorted(self.advertised.items()) if ":" in ids[0])


@pytest.fixture(scope="module")
def installed(
    node_plane: cluster.ControlPlane,
    real_node: node_kit.RealNode,
    controller_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Installed]:
    api = node_plane.api_client(pool_size=8)
    kube = Kube(api)
    # KubeVirt's CRDs and the Workload CRD, as a Cozystack cluster has them.
    install_extra_crds(api)
    # Another test on this plane may have installed the gpu CRDs: the release adopts them.
    hand_crds_to_helm(api, RELEASE, NAMESPACE)
    tree = sysfs_scenarios.mixed(tmp_path_factory.mktemp("gpu-host") / "host")
    advertised = plugin_devices(sysfs.read_inventory(str(tree.root)))
    # The node_labels role's label: the agent's DaemonSet runs only on prepared hosts.
    kube.core.patch_node(
        real_node.name,
        {"metadata": {"labels": {keys.LABEL_NODE_LAYOUT_STATE: keys.LayoutState.APPLIED.value}}},
    )
    with contextlib.ExitStack() as stack:
        plugins = {
            r: stack.enter_context(device_plugin.serving(r, ids)) for r, ids in advertised.items()
        }
        # As docs/install.md creates it: the agent's hostPath volumes need privileged.
        kube.core.create_namespace(
            {
                "metadata": {
                    "name": NAMESPACE,
                    "labels": {"pod-security.kubernetes.io/enforce": "privileged"},
                }
            }
        )
        stack.callback(delete_namespace, kube.core, NAMESPACE)
        try:
            helm(
                node_plane,
                "install",
                RELEASE,
                str(CHART),
                "--namespace",
                NAMESPACE,
                "--wait",
                f"--timeout={HELM_TIMEOUT}",
                values=chart_values(controller_image, tree, real_node),
            )
        except AssertionError:
            for pod in kube.core.list_namespaced_pod(NAMESPACE).items:
                print(f"--- {pod.metadata.name}: {pod.status.phase}")
                print(real_node.container_logs(NAMESPACE, pod.metadata.name)[-3000:])
            raise
        stack.callback(helm, node_plane, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        # helm's --wait does not wait for a DaemonSet's first pods to be ready.
        apps = client.AppsV1Api(api)
        try:
            wait_for(
                lambda: (
                    apps.read_namespaced_daemon_set(DAEMONSET, NAMESPACE).status.number_ready == 1
                ),
                timeout=60,
                what="the agent's pod to be ready",
            )
        except AssertionError:
            for pod in pods_of(kube, "app.kubernetes.io/component=agent"):
                print(real_node.container_logs(NAMESPACE, pod.metadata.name)[-4000:])
            raise
        yield Installed(node_plane, real_node, kube, advertised, plugins)


def delete_class(kube: Kube) -> None:
    kube.custom.delete_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, CLASS)


def test_two_controller_replicas_and_the_agent_run_as_ready_pods_behind_the_pdb_and_service(
    installed: Installed,
) -> None:
    kube = installed.kube
    apps = client.AppsV1Api(kube.api)
    deployment = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE)
    assert (deployment.spec.replicas, deployment.status.ready_replicas) == (2, 2)
    selector = deployment.spec.selector.match_labels
    replicas = pods_of(kube, ",".join(f"{k}={v}" for k, v in selector.items()))
    assert len(replicas) == 2
    for pod in replicas:
        (status,) = pod.status.container_statuses
        # Not on the host's network: each replica reached kube-apiserver at the
        # kubernetes Service's address, as in a cluster.
        assert not pod.spec.host_network
        assert (pod.spec.node_name, pod.status.phase, status.ready) == (
            installed.node.name,
            "Running",
            True,
        )
        logs = installed.node.container_logs(NAMESPACE, pod.metadata.name)
        assert status.restart_count == 0, logs[-3000:]
    # The PodDisruptionBudget lets one replica go at a time, never both.
    pdb = client.PolicyV1Api(kube.api).read_namespaced_pod_disruption_budget(DEPLOYMENT, NAMESPACE)
    assert (pdb.status.current_healthy, pdb.status.disruptions_allowed) == (2, 1)
    # kube-apiserver calls the webhooks at the ready replicas' addresses.
    slices = client.DiscoveryV1Api(kube.api).list_namespaced_endpoint_slice(
        NAMESPACE, label_selector=f"kubernetes.io/service-name={WEBHOOK_SERVICE}"
    )
    ready = {
        address
        for s in slices.items
        for e in s.endpoints or []
        if e.conditions.ready
        for address in e.addresses
    }
    assert ready == {p.status.pod_ip for p in replicas}
    # One replica leads: the Lease names it (each replica's identity is its pod's name).
    lease = client.CoordinationV1Api(kube.api).read_namespaced_lease(
        keys.LEASE_NAME_BINDER, NAMESPACE
    )
    assert lease.spec.holder_identity in {p.metadata.name for p in replicas}
    daemonset = apps.read_namespaced_daemon_set(DAEMONSET, NAMESPACE)
    assert (daemonset.status.desired_number_scheduled, daemonset.status.number_ready) == (1, 1)


def gpu_node_status(kube: Kube, name: str) -> dict[str, Any]:
    try:
        found = kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_NODES, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict(found.get("status") or {})


def test_the_agent_pod_reports_the_fixture_hosts_gpus_as_kubelet_counts_them(
    installed: Installed,
) -> None:
    kube, node = installed.kube, installed.node
    wait_for(
        lambda: (
            gpu_node_status(kube, node.name).get("resourceNames") == sorted(installed.advertised)
        ),
        timeout=60,
        what="the agent pod to report the fixture tree's resource names",
    )
    status = gpu_node_status(kube, node.name)
    assert sum(d["allocatable"] for d in status["devices"]) == sum(
        map(len, installed.advertised.values())
    )


@pytest.fixture
def tenant(installed: Installed) -> Iterator[str]:
    core = installed.kube.core
    name = fresh_namespace(core)
    try:
        yield name
    finally:
        delete_namespace(core, name)


def test_the_replicas_webhooks_judge_orders_and_the_leader_binds_one_on_the_real_node(
    installed: Installed, tenant: str
) -> None:
    kube, node = installed.kube, installed.node
    wait_for(
        lambda: bool(gpu_node_status(kube, node.name).get("devices")),
        timeout=60,
        what="the agent pod's first report",
    )
    # The class webhook (a replica's) admits the hoster's class.
    kube.gpu_class(CLASS, installed.passthrough, tolerations=[NODE_TOLERATION])
    try:
        # The claim webhook refuses at create time what cannot fit: more GPUs than the
        # node has of the class.
        units = len(installed.advertised[installed.passthrough])
        with pytest.raises(ApiException) as refused:
            kube.claim(tenant, "too-many", CLASS, count=units + 1)
        assert "gpuclaim.gpu.cozystack.io" in message_of(refused.value)
        kube.claim(tenant, "train", CLASS)
        wait_for(
            lambda: (
                (kube.get_claim(tenant, "train").get("status") or {}).get("nodeName") == node.name
            ),
            timeout=60,
            what="the leading replica to bind the claim on the real node",
        )
        assert kube.get_claim(tenant, "train")["status"]["phase"] == "Bound"
    finally:
        delete_class(kube)


def test_a_launcher_pods_gpu_is_pinned_allocated_by_kubelet_and_reported_by_the_agent_pod(
    installed: Installed, tenant: str
) -> None:
    kube, node = installed.kube, installed.node
    resource = installed.passthrough
    kube.gpu_class(CLASS, resource, tolerations=[NODE_TOLERATION])
    try:
        kube.claim(tenant, "train", CLASS)
        wait_for(
            lambda: (kube.get_claim(tenant, "train").get("status") or {}).get("phase") == "Bound",
            timeout=60,
            what="the claim to be Bound",
        )
        # A VMI naming the claim: the VMI webhook (a replica's) gives it its gpus entry.
        vmi = kube.custom.create_namespaced_custom_object(
            keys.KUBEVIRT_GROUP,
            keys.KUBEVIRT_VERSION,
            tenant,
            "virtualmachineinstances",
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {
                    "name": "train",
                    "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                    "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["train"]}'},
                },
                "spec": {"domain": {"devices": {}, "memory": {"guest": "1Gi"}}},
            },
        )
        gpus = vmi["spec"]["domain"]["devices"].get("gpus", [])
        assert [g["deviceName"] for g in gpus] == [resource]
        # The pod webhook gates the launcher pod; the leader attaches the claim to the VMI,
        # pins the pod to the claim's node and ungates it; the scheduler binds it there.
        kube.core.create_namespaced_pod(tenant, launcher_pod(vmi, node.pause_image))
        pod_name = f"virt-launcher-{vmi['metadata']['name']}"
        wait_for(
            lambda: kube.core.read_namespaced_pod(pod_name, tenant).status.phase == "Running",
            timeout=90,
            what="the launcher pod to run on the real node",
        )
        pod = kube.core.read_namespaced_pod(pod_name, tenant)
        assert pod.spec.node_name == node.name
        assert not pod.spec.scheduling_gates
        # kubelet gave the pod one of the plugin's devices...
        (held,) = installed.plugins[resource].allocations[-1]
        assert held in installed.advertised[resource]

        # ...and the agent pod reads that from kubelet's pod-resources socket.
        def holder_reported() -> bool:
            devices = gpu_node_status(kube, node.name).get("devices", [])
            return any(
                d.get("pciAddress") == held and {"namespace": tenant, "name": pod_name} in d["pods"]
                for d in devices
            )

        wait_for(holder_reported, timeout=60, what="the agent pod to report the launcher pod")
        # virt-handler's part: the VMI runs on the node; the claim is then Attached.
        kube.vmi_phase(tenant, "train", "Running", node.name)
        wait_for(
            lambda: kube.get_claim(tenant, "train")["status"]["phase"] == "Attached",
            timeout=60,
            what="the claim to be Attached to its running VMI",
        )
    finally:
        delete_class(kube)


def test_a_rolling_upgrade_of_the_two_replicas_refuses_no_order_for_want_of_a_webhook(
    installed: Installed, tenant: str
) -> None:
    """docs/operations.md: with the chart's two replicas and its PodDisruptionBudget one
    replica serves while the other is replaced. The upgrade is the command operations.md
    prints; the pod template changes as a new image changes it, so both replicas are
    replaced, one at a time (maxSurge 1, maxUnavailable 0)."""
    kube, plane = installed.kube, installed.plane
    kube.gpu_class(CLASS, installed.passthrough, tolerations=[NODE_TOLERATION])
    apps = client.AppsV1Api(kube.api)
    selector = apps.read_namespaced_deployment(DEPLOYMENT, NAMESPACE).spec.selector.match_labels
    label_selector = ",".join(f"{k}={v}" for k, v in selector.items())
    before = {p.metadata.name for p in pods_of(kube, label_selector)}
    try:
        assert order_webhook_answers(kube, tenant, CLASS)
        unanswered: list[str] = []
        probe = functools.partial(order_webhook_answers, kube, tenant, CLASS, unanswered)
        with Gap(probe, period_s=0.1) as gap:
            helm(
                plane,
                "upgrade",
                RELEASE,
                str(CHART),
                "-n",
                NAMESPACE,
                "--reset-then-reuse-values",
                "--set",
                f"controller.podAnnotations.rollout=r{uuid.uuid4().hex[:6]}",
                "--wait",
                f"--timeout={HELM_TIMEOUT}",
            )
            wait_for(
                lambda: (
                    {p.metadata.name for p in pods_of(kube, label_selector)}.isdisjoint(before)
                    and len(pods_of(kube, label_selector)) == 2
                ),
                timeout=120,
                what="both replicas replaced and the old ones gone",
            )
        print(
            f"[rolling upgrade, 2 replicas, real node] webhook gap {gap.longest_s:.2f} s, "
            f"{gap.refused} of {gap.probes} probes unanswered"
        )
        assert gap.refused == 0, (
            f"{gap.refused} of {gap.probes} orders reached no replica: {unanswered}"
        )
    finally:
        delete_class(kube)
