"""A real node (``cozystack_gpu_testkit.node``): containerd and kubelet built from source,
registered on a control plane of their own, really running pods.

The plane is this module's, not the session's: a Ready node in the session's plane would be
seen by every test that lists Nodes, and its scheduler could place other tests' pods on it.
The plane runs kube-controller-manager, so pods get service-account tokens and wait for the
``kube-root-ca.crt`` ConfigMap the node's CA publisher writes. Needs root; one real node per
machine at a time (the node waits for another's lock).

A device plugin of the kit (``device_plugin``) registers two devices with the node's
kubelet; a pod holding one is reported by kubelet's pod-resources API to the agent's own
client, as on a GPU host.

The controller image (tools/build-image.sh, podman) runs here as the chart runs it: its own
user, read-only root, no capabilities; under containerd nobody adds a passwd entry for it,
which podman did and so hid a crash (``getpwuid(): uid not found``) until 0.2.0.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kubernetes import client
from real_node_env import delete_namespace, fresh_namespace, pause_pod, wait_running

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources.client import DeviceSet, PodResourcesClient, generated
from cozystack_gpu_testkit import cluster, device_plugin, node_config, sysfs_scenarios
from cozystack_gpu_testkit import node as real_node_kit
from cozystack_gpu_testkit.fake_kubelet import plugin_devices
from cozystack_gpu_testkit.objects import install_extra_crds, wait_for
from cozystack_gpu_testkit.ports import free_port

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

# How long the controller's container runs before the test looks at its restarts: the
# liveness probe's initial delay, then four periods.
LIVENESS_SEEN_S = 18.0


@pytest.fixture
def node(real_node: real_node_kit.RealNode) -> real_node_kit.RealNode:
    return real_node


@pytest.fixture
def core(node_plane: cluster.ControlPlane) -> client.CoreV1Api:
    return client.CoreV1Api(node_plane.api_client(pool_size=4))


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace, deleted (its pods gone) after the test: the node is the session's."""
    name = fresh_namespace(core)
    try:
        yield name
    finally:
        delete_namespace(core, name)


def test_the_node_is_ready_untainted_and_keeps_its_own_taint(
    node: real_node_kit.RealNode, core: client.CoreV1Api
) -> None:
    found = core.read_node(node.name)
    ready = [c for c in found.status.conditions if c.type == "Ready"]
    assert ready and ready[0].status == "True"
    taints = {(t.key, t.effect) for t in found.spec.taints or []}
    assert taints == {(real_node_kit.NODE_TAINT["key"], real_node_kit.NODE_TAINT["effect"])}
    assert found.status.node_info.kubelet_version.startswith("v1.")
    assert found.status.node_info.container_runtime_version.startswith("containerd://2.")


