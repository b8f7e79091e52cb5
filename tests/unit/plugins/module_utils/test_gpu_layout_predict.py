"""Check mode's picture of the host after the layout, and the Node labels a host earns.

The invariant: what check mode predicts (each function's driver and device-plugin devices,
and the labels) is what a host reads once the same plan has been applied. The cluster part
judges claims by that prediction, so a wrong one would move the wrong holds.
"""

from __future__ import annotations

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_schema,
    gpu_node_labels,
)
from ansible_collections.cozystack.gpu.plugins.modules import gpu_facts, gpu_node_layout

PF = "0000:41:00.0"

VF0, VF1 = "0000:41:00.4", "0000:41:00.5"
TWO_12C = {0: "NVIDIA L40S-12C", 1: "NVIDIA L40S-12C"}

# name -> (scenario, or VF profiles of one L40S; the layout)
CHANGES = {
    "a GPU to passthrough, a VF replaced, an mdev added": (
        "mixed",
        {
            "gpus": [
                {"address": "5d:00.0", "mode": "passthrough"},
                {"address": "41:00.0", "mode": "vgpu", "vfs": {VF0: "NVIDIA L40S-24C"}},
                {"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q", "count": 2},
            ]
        },
    ),
    "a VF given another profile": (
        "l40s-sriov",
        {"gpus": [{"address": PF, "mode": "vgpu", "vfs": {VF1: "NVIDIA L40S-24C"}}]},
    ),
    "vGPUs beyond count removed": (
        TWO_12C,
        {"gpus": [{"address": PF, "mode": "vgpu", "profile": "NVIDIA L40S-12C", "count": 1}]},
    ),
    "mdevs beyond count removed": (
        "t4-mdev",
        {"gpus": [{"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q", "count": 1}]},
    ),
}


def host(testkit, scenarios, what, root):
    if isinstance(what, str):
        return scenarios.SCENARIOS[what](root)
    return testkit.build(
        root, [testkit.Gpu(PF, testkit.L40S, driver="nvidia", vfs=4, profiles=what)]
    )


def devices(inventory):
    return {
        f.address: (f.driver, gpu_node_layout._devices(f))  # pylint: disable=protected-access
        for f in inventory.functions
    }


@pytest.mark.parametrize("case", sorted(CHANGES))
def test_check_mode_predicts_what_applying_yields(
    case, testkit, scenarios, apply, sriov_manage, tmp_path
):
    what, document = CHANGES[case]
    predicted_tree = host(testkit, scenarios, what, tmp_path / "predicted")
    predicted = apply(predicted_tree, document, check_mode=True, force=True)
    tree = host(testkit, scenarios, what, tmp_path / "applied")
    applied = apply(tree, document, force=True, runner=sriov_manage(tree))
    assert applied.ok, (applied.error, applied.remaining, applied.plan.refusals)
    assert predicted.plan.steps and predicted.unforeseen == []
    assert devices(predicted.inventory_after) == devices(applied.inventory_after)
    assert gpu_node_labels.gpu_labels(predicted.inventory_after) == gpu_node_labels.gpu_labels(
        applied.inventory_after
    )


def test_vfs_not_enabled_yet_are_named_as_unforeseen(build, testkit, apply):
    tree = build(testkit.Gpu(PF, testkit.L40S, driver="nvidia"))
    document = {"gpus": [{"address": PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C"}]}
    result = apply(tree, document, check_mode=True)
    assert result.unforeseen == [PF]


EXPECTED_LABELS = {
    # What the node_labels role wrote for these trees before the rule moved to Python, as
    # the cluster molecule scenario checks it on real Nodes.
    "mixed": {
        "model.gpu.cozystack.io/GH100_H100_SXM5_80GB": "3",
        "model.gpu.cozystack.io/TU104GL_TESLA_T4": "1",
        "model.gpu.cozystack.io/AD102GL_L40S": "1",
        "model.gpu.cozystack.io/2BFF": "1",
        "model.gpu.cozystack.io/GA102GL_RTX_A6000": "1",
        "profile.gpu.cozystack.io/NVIDIA_L40S-12C": "1",
        "profile.gpu.cozystack.io/GRID_T4-4Q": "1",
        "mode.gpu.cozystack.io/passthrough": "4",
        "mode.gpu.cozystack.io/vgpu": "2",
    },
    "h100-x8": {
        "model.gpu.cozystack.io/GH100_H100_SXM5_80GB": "8",
        "mode.gpu.cozystack.io/passthrough": "8",
    },
    "l40s-sriov": {
        "model.gpu.cozystack.io/AD102GL_L40S": "1",
        "profile.gpu.cozystack.io/NVIDIA_L40S-12C": "1",
        "profile.gpu.cozystack.io/NVIDIA_L40S-24C": "1",
        "mode.gpu.cozystack.io/vgpu": "1",
    },
}


@pytest.mark.parametrize("scenario", sorted(EXPECTED_LABELS))
def test_a_host_earns_model_profile_and_mode_labels(scenario, build, run_module):
    tree = build(scenario=scenario)
    assert (
        gpu_node_labels.gpu_labels(gpu_layout.read_host(str(tree.root)))
        == (EXPECTED_LABELS[scenario])
    )
    facts = run_module(gpu_facts, {"root": str(tree.root)})["ansible_facts"]["cozystack_gpu"]
    assert facts["node_labels"] == EXPECTED_LABELS[scenario]


def test_only_the_rules_own_labels_count_as_gpu_labels():
    assert gpu_node_labels.is_gpu_label("profile.gpu.cozystack.io/GRID_T4-8Q")
    assert not gpu_node_labels.is_gpu_label("gpu.cozystack.io/layout-state")
    assert not gpu_node_labels.is_gpu_label("kubernetes.io/hostname")


def test_the_module_reports_functions_labels_and_unknown_holds(build, run_module, kernel):
    tree = build(scenario="l40s-sriov")
    document = {"gpus": [{"address": PF, "mode": "vgpu", "vfs": {VF1: "NVIDIA L40S-24C"}}]}
    result = run_module(
        gpu_node_layout,
        {"root": str(tree.root), "layout": document, "nvidia_smi": "/nonexistent", "force": True},
        check_mode=True,
        writer=kernel(tree),
    )
    assert result["failed"] is False, result.get("msg")
    changed = [f for f in result["functions"] if f["changed"]]
    assert [(f["address"], f["before"]["devices"], f["after"]["devices"]) for f in changed] == [
        (VF1, {"nvidia.com/NVIDIA_L40S-12C": 1}, {"nvidia.com/NVIDIA_L40S-24C": 1})
    ]
    assert result["node_labels"] == {
        "model.gpu.cozystack.io/AD102GL_L40S": "1",
        "profile.gpu.cozystack.io/NVIDIA_L40S-24C": "2",
        "mode.gpu.cozystack.io/vgpu": "1",
    }
    assert result["holds"]["known"] is False
    gpu_layout_schema.parse_layout(result["layout"])  # the layout it reports is valid
