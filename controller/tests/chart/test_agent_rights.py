"""The node agent's own rights, as the chart ships them, judged by the real API server: the
real agent runs under the agent's ServiceAccount (by impersonation, with the node name a
pod-bound token carries) and writes its own node's GPUNode, never another's, and nothing
but GPUNode."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import yaml
from chartkit import of_kind, render
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import PodResourcesClient
from cozystack_gpu.agent.runner import Agent
from cozystack_gpu.agent.writer import GPUNodeWriter, PodPhases
from cozystack_gpu_testkit import cluster, sysfs_scenarios
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"


@pytest.fixture(scope="module")
def agent_rights(helm: Path, control_plane: cluster.ControlPlane) -> Iterator[str]:
    """The chart's agent ServiceAccount, ClusterRole, binding and own-node policy, applied
    to the session's API server with kubectl; yields the agent's user name."""
    namespace = f"gpu-{uuid.uuid4().hex[:8]}"
    control_plane.kubectl("create", "namespace", namespace)
    wanted = [
        o
        for o in render(helm, namespace=namespace)
        if "agent" in o["metadata"]["name"]
        and o["kind"]
        in (
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        )
    ]
    assert {o["kind"] for o in wanted} >= {"ValidatingAdmissionPolicy", "ClusterRole"}
    manifest = yaml.safe_dump_all(wanted)
    kubectl = [
        str(control_plane.bin_dir / "kubectl"),
        "--kubeconfig",
        str(control_plane.kubeconfig),
    ]
    subprocess.run([*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True,
                   capture_output=True)  # fmt: skip
    yield f"system:serviceaccount:{namespace}:cozystack-gpu-agent"
    subprocess.run([*kubectl, "delete", "--ignore-not-found", "-f", "-"], input=manifest,
                   text=True, check=False, capture_output=True)  # fmt: skip


def as_agent(plane: cluster.ControlPlane, user: str, node: str | None) -> Any:
    """A client that is the agent's ServiceAccount, on the node a pod-bound token names."""
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header(f"Impersonate-Extra-{quote(NODE_NAME_EXTRA, safe='')}", node)
    return api


def agent_for(api: Any, node: str, root: Path, kubelet: FakeKubelet) -> Agent:
    return Agent(
        sysfs_root=str(root),
        kubelet=PodResourcesClient(kubelet.socket_path, timeout=2.0),
        writer=GPUNodeWriter(api, node),
        phases=PodPhases(api, node),
        period=3600,
        poll=1,
        version="test",
    )


def test_the_agent_writes_its_own_nodes_gpunode_and_no_other(
    control_plane: cluster.ControlPlane,
    api_client: Any,
    agent_rights: str,
    tmp_path: Path,
    kubelet: FakeKubelet,
    unique: str,
) -> None:
    core = client.CoreV1Api(api_client)
    own, other = f"own-{unique}", f"other-{unique}"
    for name in (own, other):
        core.create_node({"metadata": {"name": name}})
    tree = sysfs_scenarios.h100_x8(tmp_path / "root")
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))), pods=[])
    api = as_agent(control_plane, agent_rights, own)

    # The policy is enforced once the API server has loaded it: a write of its own node's
    # GPUNode passes either way, so what shows it loaded is a write of another's refused.
    def refused_other() -> Any:
        result = agent_for(api, other, tree.root, kubelet).tick(force=True)
        return None if result.written else result

    refused = wait_for(refused_other, 30, "the own-node policy to refuse another node's GPUNode")
    written = agent_for(api, own, tree.root, kubelet).tick(force=True)
    assert written.written, written.reason
    mine = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, own
    )
    assert len(mine["status"]["devices"]) == 8
    assert "writes only its own node's GPUNode" in refused.reason, refused.reason
    assert f"GPUNode {other} is not the node its pod runs on ({own})" in refused.reason

    nameless = agent_for(as_agent(control_plane, agent_rights, None), own, tree.root, kubelet)
    answer = nameless.tick(force=True)
    assert not answer.written and "its token names no node" in answer.reason, answer.reason


@pytest.mark.parametrize(
    ("what", "call"),
    [
        ("patch a claim's status", "claim_status"),
        ("read secrets", "secrets"),
        ("create pods", "pods"),
        ("change a GPUClass", "gpuclass"),
        ("delete a Node", "node"),
    ],
)
def test_the_agent_may_do_nothing_else(
    control_plane: cluster.ControlPlane, agent_rights: str, what: str, call: str, unique: str
) -> None:
    api = as_agent(control_plane, agent_rights, f"own-{unique}")
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    attempts = {
        "claim_status": lambda: custom.patch_namespaced_custom_object_status(
            keys.GROUP, keys.VERSION, "default", keys.PLURAL_CLAIMS, "x", {"status": {}}
        ),
        "secrets": core.list_secret_for_all_namespaces,
        "pods": lambda: core.create_namespaced_pod(
            "default",
            {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        ),
        "gpuclass": lambda: custom.patch_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, "x", {"metadata": {"labels": {"a": "b"}}}
        ),
        "node": lambda: core.delete_node(f"own-{unique}"),
    }
    with pytest.raises(ApiException) as refused:
        attempts[call]()
    assert refused.value.status == 403, what


def test_the_chart_binds_the_own_node_policy_to_the_agent_only(helm: Path) -> None:
    policies = of_kind(render(helm), "ValidatingAdmissionPolicy")
    own = [p for p in policies if p["metadata"]["name"] == "cozystack-gpu-agent-own-node"]
    assert len(own) == 1
    (condition,) = own[0]["spec"]["matchConditions"]
    assert "system:serviceaccount:cozy-gpu:cozystack-gpu-agent" in condition["expression"]
    assert own[0]["spec"]["failurePolicy"] == "Fail"