def test_pods_of_the_local_pause_image_run_on_host_and_pod_networks(
    node: real_node_kit.RealNode, core: client.CoreV1Api, ns: str
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
    node: real_node_kit.RealNode, core: client.CoreV1Api, ns: str
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


def test_a_device_plugins_devices_are_allocated_and_read_by_the_agents_client(
    node: real_node_kit.RealNode, core: client.CoreV1Api, ns: str
) -> None:
    resource = "example.com/test-gpu"
    with device_plugin.serving(resource, ["dev-a", "dev-b"]) as plugin:
        wait_for(
            lambda: (core.read_node(node.name).status.allocatable or {}).get(resource) == "2",
            timeout=30,
            what="kubelet to count the plugin's two devices as allocatable",
            interval=0.2,
        )
        pod = pause_pod(node, "holder", host_network=True)
        pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
        core.create_namespaced_pod(ns, pod)
        wait_running(core, ns, "holder")
        assert len(plugin.allocations) == 1
        (held,) = plugin.allocations[0]
        with PodResourcesClient(str(node.pod_resources_socket)) as product_client:
            # kubelet answers one entry per device (each with its topology).
            allocatable = product_client.allocatable()
            ids = [i for d in allocatable if d.resource_name == resource for i in d.device_ids]
            assert sorted(ids) == ["dev-a", "dev-b"]
            (holder,) = [
                p for p in product_client.pods() if (p.namespace, p.name) == (ns, "holder")
            ]
            assert holder.devices == (DeviceSet(resource, (held,)),)


def test_the_agent_reports_what_a_real_kubelet_allocated_on_a_sysfs_tree(
    node: real_node_kit.RealNode,
    node_plane: cluster.ControlPlane,
    core: client.CoreV1Api,
    ns: str,
    tmp_path: Path,
) -> None:
    """The node agent, once, on a fixture sysfs tree, reading the real kubelet's allocatable
    devices (advertised by device plugins as kubevirt-gpu-device-plugin names them) and the
    pod holding one: its GPUNode as on a GPU host."""
    tree = sysfs_scenarios.mixed(tmp_path / "host")
    advertised = plugin_devices(sysfs.read_inventory(str(tree.root)))
    api = node_plane.api_client(pool_size=4)
    cluster.install_crds(api)
    with contextlib.ExitStack() as plugins:
        served = {
            r: plugins.enter_context(device_plugin.serving(r, ids)) for r, ids in advertised.items()
        }

        def counted() -> bool:
            allocatable = core.read_node(node.name).status.allocatable or {}
            return all(allocatable.get(r) == str(len(ids)) for r, ids in advertised.items())

        wait_for(counted, timeout=30, what="kubelet to count every plugin's devices", interval=0.2)
        resource = sorted(advertised)[0]
        pod = pause_pod(node, "holder", host_network=True)
        pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
        core.create_namespaced_pod(ns, pod)
        wait_running(core, ns, "holder")
        ((held,),) = served[resource].allocations
        agent = subprocess.run(
            [
                sys.executable,
                "-m",
                "cozystack_gpu.agent",
                f"--node={node.name}",
                f"--sysfs-root={tree.root}",
                f"--pod-resources-socket={node.pod_resources_socket}",
                f"--kubeconfig={node_plane.kubeconfig}",
                "--listen=127.0.0.1:0",
                "--once",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    assert agent.returncode == 0, agent.stderr[-4000:]
    status = client.CustomObjectsApi(api).get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node.name
    )["status"]
    assert status["resourceNames"] == sorted(advertised)
    assert sum(d["allocatable"] for d in status["devices"]) == sum(map(len, advertised.values()))
    # The first resource by name is a passthrough one: its device ID is the PCI address.
    holders = {d["pciAddress"]: d["pods"] for d in status["devices"] if d["pods"]}
    assert holders == {held: [{"namespace": ns, "name": "holder"}]}


def controller_pod(node: real_node_kit.RealNode, image: str, ns: str, port: int) -> dict[str, Any]:
    """The controller as the chart's Deployment runs it (its security contexts, its
    liveness and readiness probes), on the host's network with the API server's loopback
    address (no kube-proxy here), logging in with its service account's projected token."""
    health, ready = free_port(), free_port()
    return {
        "metadata": {"name": "controller"},
        "spec": {
            "nodeName": node.name,
            "hostNetwork": True,
            "tolerations": [{"key": real_node_kit.NODE_TAINT["key"], "operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "controller",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-m", "cozystack_gpu"],
                    "args": [
                        f"--namespace={ns}",
                        "--identity=on-a-real-node",
                        f"--health-port={health}",
                        f"--ready-port={ready}",
                        f"--metrics-port={free_port()}",
                        # No webhook certificate here (test_real_node_chart.py serves the
                        # webhooks): without a port to wait for, ready once synced.
                        "--webhook-port=0",
                        "--log-format=text",
                    ],
                    "env": [
                        {"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(port)},
                    ],
                    # The chart's initial delay (kopf's /healthz comes after the binder);
                    # a shorter period, for the test to see several probes pass.
                    "livenessProbe": {
                        "httpGet": {"path": "/healthz", "port": health},
                        "initialDelaySeconds": 10,
                        "periodSeconds": 2,
                        "timeoutSeconds": 5,
                        "failureThreshold": 3,
                    },
                    "readinessProbe": {
                        "httpGet": {"path": "/readyz", "port": ready},
                        "periodSeconds": 1,
                    },
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }


def test_the_controller_image_runs_as_a_pod_and_stays_running(
    node: real_node_kit.RealNode,
    node_plane: cluster.ControlPlane,
    controller_image: str,
    core: client.CoreV1Api,
    ns: str,
) -> None:
    api = node_plane.api_client(pool_size=4)
    cluster.install_crds(api)
    install_extra_crds(api)
    # What the chart's RBAC grants is tested elsewhere; here the runtime is under test.
    client.RbacAuthorizationV1Api(api).create_cluster_role_binding(
        {
            "metadata": {"name": f"controller-{ns}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
        }
    )
    port = int(node_plane.server.rsplit(":", 1)[1])
    core.create_namespaced_pod(ns, controller_pod(node, controller_image, ns, port))
    try:
        wait_running(core, ns, "controller")
        wait_for(
            lambda: _lease_holder(api, ns) == "on-a-real-node",
            timeout=60,
            what="the controller pod to take the Lease",
        )
        # Under containerd nobody adds a passwd entry: the image's own names its user.
        whoami = node_plane.kubectl(
            "exec",
            "-n",
            ns,
            "controller",
            "--",
            "python",
            "-c",
            "import getpass, os; print(getpass.getuser(), os.getuid())",
            check=False,
        )
        assert whoami.stdout.split() == ["nonroot", "65532"], whoami.stderr
        # Several liveness periods after the first probe it has not restarted, still Ready.
        started = core.read_namespaced_pod("controller", ns).status.container_statuses[0]
        alive_s = time.time() - started.state.running.started_at.timestamp()
        time.sleep(max(0.0, LIVENESS_SEEN_S - alive_s))
        pod = core.read_namespaced_pod("controller", ns)
        status = pod.status.container_statuses[0]
        assert (pod.status.phase, status.ready, status.restart_count) == ("Running", True, 0)
    except BaseException:
        print(node.container_logs(ns, "controller")[-4000:])
        raise


def _lease_holder(api: Any, ns: str) -> str | None:
    try:
        lease = client.CoordinationV1Api(api).read_namespaced_lease(keys.LEASE_NAME_BINDER, ns)
    except client.ApiException:
        return None
    return str(lease.spec.holder_identity or "") or None
