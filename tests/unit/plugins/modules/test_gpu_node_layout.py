"""gpu_node_layout: validate, plan (check mode writes nothing), apply, idempotence, diff."""

from __future__ import annotations

import json

from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
from ansible_collections.cozystack.gpu.plugins.modules import gpu_node_layout

PF = "0000:41:00.0"
T24C = 1151
LAYOUT = {
    "name": "mixed",
    "gpus": [
        {"address": "5d:00.0", "mode": "passthrough"},
        {"address": "41:00.0", "mode": "vgpu", "profile": "NVIDIA L40S-12C"},
        {"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q", "count": 2},
    ],
}


def args(tree, layout=None, **extra):
    data = dict(root=str(tree.root), nvidia_smi="/nonexistent", retry_delay=0, **extra)
    if layout is not None:
        data["layout"] = layout
    return data


def test_check_mode_returns_the_plan_and_writes_nothing(
    build, kernel, sriov_manage, run_module, digest
):
    tree = build(scenario="mixed")
    before = digest(tree.root)
    writer, manage = kernel(tree), sriov_manage(tree)
    result = run_module(
        gpu_node_layout,
        args(tree, LAYOUT),
        check_mode=True,
        diff=True,
        writer=writer,
        runner=manage,
    )
    assert result["failed"] is False and result["changed"] is True
    assert [s["action"] for s in result["plan"]["steps"]] == [
        "bind_vfio",
        "set_vgpu_type",
        "set_vgpu_type",
        "set_vgpu_type",
        "create_mdev",
    ]
    assert result["done"] == []
    assert result["diff"]["before"]["0000:5d:00.0"]["driver"] == "nvidia"
    assert result["diff"]["after"]["0000:5d:00.0"]["driver"] == "vfio-pci"
    assert writer.writes == [] and manage.calls == []
    assert digest(tree.root) == before


def test_apply_then_a_second_run_changes_nothing(build, kernel, sriov_manage, run_module):
    tree = build(scenario="mixed")
    first = run_module(
        gpu_node_layout,
        args(tree, LAYOUT),
        diff=True,
        writer=kernel(tree),
        runner=sriov_manage(tree),
    )
    assert first["failed"] is False, first["msg"] if first["failed"] else ""
    assert first["changed"] is True and first["remaining"] == []
    assert tree.driver_of("0000:5d:00.0") == "vfio-pci"
    assert [tree.current_vgpu_type(vf) for vf in tree.vfs_of(PF)] == [1153] * 4
    assert len(tree.mdevs_of("0000:3b:00.0")) == 2
    assert first["diff"]["after"]["0000:41:00.0"]["vfs"] == {vf: 1153 for vf in tree.vfs_of(PF)}
    writer = kernel(tree)
    second = run_module(
        gpu_node_layout, args(tree, LAYOUT), writer=writer, runner=sriov_manage(tree)
    )
    assert second["changed"] is False and second["plan"]["steps"] == [] and writer.writes == []


