"""The node agent against the real kube-apiserver: it builds its node's GPUNode, owned by the
Node, patches only the status fields it owns (the binder's conditions survive), reads pod
phases from the API server, and never touches another node's GPUNode."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import PodResourcesClient
from cozystack_gpu.agent.runner import Agent
from cozystack_gpu.agent.writer import OWNED_STATUS_FIELDS, GPUNodeWriter, PodPhases
from cozystack_gpu_testkit import sysfs_scenarios as sc
from cozystack_gpu_testkit import sysfs_tree as st
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices

pytestmark = pytest.mark.apiserver

H100 = "nvidia.com/GH100_H100_SXM5_80GB"
T4Q = "nvidia.com/GRID_T4-4Q"


@pytest.fixture
def node(api_client: Any, unique: str) -> dict[str, str]:
    name = f"gpu-{unique}"
    created = client.CoreV1Api(api_client).create_node({"metadata": {"name": name}})
    return {"name": name, "uid": created.metadata.uid}


def gpunode(api_client: Any, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, name
    )
    return obj


def make_agent(api_client: Any, node: str, root: Path, kubelet: FakeKubelet) -> Agent:
    return Agent(
        sysfs_root=str(root),
        kubelet=PodResourcesClient(kubelet.socket_path, timeout=2.0),
        writer=GPUNodeWriter(api_client, node),
        phases=PodPhases(api_client, node),
        period=3600,
        poll=1,
        version="test",
    )


def make_pod(api_client: Any, namespace: str, name: str, node: str, phase: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "launcher"}]},
        },
    )
    core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})


def test_the_agent_builds_its_gpunode_owned_by_its_node(
    api_client: Any, node: dict[str, str], namespace: str, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    tree = sc.mixed(tmp_path / "root")
    kubelet.set(
        allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))),
        pods=[
            (namespace, "virt-launcher-live", {H100: [sc.MIXED_PASSTHROUGH[0]]}),
            (namespace, "virt-launcher-done", {H100: [sc.MIXED_PASSTHROUGH[1]]}),
            (namespace, "virt-launcher-mdev", {T4Q: [sc.T4_MDEVS[0][0]]}),
        ],
    )
    make_pod(api_client, namespace, "virt-launcher-live", node["name"], "Running")
    make_pod(api_client, namespace, "virt-launcher-done", node["name"], "Succeeded")
    make_pod(api_client, namespace, "virt-launcher-mdev", node["name"], "Pending")

    result = make_agent(api_client, node["name"], tree.root, kubelet).tick()
    assert result.written and result.report is not None
    assert result.report.skipped_pods == [f"{namespace}/virt-launcher-done"]

    obj = gpunode(api_client, node["name"])
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node["name"], "uid": node["uid"]}
    ]
    status = obj["status"]
    assert status["agentVersion"] == "test"
    assert status["resourceNames"] == [
        "nvidia.com/2bff",
        "nvidia.com/GA102GL_RTX_A6000",
        H100,
        T4Q,
        "nvidia.com/NVIDIA_L40S-12C",
    ]
    assert status["devices"] == result.report.devices  # the server kept every field
    devices = {d["pciAddress"]: d for d in status["devices"]}
    assert len(devices) == 11
    assert devices[sc.MIXED_PASSTHROUGH[0]]["pods"] == [
        {"namespace": namespace, "name": "virt-launcher-live"}
    ]
    assert devices[sc.MIXED_PASSTHROUGH[1]]["pods"] == []  # its pod has Succeeded
    assert devices[sc.MIXED_T4]["pods"] == [{"namespace": namespace, "name": "virt-launcher-mdev"}]
    assert devices[sc.MIXED_T4]["allocatable"] == 1
    vf0 = devices[st.vf_address(sc.MIXED_L40S, 0)]
    assert vf0["vgpuType"] == {"id": 1153, "name": "NVIDIA L40S-12C"}
    assert vf0["physfn"] == sc.MIXED_L40S
    assert (
        devices[sc.MIXED_HOST]["allocatable"] == 0 and "resourceName" not in devices[sc.MIXED_HOST]
    )


def test_only_the_agents_own_fields_are_patched(
    api_client: Any, node: dict[str, str], tmp_path: Path, kubelet: FakeKubelet
) -> None:
    tree = sc.t4_mdev(tmp_path / "root")
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))))
    agent = make_agent(api_client, node["name"], tree.root, kubelet)
    assert agent.tick().written

    # The binder's write, with its own field manager.
    conditions = [
        {
            "type": keys.CONDITION_READY,
            "status": "True",
            "reason": "Serving",
            "message": "serves 1 class",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    client.CustomObjectsApi(api_client).patch_cluster_custom_object_status(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_NODES,
        node["name"],
        {"status": {"conditions": conditions}},
        field_manager=keys.FIELD_MANAGER_BINDER,
        _content_type="application/merge-patch+json",
    )

    tree.create_mdev("0000:af:00.0", "nvidia-230", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    second = agent.tick()
    assert (second.written, second.reason) == (True, "changed")

    obj = gpunode(api_client, node["name"])
    assert obj["status"]["conditions"] == conditions
    idle = {d["pciAddress"]: d for d in obj["status"]["devices"]}["0000:af:00.0"]
    assert idle["mdev"]["devices"] == [
        {
            "uuid": "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
            "type": "nvidia-230",
            "name": "GRID T4-16Q",
        }
    ]
    # The server's own record of who set what: the agent never set conditions.
    agent_fields = [
        m["fieldsV1"]
        for m in obj["metadata"]["managedFields"]
        if m["manager"] == keys.FIELD_MANAGER_AGENT and m.get("subresource") == "status"
    ]
    assert len(agent_fields) == 1
    assert set(agent_fields[0]["f:status"]) - {"."} == {f"f:{f}" for f in OWNED_STATUS_FIELDS}

    with pytest.raises(ValueError, match="does not own"):
        GPUNodeWriter(api_client, node["name"]).patch_status({"conditions": []})


def test_the_agent_never_writes_another_nodes_gpunode(
    api_client: Any, node: dict[str, str], unique: str, tmp_path: Path, kubelet: FakeKubelet
) -> None:
    custom = client.CustomObjectsApi(api_client)
    other = f"other-{unique}"
    custom.create_cluster_custom_object(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_NODES,
        {"apiVersion": keys.API_VERSION, "kind": keys.KIND_NODE, "metadata": {"name": other}},
    )
    custom.patch_cluster_custom_object_status(
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_NODES,
        other,
        {"status": {"resourceNames": ["nvidia.com/other"]}},
        _content_type="application/merge-patch+json",
    )
    before = gpunode(api_client, other)

    tree = sc.h100_x8(tmp_path / "root")
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))))
    agent = make_agent(api_client, node["name"], tree.root, kubelet)
    assert agent.tick().written
    tree.bind("0000:18:00.0", "nvidia")
    assert agent.tick().written

    after = gpunode(api_client, other)
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert after["status"] == {"resourceNames": ["nvidia.com/other"]}
    mine = gpunode(api_client, node["name"])
    assert mine["status"]["devices"][0]["driver"] == "nvidia"


def test_a_deleted_gpunode_is_created_again(
    api_client: Any, node: dict[str, str], tmp_path: Path, kubelet: FakeKubelet
) -> None:
    tree = sc.h100_x8(tmp_path / "root")
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))))
    agent = make_agent(api_client, node["name"], tree.root, kubelet)
    assert agent.tick().written
    client.CustomObjectsApi(api_client).delete_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node["name"]
    )
    assert agent.tick(force=True).written
    status = gpunode(api_client, node["name"])["status"]
    assert [d["allocatable"] for d in status["devices"]] == [1] * 8
