"""The layout against a host: entries matched to GPUs, names to type IDs, and the plan."""

from __future__ import annotations

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_plan,
    gpu_layout_predict,
    gpu_layout_resolve,
    gpu_layout_schema,
)
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.layout_cases import (
    L40S_12C,
    L40S_24C,
    L40S_BARE,
    L40S_PF,
    UUID,
)


def resolve_problems(document, inventory, nvidia=None):
    with pytest.raises(gpu_layout_schema.LayoutError) as caught:
        gpu_layout_resolve.resolve_layout(
            gpu_layout_schema.parse_layout(document), inventory, nvidia
        )
    return caught.value.problems


def layout(*gpus, **extra):
    return gpu_layout_schema.parse_layout(dict(gpus=list(gpus), **extra))


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
        resolved = gpu_layout_resolve.resolve_layout(
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
        resolved = gpu_layout_resolve.resolve_layout(
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
        resolved = gpu_layout_resolve.resolve_layout(
            gpu_layout_schema.parse_layout(document), inventory, smi
        )
        assert smi.asked == [L40S_PF]
        # The VF already carries 12C: nothing to do, even though the card lists no types.
        assert gpu_layout_plan.plan_layout(resolved, inventory).steps == []


class TestVfProfiles:
    def test_read_compare_write_and_force(self, build):
        tree = build(scenario="l40s-sriov")
        inventory = gpu_layout.read_host(str(tree.root))
        vf0, vf1, vf2 = tree.vfs_of(L40S_PF)[:3]
        plan = gpu_layout_plan.plan_vf_profiles(inventory, [vf0, vf2], "NVIDIA L40S-24C")
        assert [(s.action, s.target, s.type_id) for s in plan.steps] == [
            ("set_vgpu_type", vf2, L40S_24C)
        ]
        refused = gpu_layout_plan.plan_vf_profiles(inventory, [vf1], "NVIDIA L40S-24C")
        assert refused.steps == [] and "set force to replace it" in refused.refusals[0]
        forced = gpu_layout_plan.plan_vf_profiles(inventory, [vf1], "NVIDIA L40S-24C", force=True)
        assert [(s.action, s.old_type_id) for s in forced.steps] == [("set_vgpu_type", L40S_12C)]

    @pytest.mark.parametrize("profile", [None, "0", ""])
    def test_zero_or_no_profile_clears_without_force(self, build, profile):
        tree = build(scenario="l40s-sriov")
        vf0, vf1, vf2 = tree.vfs_of(L40S_PF)[:3]
        plan = gpu_layout_plan.plan_vf_profiles(
            gpu_layout.read_host(str(tree.root)), [vf0, vf1, vf2], profile
        )
        assert [(s.action, s.target) for s in plan.steps] == [
            ("clear_vgpu_type", vf0),
            ("clear_vgpu_type", vf1),
        ]
        assert plan.refusals == []

    def test_bad_addresses_and_unknown_profiles_are_named(self, build):
        tree = build(scenario="l40s-sriov")
        with pytest.raises(gpu_layout_schema.LayoutError) as caught:
            gpu_layout_plan.plan_vf_profiles(
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
        plan = gpu_layout_plan.plan_layout(
            gpu_layout_resolve.resolve_layout(gpu_layout_schema.parse_layout(document), inventory),
            inventory,
        )
        predicted = gpu_layout_predict.predict_summary(
            gpu_layout_predict.host_summary(inventory, addresses), plan
        )
        assert apply(tree, document).ok
        assert predicted == gpu_layout_predict.host_summary(
            gpu_layout.read_host(str(tree.root)), addresses
        )
