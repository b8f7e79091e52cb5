"""vgpu_profile: per-VF profiles, read-compare-write, force, clearing, check mode and diff."""

from __future__ import annotations

from ansible_collections.cozystack.gpu.plugins.modules import vgpu_profile

PF = "0000:41:00.0"
T24C, T12C = 1151, 1153


def args(tree, vfs, profile=None, **extra):
    data = dict(root=str(tree.root), vfs=vfs, nvidia_smi="/nonexistent", **extra)
    if profile is not None:
        data["profile"] = profile
    return data


def test_sets_free_vfs_and_a_second_run_is_unchanged(build, kernel, run_module):
    tree = build(scenario="l40s-sriov")  # VF0 24C, VF1 12C
    _vf0, vf1, vf2 = tree.vfs_of(PF)[:3]
    result = run_module(
        vgpu_profile, args(tree, [vf1, vf2], "NVIDIA L40S-12C"), diff=True, writer=kernel(tree)
    )
    assert result["failed"] is False and result["changed"] is True
    assert [s["target"] for s in result["steps"]] == [vf2]
    assert result["vfs"] == {vf1: T12C, vf2: T12C}
    assert result["diff"] == {"before": {vf1: T12C, vf2: 0}, "after": {vf1: T12C, vf2: T12C}}
    assert tree.current_vgpu_type(vf2) == T12C
    writer = kernel(tree)
    again = run_module(vgpu_profile, args(tree, [vf1, vf2], "NVIDIA L40S-12C"), writer=writer)
    assert again["changed"] is False and again["steps"] == [] and writer.writes == []


def test_a_profile_the_card_has_no_room_for_fails_without_writing(
    build, kernel, run_module, digest
):
    tree = build(scenario="l40s-sriov")  # 36 of 48 GB in use: a 24C no longer fits
    vf2 = tree.vfs_of(PF)[2]
    before = digest(tree.root)
    result = run_module(vgpu_profile, args(tree, [vf2], "NVIDIA L40S-24C"), writer=kernel(tree))
    assert result["failed"] is True
    assert result["msg"] == (
        "set_vgpu_type: %s: NVIDIA L40S-24C (%d) is not creatable on this VF (the card has no room"
        " left for it)" % (vf2, T24C)
    )
    assert digest(tree.root) == before


def test_check_mode_predicts_and_writes_nothing(build, kernel, run_module, digest):
    tree = build(scenario="l40s-sriov")
    vf2 = tree.vfs_of(PF)[2]
    before = digest(tree.root)
    writer = kernel(tree)
    result = run_module(
        vgpu_profile,
        args(tree, [vf2], "NVIDIA L40S-12C"),
        check_mode=True,
        diff=True,
        writer=writer,
    )
    assert result["changed"] is True
    assert result["diff"] == {"before": {vf2: 0}, "after": {vf2: T12C}}
    assert writer.writes == [] and digest(tree.root) == before


def test_another_profile_is_refused_unless_force(build, kernel, run_module, digest):
    tree = build(scenario="l40s-sriov")
    vf1 = tree.vfs_of(PF)[1]
    before = digest(tree.root)
    refused = run_module(vgpu_profile, args(tree, [vf1], "NVIDIA L40S-24C"), writer=kernel(tree))
    assert refused["failed"] is True
    assert refused[
        "msg"
    ] == "vfs[%s]: VF %s carries type %d, not 'NVIDIA L40S-24C' (%d); set force to replace it" % (
        vf1,
        vf1,
        T12C,
        T24C,
    )
    assert digest(tree.root) == before
    forced = run_module(
        vgpu_profile, args(tree, [vf1], "NVIDIA L40S-24C", force=True), writer=kernel(tree)
    )
    assert forced["failed"] is False and forced["vfs"] == {vf1: T24C}


def test_zero_and_an_omitted_profile_clear(build, kernel, run_module):
    tree = build(scenario="l40s-sriov")
    vf0, vf1 = tree.vfs_of(PF)[:2]
    cleared = run_module(vgpu_profile, args(tree, [vf0], "0"), writer=kernel(tree))
    assert cleared["changed"] is True and cleared["vfs"] == {vf0: 0}
    omitted = run_module(vgpu_profile, args(tree, [vf1]), writer=kernel(tree))
    assert omitted["changed"] is True and tree.current_vgpu_type(vf1) == 0


def test_an_unknown_profile_and_a_non_vf_fail_naming_them(build, run_module):
    tree = build(scenario="l40s-sriov")
    result = run_module(vgpu_profile, args(tree, ["41:00.0", "41:00.6"], "NVIDIA L40S-5C"))
    assert result["failed"] is True
    assert (
        result["problems"][0]
        == "vfs[41:00.0]: 0000:41:00.0 is not an SR-IOV vGPU VF (no physfn or nvidia/)"
    )
    assert result["problems"][1].startswith(
        "vfs[41:00.6]: profile 'NVIDIA L40S-5C' is not a vGPU type of card 0000:41:00.0"
    )


def test_a_write_the_driver_refuses_fails_the_module(build, run_module, monkeypatch):
    tree = build(scenario="l40s-sriov")
    vf2 = tree.vfs_of(PF)[2]
    # Plain files and a driver that never takes the type: read-back catches it.
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_layout_apply

    class Deaf(gpu_layout_apply.SysfsWriter):
        def write(self, path, value):
            return None

    result = run_module(
        vgpu_profile, args(tree, [vf2], "NVIDIA L40S-12C"), writer=Deaf(str(tree.root))
    )
    assert result["failed"] is True
    assert result["msg"] == "set_vgpu_type: %s: current_vgpu_type reads 0 after writing %d" % (
        vf2,
        T12C,
    )