def test_a_bare_card_gets_vfs_by_sriov_manage_and_then_profiles(
    build, testkit, kernel, sriov_manage, run_module
):
    tree = build(testkit.Gpu(PF, testkit.L40S, driver="nvidia"))
    layout = {"gpus": [{"address": PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C", "count": 2}]}
    checked = run_module(
        gpu_node_layout, args(tree, layout), check_mode=True, diff=True, writer=kernel(tree)
    )
    assert [s["action"] for s in checked["plan"]["steps"]] == ["enable_vfs", "pending"]
    assert checked["diff"]["after"][PF]["pending"] == "profiles once the VFs exist"
    manage = sriov_manage(tree, silent=1)
    result = run_module(gpu_node_layout, args(tree, layout), writer=kernel(tree), runner=manage)
    assert result["failed"] is False and len(manage.calls) == 2
    assert [tree.current_vgpu_type(vf) for vf in tree.vfs_of(PF)[:3]] == [T24C, T24C, 0]


def test_layout_errors_fail_naming_every_bad_entry(build, run_module):
    tree = build(scenario="mixed")
    layout = {
        "gpus": [
            {"address": 0, "mode": "passthrough"},
            {"address": "18:00.0", "mode": "passthrough", "profile": "NVIDIA H100-80C"},
            {"address": "0000:2a:00.0", "mode": "passthrough"},
            {"address": "2a:00.0", "mode": "passthrough"},
        ]
    }
    result = run_module(gpu_node_layout, args(tree, layout), use_main=True)
    assert result["failed"] is True
    assert [p.split(":", 1)[0] for p in result["problems"]] == [
        "gpus[0] (0)",
        "gpus[1] (18",
        "gpus[3] (2a",
    ]
    assert "duplicate of gpus[2] (0000:2a:00.0)" in result["problems"][2]


def test_refusals_fail_the_module_and_change_nothing(build, kernel, run_module, digest):
    tree = build(scenario="l40s-sriov")
    before = digest(tree.root)
    layout = {"gpus": [{"address": PF, "mode": "passthrough"}]}
    result = run_module(gpu_node_layout, args(tree, layout, force=True), writer=kernel(tree))
    assert result["failed"] is True and "carries live vGPUs" in result["msg"]
    assert result["done"] == []
    assert digest(tree.root) == before


def test_a_layout_file_on_the_host(build, kernel, run_module, tmp_path):
    tree = build(scenario="mixed")
    path = tmp_path / "layout.json"
    path.write_text(json.dumps({"gpus": [{"address": "5d:00.0", "mode": "passthrough"}]}))
    result = run_module(gpu_node_layout, args(tree, src=str(path)), writer=kernel(tree))
    assert result["failed"] is False and result["changed"] is True
    assert result["layout"] == {"gpus": [{"address": "0000:5d:00.0", "mode": "passthrough"}]}


def test_layout_and_src_are_mutually_exclusive(build, run_module, tmp_path):
    tree = build(scenario="mixed")
    result = run_module(gpu_node_layout, args(tree, LAYOUT, src=str(tmp_path / "x")), use_main=True)
    assert result["failed"] is True and "mutually exclusive" in result["msg"]


def test_a_missing_layout_file_fails_cleanly(build, run_module, tmp_path):
    tree = build(scenario="mixed")
    result = run_module(gpu_node_layout, args(tree, src=str(tmp_path / "missing.json")))
    assert result["failed"] is True and "missing.json" in result["msg"]


def test_the_module_reports_what_apply_read_without_reading_or_resolving_again(
    build, kernel, sriov_manage, nvidia_smi, run_module, monkeypatch
):
    tree = build(scenario="mixed")
    reads = []
    read_inventory = gpu_sysfs.read_inventory

    def counted(*args, **kwargs):
        reads.append(args)
        return read_inventory(*args, **kwargs)

    monkeypatch.setattr(gpu_sysfs, "read_inventory", counted)
    uuid = "GPU-5e8b1c0a-1f2e-4d3c-9b8a-7f6e5d4c3b2a"
    smi = nvidia_smi(uuids={uuid: "0000:5d:00.0"})
    layout = {"gpus": [{"address": uuid, "mode": "passthrough"}, *LAYOUT["gpus"][1:]]}
    checked = run_module(
        gpu_node_layout, args(tree, layout), check_mode=True, diff=True, nvidia=smi
    )
    assert checked["failed"] is False
    assert checked["diff"]["after"]["0000:5d:00.0"]["driver"] == "vfio-pci"
    # One read for the plan and the diff, one lookup per UUID.
    assert len(reads) == 1 and smi.looked_up == [uuid]

    reads.clear()
    smi.looked_up.clear()
    applied = run_module(
        gpu_node_layout,
        args(tree, layout),
        diff=True,
        writer=kernel(tree),
        runner=sriov_manage(tree),
        nvidia=smi,
    )
    assert applied["failed"] is False and applied["changed"] is True
    assert applied["diff"]["before"]["0000:5d:00.0"]["driver"] == "nvidia"
    assert applied["diff"]["after"]["0000:5d:00.0"]["driver"] == "vfio-pci"
    # apply_layout reads the host to plan and once more to confirm; the module adds nothing.
    assert len(reads) == 2 and smi.looked_up == [uuid, uuid]
