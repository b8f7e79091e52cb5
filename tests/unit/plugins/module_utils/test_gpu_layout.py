"""The node layout: schema, validation against a host, plan, apply and the standalone CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_layout

L40S_PF = "0000:41:00.0"
L40S_24C = 1151  # type IDs of the fixture's L40S catalogue
L40S_12C = 1153
UUID = "GPU-5e8b1c0a-1f2e-4d3c-9b8a-7f6e5d4c3b2a"


def problems_of(document):
    with pytest.raises(gpu_layout.LayoutError) as caught:
        gpu_layout.parse_layout(document)
    return caught.value.problems


def resolve_problems(document, inventory, nvidia=None):
    with pytest.raises(gpu_layout.LayoutError) as caught:
        gpu_layout.resolve_layout(gpu_layout.parse_layout(document), inventory, nvidia)
    return caught.value.problems


def vgpu_type(root, address):
    with open(
        os.path.join(str(root), "sys/bus/pci/devices", address, "nvidia/current_vgpu_type")
    ) as f:
        return int(f.read())


def layout(*gpus, **extra):
    return gpu_layout.parse_layout(dict(gpus=list(gpus), **extra))


# --- schema ------------------------------------------------------------------------------


class TestSchema:
    @pytest.mark.parametrize("index", [0, 3, "1", " 2 "])
    def test_an_index_instead_of_an_address_is_refused(self, index):
        problems = problems_of({"gpus": [{"address": index, "mode": "passthrough"}]})
        assert len(problems) == 1
        assert problems[0].startswith("gpus[0] (")
        assert "looks like a GPU index" in problems[0]
        assert "PCI address" in problems[0]

    def test_a_duplicate_is_found_after_the_domain_is_canonicalised(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "01:00.0", "mode": "passthrough"},
                    {"address": "0000:01:00.0", "mode": "passthrough"},
                ]
            }
        )
        assert problems == [
            "gpus[1] (0000:01:00.0): duplicate of gpus[0] (01:00.0) (both are 0000:01:00.0)"
        ]

    def test_nvidia_smis_eight_digit_domain_is_the_same_gpu(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "00000000:41:00.0", "mode": "passthrough"},
                    {"address": "41:00.0", "mode": "passthrough"},
                ]
            }
        )
        assert "duplicate of gpus[0] (00000000:41:00.0)" in problems[0]

    def test_gpus_in_other_pci_domains_are_different_gpus(self):
        parsed = layout(
            {"address": "0000:41:00.0", "mode": "passthrough"},
            {"address": "0001:41:00.0", "mode": "passthrough"},
        )
        assert [g.address for g in parsed.gpus] == ["0000:41:00.0", "0001:41:00.0"]

    @pytest.mark.parametrize(
        "key,value",
        [("profile", "NVIDIA L40S-24C"), ("count", 2), ("vfs", {"41:00.4": "NVIDIA L40S-24C"})],
    )
    def test_a_profile_for_a_passthrough_gpu_is_refused(self, key, value):
        problems = problems_of(
            {"gpus": [{"address": "41:00.0", "mode": "passthrough", key: value}]}
        )
        assert problems == [
            f"gpus[0] (41:00.0): {key} is set for a passthrough GPU; a passthrough GPU goes to a VM"
            " whole and carries no vGPU profile"
        ]

    def test_a_gpu_uuid_is_accepted_and_lower_cased(self):
        parsed = layout({"address": "GPU-" + UUID[4:].upper(), "mode": "passthrough"})
        assert parsed.gpus[0].address == UUID

    def test_a_type_id_instead_of_a_profile_name_is_refused(self):
        problems = problems_of({"gpus": [{"address": "41:00.0", "mode": "vgpu", "profile": 1151}]})
        assert "is a type ID; name the profile" in problems[0]
        assert problems[0].startswith("gpus[0] (41:00.0)")

    @pytest.mark.parametrize(
        "entry,expected",
        [
            ({"address": "41:00.0", "mode": "vgpu"}, "exactly one of profile"),
            (
                {"address": "41:00.0", "mode": "vgpu", "profile": "A", "vfs": {"41:00.4": "A"}},
                "exactly one of profile",
            ),
            ({"address": "41:00.0", "mode": "gpu"}, "mode must be passthrough or vgpu"),
            ({"address": "41:00.0", "mode": "vgpu", "profile": "A", "count": 0}, "count must be"),
            (
                {"address": "41:00.0", "mode": "vgpu", "profile": "A", "count": True},
                "count must be",
            ),
            ({"address": "41:00.0", "mode": "passthrough", "prof1le": "A"}, "unknown keys prof1le"),
            ({"address": "slot-3", "mode": "passthrough"}, "neither a PCI address"),
            ({"mode": "passthrough"}, "address is required"),
            ({"address": "41:00.0", "mode": "vgpu", "vfs": {"7": "A"}}, "vfs[7]"),
        ],
    )
    def test_malformed_entries_are_refused_by_name(self, entry, expected):
        problems = problems_of({"gpus": [entry]})
        assert any(expected in p for p in problems), problems
        assert all(p.startswith("gpus[0]") for p in problems)

    def test_every_bad_entry_is_reported_not_just_the_first(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": 0, "mode": "passthrough"},
                    {"address": "18:00.0", "mode": "passthrough"},
                    {"address": "2a:00.0", "mode": "passthrough", "profile": "X"},
                ]
            }
        )
        assert [p.split(" ", 1)[0] for p in problems] == ["gpus[0]", "gpus[2]"]

    def test_a_vf_listed_twice_is_refused(self):
        problems = problems_of(
            {
                "gpus": [
                    {"address": "41:00.0", "mode": "vgpu", "vfs": {"41:00.4": "A"}},
                    {"address": "81:00.0", "mode": "vgpu", "vfs": {"0000:41:00.4": "B"}},
                ]
            }
        )
        assert "duplicate of gpus[0] (41:00.0): vfs[41:00.4]" in problems[0]

    def test_top_level_shape_and_unknown_keys(self):
        assert problems_of([]) == ["layout: must be a mapping with a 'gpus' list"]
        assert problems_of({"gpus": {}, "node": "x"}) == [
            "layout: unknown keys node (known: name, gpus)",
            "layout: gpus must be a list",
        ]

    def test_a_valid_layout_round_trips_canonical(self):
        parsed = layout(
            {"address": "18:00.0", "mode": "passthrough"},
            {"address": "41:00.0", "mode": "vgpu", "profile": " NVIDIA L40S-24C ", "count": 2},
            {"address": "81:00.0", "mode": "vgpu", "vfs": {"81:00.5": "B", "81:00.4": "A"}},
            name="mixed",
        )
        assert parsed.to_dict() == {
            "name": "mixed",
            "gpus": [
                {"address": "0000:18:00.0", "mode": "passthrough"},
                {
                    "address": "0000:41:00.0",
                    "mode": "vgpu",
                    "profile": "NVIDIA L40S-24C",
                    "count": 2,
                },
                {
                    "address": "0000:81:00.0",
                    "mode": "vgpu",
                    "vfs": {"0000:81:00.4": "A", "0000:81:00.5": "B"},
                },
            ],
        }

    def test_layout_files_are_json_or_yaml(self, tmp_path):
        (tmp_path / "l.json").write_text(
            json.dumps({"gpus": [{"address": "18:00.0", "mode": "passthrough"}]})
        )
        (tmp_path / "l.yaml").write_text("gpus:\n  - address: '18:00.0'\n    mode: passthrough\n")
        for name in ("l.json", "l.yaml"):
            parsed = gpu_layout.parse_layout(gpu_layout.load_layout_file(str(tmp_path / name)))
            assert parsed.gpus[0].address == "0000:18:00.0"


# --- against the host --------------------------------------------------------------------


class TestResolve:
    def test_an_unknown_profile_on_that_card_is_refused(self, build):
        tree = build(scenario="mixed")
        problems = resolve_problems(
            {"gpus": [{"address": "41:00.0", "mode": "vgpu", "profile": "GRID T4-4Q"}]},
            gpu_layout.read_host(str(tree.root)),
        )
        # GRID T4-4Q exists on this host, on the T4: names resolve per card.
        assert len(problems) == 1
        assert problems[0].startswith(
            "gpus[0] (41:00.0): profile 'GRID T4-4Q' is not a vGPU type of this card"
        )
        assert "NVIDIA L40S-24C" in problems[0]

    def test_profile_names_resolve_to_the_cards_own_type_ids(self, build):
        tree = build(scenario="mixed")
        resolved = gpu_layout.resolve_layout(
            layout(
                {"address": "41:00.0", "mode": "vgpu", "profile": "NVIDIA L40S-24C"},
                {"address": "3b:00.0", "mode": "vgpu", "profile": "GRID T4-4Q"},
            ),
            gpu_layout.read_host(str(tree.root)),
        )
        assert [t.types for t in resolved.targets] == [
            {"NVIDIA L40S-24C": L40S_24C},
            {"GRID T4-4Q": "nvidia-225"},
        ]

    def test_a_vf_of_another_card_is_refused(self, build, testkit):
        tree = build(
            testkit.Gpu("0000:41:00.0", testkit.L40S, driver="nvidia", vfs=4),
            testkit.Gpu("0000:81:00.0", testkit.L40S, driver="nvidia", vfs=4),
        )
        other_vf = testkit.vf_address("0000:81:00.0", 1)
        problems = resolve_problems(
            {
                "gpus": [
                    {"address": "41:00.0", "mode": "vgpu", "vfs": {other_vf: "NVIDIA L40S-24C"}}
                ]
            },
            gpu_layout.read_host(str(tree.root)),
        )
        assert problems == [
            f"gpus[0] (41:00.0): vfs[{other_vf}] is a VF of 0000:81:00.0, not of this GPU (0000:41:00.0)"
        ]

    def test_a_vf_declared_as_a_gpu_is_refused(self, build):
        tree = build(scenario="l40s-sriov")
        problems = resolve_problems(
            {"gpus": [{"address": "41:00.5", "mode": "passthrough"}]},
            gpu_layout.read_host(str(tree.root)),
        )
        assert problems == [
            "gpus[0] (41:00.5): 0000:41:00.5 is a VF of 0000:41:00.0; declare the card by its"
            " physical function and its VFs under vfs"
        ]

    def test_a_gpu_that_is_not_there_is_refused(self, build):
        tree = build(scenario="l40s-sriov")
        problems = resolve_problems(
            {"gpus": [{"address": "c1:00.0", "mode": "passthrough"}]},
            gpu_layout.read_host(str(tree.root)),
        )
        assert problems == ["gpus[0] (c1:00.0): no NVIDIA GPU at 0000:c1:00.0 on this host"]

    def test_vgpu_on_a_card_without_sriov_or_mdev_is_refused(self, build):
        tree = build(scenario="mixed")
        problems = resolve_problems(
            {"gpus": [{"address": "5d:00.0", "mode": "vgpu", "profile": "NVIDIA H100-80C"}]},
            gpu_layout.read_host(str(tree.root)),
        )
        assert "offers neither SR-IOV VFs nor mdev types" in problems[0]

    def test_a_gpu_uuid_resolves_through_nvidia_smi(self, build, nvidia_smi):
        tree = build(scenario="l40s-sriov")
        resolved = gpu_layout.resolve_layout(
            layout({"address": UUID, "mode": "vgpu", "profile": "NVIDIA L40S-24C"}),
            gpu_layout.read_host(str(tree.root)),
            nvidia_smi(uuids={UUID: L40S_PF}),
        )
        assert resolved.targets[0].address == L40S_PF

    def test_an_unknown_uuid_and_a_uuid_duplicating_an_address_are_refused(self, build, nvidia_smi):
        tree = build(scenario="l40s-sriov")
        other = "GPU-00000000-0000-0000-0000-000000000001"
        problems = resolve_problems(
            {
                "gpus": [
                    {"address": "41:00.0", "mode": "vgpu", "profile": "NVIDIA L40S-24C"},
                    {"address": UUID, "mode": "vgpu", "profile": "NVIDIA L40S-24C"},
                    {"address": other, "mode": "passthrough"},
                ]
            },
            gpu_layout.read_host(str(tree.root)),
            nvidia_smi(uuids={UUID: L40S_PF}),
        )
        assert problems == [
            f"gpus[1] ({UUID}): duplicate of gpus[0] (41:00.0) (both are {L40S_PF})",
            f"gpus[2] ({other}): no GPU with this UUID on this host (nvidia-smi)",
        ]

    def test_a_full_card_resolves_names_through_nvidia_smi(self, apply, build, nvidia_smi):
        tree = build(scenario="l40s-full")
        inventory = gpu_layout.read_host(str(tree.root))
        document = {
            "gpus": [{"address": "41:00.0", "mode": "vgpu", "vfs": {"41:00.5": "NVIDIA L40S-12C"}}]
        }
        assert (
            "not a vGPU type of this card (offered: none)"
            in resolve_problems(document, inventory)[0]
        )
        smi = nvidia_smi(supported={L40S_PF: {"NVIDIA L40S-12C": L40S_12C}})
        resolved = gpu_layout.resolve_layout(gpu_layout.parse_layout(document), inventory, smi)
        assert smi.asked == [L40S_PF]
        # The VF already carries 12C: nothing to do, even though the card lists no types.
        assert gpu_layout.plan_layout(resolved, inventory).steps == []


# --- plan and apply ----------------------------------------------------------------------


@pytest.fixture
def apply(kernel):
    """apply_layout on a fixture tree, the kernel played by KernelWriter, no real sleeping."""

    def _apply(tree, document, **kwargs):
        kwargs.setdefault("writer", kernel(tree))
        kwargs.setdefault("sleep", lambda seconds: None)
        return gpu_layout.apply_layout(gpu_layout.parse_layout(document), str(tree.root), **kwargs)

    return _apply


L40S_BARE = {"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C", "count": 2}


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
        assert manage.calls == [[gpu_layout.DEFAULT_SRIOV_MANAGE, "-e", L40S_PF]]
        vfs = tree.vfs_of(L40S_PF)
        assert [vgpu_type(tree.root, vf) for vf in vfs[:3]] == [L40S_24C, L40S_24C, 0]

        writer = kernel(tree)
        second = apply(tree, {"gpus": [L40S_BARE]}, writer=writer, runner=manage)
        assert second.ok and not second.changed
        assert second.plan.steps == [] and second.done == [] and writer.writes == []
        assert len(manage.calls) == 1

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
            writer=gpu_layout.SysfsWriter(str(tree.root)),  # plain files: nothing binds
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
        assert created == [gpu_layout.mdev_uuid("0000:3b:00.0", "nvidia-225", 0)]
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


class TestVfProfiles:
    def test_read_compare_write_and_force(self, build):
        tree = build(scenario="l40s-sriov")
        inventory = gpu_layout.read_host(str(tree.root))
        vf0, vf1, vf2 = tree.vfs_of(L40S_PF)[:3]
        plan = gpu_layout.plan_vf_profiles(inventory, [vf0, vf2], "NVIDIA L40S-24C")
        assert [(s.action, s.target, s.type_id) for s in plan.steps] == [
            ("set_vgpu_type", vf2, L40S_24C)
        ]
        refused = gpu_layout.plan_vf_profiles(inventory, [vf1], "NVIDIA L40S-24C")
        assert refused.steps == [] and "set force to replace it" in refused.refusals[0]
        forced = gpu_layout.plan_vf_profiles(inventory, [vf1], "NVIDIA L40S-24C", force=True)
        assert [(s.action, s.old_type_id) for s in forced.steps] == [("set_vgpu_type", L40S_12C)]

    @pytest.mark.parametrize("profile", [None, "0", ""])
    def test_zero_or_no_profile_clears_without_force(self, build, profile):
        tree = build(scenario="l40s-sriov")
        vf0, vf1, vf2 = tree.vfs_of(L40S_PF)[:3]
        plan = gpu_layout.plan_vf_profiles(
            gpu_layout.read_host(str(tree.root)), [vf0, vf1, vf2], profile
        )
        assert [(s.action, s.target) for s in plan.steps] == [
            ("clear_vgpu_type", vf0),
            ("clear_vgpu_type", vf1),
        ]
        assert plan.refusals == []

    def test_bad_addresses_and_unknown_profiles_are_named(self, build):
        tree = build(scenario="l40s-sriov")
        with pytest.raises(gpu_layout.LayoutError) as caught:
            gpu_layout.plan_vf_profiles(
                gpu_layout.read_host(str(tree.root)),
                [L40S_PF, "41:00.4", "0000:41:00.4", "c1:00.4", "2"],
                "NVIDIA L40S-7C",
            )
        assert caught.value.problems == [
            "vfs[0000:41:00.0]: 0000:41:00.0 is not an SR-IOV vGPU VF (no physfn or nvidia/)",
            "vfs[41:00.4]: profile 'NVIDIA L40S-7C' is not a vGPU type of card 0000:41:00.0 (offered: "
            "NVIDIA L40S-12C, NVIDIA L40S-1C, NVIDIA L40S-24C, NVIDIA L40S-2C, NVIDIA L40S-3C,"
            " NVIDIA L40S-4C, NVIDIA L40S-6C, NVIDIA L40S-8C)",
            "vfs[0000:41:00.4]: listed twice (both are 0000:41:00.4)",
            "vfs[c1:00.4]: no NVIDIA GPU function at 0000:c1:00.4 on this host",
            "vfs[2]: VF address '2' looks like a GPU index; indices change when devices are"
            " re-enumerated, so name the GPU by PCI address (0000:41:00.0) or GPU-<uuid>",
        ]


class TestSummaries:
    def test_predicted_summary_matches_what_apply_produces(self, apply, build, testkit):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia", vfs=4))
        document = {"gpus": [dict(L40S_BARE)]}
        inventory = gpu_layout.read_host(str(tree.root))
        addresses = [L40S_PF]
        plan = gpu_layout.plan_layout(
            gpu_layout.resolve_layout(gpu_layout.parse_layout(document), inventory), inventory
        )
        predicted = gpu_layout.predict_summary(gpu_layout.host_summary(inventory, addresses), plan)
        assert apply(tree, document).ok
        assert predicted == gpu_layout.host_summary(gpu_layout.read_host(str(tree.root)), addresses)


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

    def test_the_file_runs_standalone_next_to_gpu_sysfs(self, build, testkit, tmp_path):
        """What the boot restore unit does: python3 gpu_layout.py apply, no ansible around."""
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="nvidia"))
        libdir = tmp_path / "lib"
        libdir.mkdir()
        utils = os.path.dirname(gpu_layout.__file__)
        for name in ("gpu_layout.py", "gpu_sysfs.py"):
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
