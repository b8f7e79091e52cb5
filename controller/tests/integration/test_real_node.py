"""A real node (``cozystack_gpu_testkit.node``): containerd and kubelet built from source,
registered on a control plane of their own, really running pods.

The plane is this module's, not the session's: a Ready node in the session's plane would be
seen by every test that lists Nodes, and its scheduler could place other tests' pods on it.
The plane runs kube-controller-manager, so pods get service-account tokens and wait for the
``kube-root-ca.crt`` ConfigMap the node's CA publisher writes. Needs root; one real node per
machine at a time (the node waits for another's lock).
"""

from __future__ import annotations

import ipaddress
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from kubernetes import client

from cozystack_gpu.agent.podresources.client import PodResourcesClient, generated
from cozystack_gpu_testkit import cluster, node_config
from cozystack_gpu_testkit import node as real_node

pytestmark = pytest.mark.apiserver

RUNNING_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def node_plane() -> Iterator[cluster.ControlPlane]:
    plane = cluster.start(bin_dir=cluster.binary_dir(), controller_manager=True)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module")
def node(node_plane: cluster.ControlPlane) -> Iterator[real_node.RealNode]:
    started = time.monotonic()
    with real_node.running(node_plane) as made:
        print(f"[real node] {made.name} Ready in {time.monotonic() - started:.1f} s")
        yield made


@pytest.fixture
def core(node_plane: cluster.ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(node_plane.api_client(pool_size=4))


@pytest.fixture
def ns(core: client.CoreV1Api, node_plane: cluster.ControlPlane) -> str:
    """A fresh namespace whose default ServiceAccount exists (pods need it)."""
    name = f"rn-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if core.list_namespaced_service_account(name).items:
            return name
        time.sleep(0.1)
    raise AssertionError(f"no default ServiceAccount in {name}")


def pause_pod(node: real_node.RealNode, name: str, *, host_network: bool) -> dict[str, Any]:
    """A pod of the locally built pause image, bound to the real node by ``nodeName``."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node.name,
            "hostNetwork": host_network,
            "tolerations": [{"key": real_node.NODE_TAINT["key"], "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "pause", "image": node.pause_image, "imagePullPolicy": "Never"}
            ],
        },
    }


def wait_running(core: client.CoreV1Api, ns: str, name: str) -> Any:
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    pod = None
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, ns)
        statuses = pod.status.container_statuses or []
        if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses):
            return pod
        assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
        time.sleep(0.2)
    raise AssertionError(f"pod {ns}/{name} not Running in {RUNNING_TIMEOUT_S:.0f} s: {pod}")


def test_the_node_is_ready_untainted_and_keeps_its_own_taint(
    node: real_node.RealNode, core: client.CoreV1Api
) -> None:
    found = core.read_node(node.name)
    ready = [c for c in found.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    taints = {(t.key, t.effect) for t in found.spec.taints or []}
    assert taints == {(real_node.NODE_TAINT["key"], real_node.NODE_TAINT["effect"])}
    assert found.status.node_info.kubelet_version.startswith("v1.")
    assert found.status.node_info.container_runtime_version.startswith("containerd://2.")


def test_pods_of_the_local_pause_image_run_on_host_and_pod_networks(
    node: real_node.RealNode, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, pause_pod(node, "on-host", host_network=True))
    core.create_namespaced_pod(ns, pause_pod(node, "on-bridge", host_network=False))
    host = wait_running(core, ns, "on-host")
    bridged = wait_running(core, ns, "on-bridge")
    # A hostNetwork pod has the node's address; the other one of the node's pod network.
    assert host.status.pod_ip == node_config.NODE_IP
    subnet = ipaddress.ip_network(node_config.POD_SUBNET)
    assert ipaddress.ip_address(bridged.status.pod_ip) in subnet
    # The pods' service-account token volume needed the CA publisher's ConfigMap.
    assert core.read_namespaced_config_map("kube-root-ca.crt", ns).data["ca.crt"]


def test_kubelets_pod_resources_socket_answers(
    node: real_node.RealNode, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, pause_pod(node, "listed", host_network=True))
    wait_running(core, ns, "listed")
    socket = str(node.pod_resources_socket)
    messages, stubs = generated()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        listed = stubs.PodResourcesListerStub(channel).List(
            messages.ListPodResourcesRequest(), timeout=5
        )
    assert ("listed", ns) in {(p.name, p.namespace) for p in listed.pod_resources}
    # The product's client on the same socket: no pod here holds a device.
    with PodResourcesClient(socket) as product_client:
        assert product_client.pods() == ()
        assert product_client.allocatable() == ()
