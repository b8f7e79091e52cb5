"""The layout preview's picture of a node after a change: what kubelet and the node agent
will report, from the host part's prediction. The consequences for claims are pinned through
the collection (tests/unit/plugins/module_utils/test_gpu_layout_cluster.py)."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import layout_preview

R12C = "nvidia.com/NVIDIA_L40S-12C"
VFS = [f"0000:41:00.{i}" for i in range(4, 8)]


def _node(units: int) -> dict[str, Any]:
    return {
        "metadata": {"name": "host", "labels": {}},
        "status": {"allocatable": {R12C: str(units)}},
    }


def _gpunode() -> dict[str, Any]:
    devices = [
        {"pciAddress": a, "resourceName": R12C, "allocatable": 1, "driver": "nvidia"} for a in VFS
    ]
    return {"metadata": {"name": "host"}, "status": {"devices": devices}}


def _vf(address: str, before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    return {
        "address": address,
        "before": {"driver": "nvidia", "devices": before},
        "after": {"driver": "nvidia", "devices": after},
        "changed": True,
    }


def test_the_node_after_the_change_advertises_what_the_host_predicts() -> None:
    node, gpunode = _node(4), _gpunode()
    node_after, gpunode_after = layout_preview.after_objects(
        node,
        gpunode,
        [_vf(VFS[3], {R12C: 1}, {})],
        {"gpu.cozystack.io/layout-state": "applied"},
        {},
    )
    assert node_after["status"]["allocatable"][R12C] == "3"
    assert node_after["metadata"]["labels"] == {"gpu.cozystack.io/layout-state": "applied"}
    entry = next(d for d in gpunode_after["status"]["devices"] if d["pciAddress"] == VFS[3])
    assert entry["allocatable"] == 0 and "resourceName" not in entry
    assert gpunode_after["status"]["resourceNames"] == [R12C]
    assert node["status"]["allocatable"][R12C] == "4"  # inputs untouched
    assert gpunode["status"]["devices"][3]["resourceName"] == R12C


def test_a_passthrough_function_takes_the_name_kubelet_already_advertises() -> None:
    function = {
        "address": "0000:18:00.0",
        "device_id": "2330",
        "after": {"driver": "vfio-pci", "devices": {"nvidia.com/GH100_H100_SXM5_80GB": 1}},
        "changed": True,
    }
    _node_after, gpunode_after = layout_preview.after_objects(
        _node(0), None, [function], {}, {"2330": "nvidia.com/H100"}
    )
    assert gpunode_after["metadata"] == {"name": "host"}
    (entry,) = gpunode_after["status"]["devices"]
    assert entry == {
        "pciAddress": "0000:18:00.0",
        "allocatable": 1,
        "driver": "vfio-pci",
        "resourceName": "nvidia.com/H100",
    }
