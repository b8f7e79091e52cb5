"""apply_layout (plan and apply in rounds, on a fixture tree) and the CLI the boot unit runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_apply,
    gpu_layout_plan,
    gpu_layout_predict,
)
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.layout_cases import (
    L40S_12C,
    L40S_24C,
    L40S_BARE,
    L40S_PF,
    UUID,
    vgpu_type,
)

# --- plan and apply in rounds --------------------------------------------------------


class TestApply:
    def test_vfs_are_enabled_then_profiles_written_and_a_second_run_changes_nothing(
        self, apply, build, testkit, kernel, sriov_manage
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        manage = sriov_manage(tree)
        first = apply(tree, {"gpus": [L40S_BARE]}, writer=kernel(tree), runner=manage)
        assert first.error is None and first.ok
        assert [s.action for s in first.plan.steps] == ["enable_vfs", "pending"]
        assert [d["action"] for d in first.done] == ["enable_vfs", "set_vgpu_type", "set_vgpu_type"]
        assert manage.calls == [[gpu_layout_apply.DEFAULT_SRIOV_MANAGE, "-e", L40S_PF]]
        vfs = tree.vfs_of(L40S_PF)
        assert [vgpu_type(tree.root, vf) for vf in vfs[:3]] == [L40S_24C, L40S_24C, 0]

        writer = kernel(tree)
        second = apply(tree, {"gpus": [L40S_BARE]}, writer=writer, runner=manage)
        assert second.ok and not second.changed
        assert second.plan.steps == [] and second.done == [] and writer.writes == []
        assert len(manage.calls) == 1

    def test_the_result_carries_the_host_before_and_after_with_the_vfs_the_run_created(
        self, apply, build, testkit, kernel, sriov_manage, nvidia_smi
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        smi = nvidia_smi(uuids={UUID: L40S_PF})
        document = {"gpus": [dict(L40S_BARE, address=UUID)]}
        result = apply(tree, document, runner=sriov_manage(tree), nvidia=smi)
        assert result.ok and result.gpus == [L40S_PF]
        assert result.before == {L40S_PF: {"driver": "nvidia", "num_vfs": 0, "vfs": {}}}
        vfs = tree.vfs_of(L40S_PF)
        assert set(result.after) == {L40S_PF, *vfs}
        assert result.after == gpu_layout_predict.host_summary(
            gpu_layout.read_host(str(tree.root)), [L40S_PF, *vfs]
        )
        assert result.diff == {"before": result.before, "after": result.after}

    def test_check_mode_predicts_after_and_a_refusal_leaves_it_as_before(self, apply, build):
        tree = build(scenario="l40s-sriov")
        refused = apply(tree, {"gpus": [{"address": L40S_PF, "mode": "passthrough"}]})
        assert refused.plan.refusals and refused.after == refused.before
        checked = apply(
            tree,
            {"gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C"}]},
            check_mode=True,
        )
        assert checked.after == gpu_layout_predict.predict_summary(checked.before, checked.plan)

    def test_sriov_manage_exiting_0_without_vfs_is_retried_and_judged_by_sriov_numvfs(
        self, apply, build, testkit, kernel, sriov_manage
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        manage = sriov_manage(tree, silent=2)
        slept = []
        result = apply(
            tree, {"gpus": [L40S_BARE]}, runner=manage, sleep=slept.append, retry_delay=7
        )
        assert result.ok
        assert len(manage.calls) == 3
        assert slept == [7, 7]

    def test_sriov_manage_that_never_creates_vfs_fails_after_the_retries(
        self, apply, build, testkit, sriov_manage
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        manage = sriov_manage(tree, silent=99)
        result = apply(tree, {"gpus": [L40S_BARE]}, runner=manage, retries=3)
        assert not result.ok
        assert result.error.startswith(
            "enable_vfs: 0000:41:00.0: no VFs after 3 sriov-manage -e attempts"
        )
        assert "NVRM: timeout" in result.error
        assert len(manage.calls) == 3

    @pytest.mark.parametrize("scenario", ["mixed", "l40s-sriov", "t4-mdev"])
    def test_check_mode_writes_nothing_and_runs_nothing(
        self, apply, build, scenario, kernel, sriov_manage, digest
    ):
        tree = build(scenario=scenario)
        document = {
            "mixed": {
                "gpus": [
                    {"address": "5d:00.0", "mode": "passthrough"},
                    {"address": "41:00.0", "mode": "vgpu", "profile": "NVIDIA L40S-12C"},
                    {"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q", "count": 3},
                ]
            },
            "l40s-sriov": {
                "gpus": [
                    {"address": "41:00.0", "mode": "vgpu", "vfs": {"41:00.5": "NVIDIA L40S-24C"}}
                ]
            },
            "t4-mdev": {"gpus": [{"address": "af:00.0", "mode": "vgpu", "profile": "GRID T4-8Q"}]},
        }[scenario]
        before = digest(tree.root)
        writer, manage = kernel(tree), sriov_manage(tree)
        result = apply(tree, document, check_mode=True, writer=writer, runner=manage, force=True)
        assert result.plan.steps, "the scenario must need changes for this test to mean anything"
        assert result.changed and result.done == []
        assert writer.writes == [] and manage.calls == []
        assert digest(tree.root) == before

    def test_check_mode_on_a_bare_card_reports_the_pending_profiles(
        self, apply, build, testkit, digest
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        before = digest(tree.root)
        result = apply(tree, {"gpus": [L40S_BARE]}, check_mode=True)
        assert [(s.action, s.reason) for s in result.plan.steps] == [
            ("enable_vfs", "no VFs enabled"),
            ("pending", "profiles once the VFs exist"),
        ]
        assert digest(tree.root) == before

    def test_a_vf_carrying_another_profile_is_refused_without_force(
        self, apply, build, kernel, digest
    ):
        tree = build(scenario="l40s-sriov")  # VF0 24C, VF1 12C
        vf1 = tree.vfs_of(L40S_PF)[1]
        document = {
            "gpus": [{"address": "41:00.0", "mode": "vgpu", "vfs": {vf1: "NVIDIA L40S-24C"}}]
        }
        before = digest(tree.root)
        refused = apply(tree, document)
        assert refused.plan.refusals == [
            "gpus[0] (41:00.0): VF %s carries type %d, not 'NVIDIA L40S-24C' (%d); set force to replace it"
            % (vf1, L40S_12C, L40S_24C)
        ]
        assert refused.done == [] and not refused.ok
        assert digest(tree.root) == before

        forced = apply(tree, document, force=True)
        assert forced.ok
        assert forced.done[0]["old_type_id"] == L40S_12C
        assert vgpu_type(tree.root, vf1) == L40S_24C

    def test_without_count_the_card_is_filled_and_a_full_card_refuses_other_profiles(
        self, apply, build, testkit, nvidia_smi
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia", vfs=4))
        result = apply(
            tree, {"gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-12C"}]}
        )
        assert result.ok
        assert [vgpu_type(tree.root, vf) for vf in tree.vfs_of(L40S_PF)] == [L40S_12C] * 4
        smi = nvidia_smi(supported={L40S_PF: {"NVIDIA L40S-24C": L40S_24C}})
        document = {
            "gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C", "count": 1}]
        }
        full = apply(tree, document, nvidia=smi)
        assert full.plan.refusals == [
            "gpus[0] (0000:41:00.0): count 1 needs 1 more VFs, 0 are free and {} carry another type;"
            " set force to replace them".format(", ".join(tree.vfs_of(L40S_PF)))
        ]

    def test_fill_stops_where_the_card_is_full(self, apply, build, testkit):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia", vfs=4))
        result = apply(
            tree, {"gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C"}]}
        )
        assert result.ok and result.remaining == []
        # Planned against the empty card, every VF looked free; two 24C fill 48 GB.
        assert len(result.done) == 2
        assert [s["skipped"] for s in result.skipped] == [
            "card full: NVIDIA L40S-24C no longer creatable on this VF"
        ] * 2
        assert [vgpu_type(tree.root, vf) for vf in tree.vfs_of(L40S_PF)] == [
            L40S_24C,
            L40S_24C,
            0,
            0,
        ]

    def test_count_beyond_the_vfs_is_refused(self, apply, build, testkit):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia", vfs=2))
        result = apply(tree, {"gpus": [dict(L40S_BARE, count=3)]})
        assert result.plan.refusals == [
            "gpus[0] (0000:41:00.0): count 3, but the card has only 2 VFs"
        ]

    def test_passthrough_binds_to_vfio_pci_through_driver_override(self, apply, build, kernel):
        tree = build(scenario="mixed")
        writer = kernel(tree)
        result = apply(
            tree, {"gpus": [{"address": "5d:00.0", "mode": "passthrough"}]}, writer=writer
        )
        assert result.ok
        assert tree.driver_of("0000:5d:00.0") == "vfio-pci"
        assert writer.writes == [
            ("sys/bus/pci/devices/0000:5d:00.0/driver_override", "vfio-pci"),
            ("sys/bus/pci/devices/0000:5d:00.0/driver/unbind", "0000:5d:00.0"),
            ("sys/bus/pci/drivers_probe", "0000:5d:00.0"),
        ]
        assert not apply(tree, {"gpus": [{"address": "5d:00.0", "mode": "passthrough"}]}).changed

    def test_a_bind_the_kernel_does_not_take_is_reported(self, apply, build):
        tree = build(scenario="mixed")
        result = apply(
            tree,
            {"gpus": [{"address": "5d:00.0", "mode": "passthrough"}]},
            writer=gpu_layout_apply.SysfsWriter(str(tree.root)),  # plain files: nothing binds
        )
        assert (
            result.error
            == "bind_vfio: 0000:5d:00.0: still bound to nvidia after binding to vfio-pci"
        )

    @pytest.mark.parametrize("force", [False, True])
    def test_a_gpu_with_live_vgpus_is_never_unbound(self, apply, build, force, digest):
        tree = build(scenario="l40s-sriov")
        before = digest(tree.root)
        result = apply(tree, {"gpus": [{"address": L40S_PF, "mode": "passthrough"}]}, force=force)
        assert len(result.plan.refusals) == 1
        assert "carries live vGPUs" in result.plan.refusals[0]
        assert "never unbound or reset" in result.plan.refusals[0]
        assert digest(tree.root) == before

    def test_a_vgpu_card_on_vfio_pci_goes_back_to_nvidia_only_with_force(
        self, apply, build, testkit, sriov_manage
    ):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="vfio-pci"))
        refused = apply(tree, {"gpus": [L40S_BARE]}, runner=sriov_manage(tree))
        assert "bound to vfio-pci, where a VM may hold it; set force" in refused.plan.refusals[0]
        assert tree.driver_of(L40S_PF) == "vfio-pci"
        forced = apply(tree, {"gpus": [L40S_BARE]}, runner=sriov_manage(tree), force=True)
        assert forced.ok, forced.error
        assert [d["action"] for d in forced.done] == [
            "bind_nvidia",
            "enable_vfs",
            "set_vgpu_type",
            "set_vgpu_type",
        ]
        assert tree.driver_of(L40S_PF) == "nvidia"

    def test_mdevs_are_created_with_stable_uuids(self, apply, build, testkit):
        tree = build(scenario="t4-mdev")  # 3b:00.0 has two GRID T4-4Q mdevs
        document = {
            "gpus": [{"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q", "count": 3}]
        }
        result = apply(tree, document)
        assert result.ok
        created = [d["mdev_uuid"] for d in result.done]
        assert created == [gpu_layout_plan.mdev_uuid("0000:3b:00.0", "nvidia-225", 0)]
        assert created[0] in tree.mdevs_of("0000:3b:00.0")
        assert not apply(tree, document).changed

    def test_mdevs_of_another_type_are_replaced_only_with_force(self, apply, build):
        tree = build(scenario="t4-mdev")
        document = {"gpus": [{"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-8Q"}]}
        refused = apply(tree, document)
        assert "are of another type than 'GRID T4-8Q'; set force" in refused.plan.refusals[0]
        forced = apply(tree, document, force=True)
        assert forced.ok, forced.error
        assert sorted(tree.mdevs_of("0000:3b:00.0").values()) == ["nvidia-228", "nvidia-228"]

    def test_per_vf_profiles_leave_other_vfs_alone(self, apply, build, testkit):
        tree = build(
            testkit.Gpu(
                L40S_PF, testkit.L40S, driver="nvidia", vfs=4, profiles={3: "NVIDIA L40S-12C"}
            )
        )
        vfs = tree.vfs_of(L40S_PF)
        document = {
            "gpus": [
                {
                    "address": L40S_PF,
                    "mode": "vgpu",
                    "vfs": {vfs[0]: "NVIDIA L40S-24C", vfs[1]: "NVIDIA L40S-12C"},
                }
            ]
        }
        assert apply(tree, document).ok
        assert [vgpu_type(tree.root, vf) for vf in vfs] == [L40S_24C, L40S_12C, 0, L40S_12C]


# --- the CLI the boot restore unit runs --------------------------------------------------


def _stand_in_sriov_manage(tmp_path):
    controller = os.path.abspath(
        os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "controller")
    )
    script = tmp_path / "sriov-manage"
    script.write_text(
        "#!{}\nimport sys\nsys.path.insert(0, {!r})\n"
        "from cozystack_gpu_testkit.sysfs_tree import SysfsTree\n"
        "root = {!r}\nSysfsTree.open(root).enable_vfs(sys.argv[2])\n".format(
            sys.executable, controller, str(tmp_path / "root")
        )
    )
    script.chmod(0o755)
    return str(script)


def test_the_role_installs_every_file_the_boot_unit_imports():
    """The vgpu_layout role copies gpu_layout.CODE_FILES; a missing one breaks the boot."""
    import yaml

    utils = os.path.dirname(os.path.realpath(gpu_layout.__file__))
    with open(os.path.join(utils, "..", "..", "roles", "vgpu_layout", "vars", "main.yml")) as f:
        role_vars = yaml.safe_load(f)
    assert role_vars["vgpu_layout__code_files"] == list(gpu_layout.CODE_FILES)


class TestCli:
    def test_plan_prints_json_and_writes_nothing(self, build, testkit, tmp_path, capsys, digest):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        path = tmp_path / "layout.json"
        path.write_text(json.dumps({"gpus": [L40S_BARE]}))
        before = digest(tree.root)
        assert (
            gpu_layout.main(
                ["plan", str(path), "--root", str(tree.root), "--nvidia-smi", "/nonexistent"]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert [s["action"] for s in out["plan"]["steps"]] == ["enable_vfs", "pending"]
        assert digest(tree.root) == before

    def test_an_invalid_layout_exits_2_naming_the_entry(self, build, tmp_path, capsys):
        tree = build(scenario="mixed")
        path = tmp_path / "layout.json"
        path.write_text(json.dumps({"gpus": [{"address": 1, "mode": "passthrough"}]}))
        assert gpu_layout.main(["validate", str(path), "--root", str(tree.root)]) == 2
        captured = capsys.readouterr()
        assert json.loads(captured.out)["problems"][0].startswith(
            "gpus[0] (1): address 1 looks like a GPU index"
        )
        assert "gpus[0] (1)" in captured.err

    def test_the_files_run_standalone_side_by_side(self, build, testkit, tmp_path):
        """What the boot restore unit does: python3 gpu_layout.py apply, no ansible around."""
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        libdir = tmp_path / "lib"
        libdir.mkdir()
        utils = os.path.dirname(gpu_layout.__file__)
        for name in gpu_layout.CODE_FILES:
            shutil.copy(os.path.join(utils, name), str(libdir / name))
        path = tmp_path / "layout.json"
        path.write_text(json.dumps({"gpus": [L40S_BARE]}))
        argv = [
            sys.executable,
            "-I",
            str(libdir / "gpu_layout.py"),
            "apply",
            str(path),
            "--root",
            str(tree.root),
            "--sriov-manage",
            _stand_in_sriov_manage(tmp_path),
            "--nvidia-smi",
            "/nonexistent",
            "--retry-delay",
            "0",
        ]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["ok"] is True
        vfs = tree.vfs_of(L40S_PF)
        assert [vgpu_type(tree.root, vf) for vf in vfs[:3]] == [L40S_24C, L40S_24C, 0]
        again = subprocess.run(argv, capture_output=True, text=True, check=False)
        assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False
