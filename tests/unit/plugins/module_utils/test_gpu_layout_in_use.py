"""Never under a running VM: what sysfs shows a VM uses is not reconfigured without force.

A VM's QEMU holds the VFIO device node of each function (or mdev) it was given: the node is
the one the function's iommu_group names (/dev/vfio/<group>), and a function on vfio-pci
reads ``enable`` 1 while it is open. The fixture's ``start_vm`` lays that out as a host
shows it (``proc/<pid>/fd`` links and the QEMU command line), ``stop_vm`` takes it away.
"""

from __future__ import annotations

from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_plan,
    gpu_layout_resolve,
    gpu_layout_schema,
)
from ansible_collections.cozystack.gpu.tests.unit.plugins.module_utils.layout_cases import (
    L40S_12C,
    L40S_24C,
    L40S_PF,
    vgpu_type,
)

VF0, VF1, VF2 = "0000:41:00.4", "0000:41:00.5", "0000:41:00.6"
T4 = "0000:3b:00.0"
H100 = "0000:18:00.0"


def plan(tree, document, force=False, drained=False):
    inventory = gpu_layout.read_host(str(tree.root))
    users = gpu_layout.read_users(str(tree.root), inventory)
    resolved = gpu_layout_resolve.resolve_layout(
        gpu_layout_schema.parse_layout(document), inventory
    )
    return gpu_layout_plan.plan_layout(resolved, inventory, force, in_use=users, drained=drained)


def l40s(count, profile="NVIDIA L40S-24C"):
    return {"gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": profile, "count": count}]}


# VF1 of the l40s-sriov scenario carries NVIDIA L40S-12C; this asks for 24C there.
VF1_24C = {"gpus": [{"address": L40S_PF, "mode": "vgpu", "vfs": {VF1: "NVIDIA L40S-24C"}}]}


class TestWhoUsesWhat:
    def test_a_vm_holding_a_vf_a_gpu_and_an_mdev_is_named_for_each(self, build):
        tree = build(scenario="mixed")
        uuid = next(iter(tree.mdevs_of(T4)))
        tree.start_vm("tenant-a_vm-1", [VF0, H100, uuid])
        users = gpu_layout.read_users(str(tree.root), gpu_layout.read_host(str(tree.root)))
        named = ["VM tenant-a_vm-1 (pid 4242)"]
        assert users == {VF0: named, H100: named, uuid: named}

    def test_nothing_is_in_use_once_the_vm_stops(self, build):
        tree = build(scenario="mixed")
        tree.start_vm("tenant-a_vm-1", [VF0, H100])
        tree.stop_vm()
        assert gpu_layout.read_users(str(tree.root), gpu_layout.read_host(str(tree.root))) == {}

    def test_an_open_vfio_function_counts_even_when_its_process_is_not_seen(self, build):
        tree = build(scenario="mixed")
        tree.write(H100, "enable", "1\n")  # sysfs alone: vfio-pci enabled it at open
        users = gpu_layout.read_users(str(tree.root), gpu_layout.read_host(str(tree.root)))
        assert list(users) == [H100] and "enable is 1" in users[H100][0]


class TestRefusals:
    def test_replacing_a_vf_a_vm_uses_is_refused_naming_the_vf_and_the_vm(self, build):
        tree = build(scenario="l40s-sriov")  # VF0 24C, VF1 12C
        tree.start_vm("tenant-a_vm-1", [VF1])
        refused = plan(tree, VF1_24C, drained=True)
        assert refused.steps == []
        (message,) = refused.refusals
        assert message.startswith(f"gpus[0] ({L40S_PF}): replacing type {L40S_12C}:")
        assert f"{VF1} (used by VM tenant-a_vm-1 (pid 4242))" in message
        assert "never reset or reconfigured" in message and "set force" in message

    def test_force_replaces_it_all_the_same(self, build):
        tree = build(scenario="l40s-sriov")
        tree.start_vm("tenant-a_vm-1", [VF1])
        forced = plan(tree, VF1_24C, force=True)
        assert forced.refusals == []
        assert [(s.action, s.target, s.type_id) for s in forced.steps] == [
            ("set_vgpu_type", VF1, L40S_24C)
        ]

    def test_after_a_drain_a_vf_no_vm_uses_is_replaced_without_force(self, build):
        tree = build(scenario="l40s-sriov")
        assert plan(tree, VF1_24C).refusals  # not knowing the claims: force is needed
        drained = plan(tree, VF1_24C, drained=True)
        assert drained.refusals == []
        assert [(s.target, s.old_type_id, s.type_id) for s in drained.steps] == [
            (VF1, L40S_12C, L40S_24C)
        ]

    def test_removing_a_vgpu_beyond_count_under_a_vm_is_refused(self, build, testkit):
        tree = build(
            testkit.Gpu(
                L40S_PF,
                testkit.L40S,
                driver="nvidia",
                vfs=4,
                profiles={0: "NVIDIA L40S-12C", 1: "NVIDIA L40S-12C"},
            )
        )
        assert [s.target for s in plan(tree, l40s(1, "NVIDIA L40S-12C"), drained=True).steps] == [
            VF1
        ]
        tree.start_vm("tenant-a_vm-2", [VF1])
        refused = plan(tree, l40s(1, "NVIDIA L40S-12C"), drained=True)
        assert refused.steps == []
        assert f"removing the vGPU of {VF1} (used by VM tenant-a_vm-2" in refused.refusals[0]

    def test_an_mdev_a_vm_uses_is_not_removed(self, build):
        tree = build(scenario="mixed")
        uuid = next(iter(tree.mdevs_of(T4)))
        tree.start_vm("tenant-b_vm-9", [uuid])
        document = {"gpus": [{"address": T4, "mode": "vgpu", "profile": "GRID T4-8Q"}]}
        refused = plan(tree, document, drained=True)
        assert any(uuid in r and "tenant-b_vm-9" in r for r in refused.refusals)
        assert not any(s.action == "remove_mdev" for s in refused.steps)

    def test_a_passthrough_gpu_a_vm_holds_is_not_rebound_for_vgpu(self, build, testkit):
        tree = build(testkit.Gpu(L40S_PF, testkit.L40S, driver="vfio-pci"))
        tree.start_vm("tenant-c_vm-3", [L40S_PF])
        document = {"gpus": [{"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C"}]}
        refused = plan(tree, document, drained=True)
        assert refused.steps == []
        assert "tenant-c_vm-3" in refused.refusals[0] and "declared vgpu" in refused.refusals[0]

    def test_a_card_with_live_vgpus_is_never_unbound_not_even_with_force(self, build):
        tree = build(scenario="l40s-sriov")
        forced = plan(tree, {"gpus": [{"address": L40S_PF, "mode": "passthrough"}]}, force=True)
        assert forced.steps == [] and "never unbound or reset" in forced.refusals[0]


def test_applying_under_a_running_vm_writes_nothing_and_says_why(build, apply, digest):
    tree = build(scenario="l40s-sriov")
    tree.start_vm("tenant-a_vm-1", [VF1])
    before = digest(tree.root)
    result = apply(tree, VF1_24C, drained=True)
    assert result.done == [] and digest(tree.root) == before
    assert "tenant-a_vm-1" in result.plan.refusals[0]
    assert result.users == {VF1: ["VM tenant-a_vm-1 (pid 4242)"]}
    assert vgpu_type(tree.root, VF1) == L40S_12C


def test_vgpu_profile_will_not_clear_a_vf_a_vm_uses(build, run_module, digest):
    from ansible_collections.cozystack.gpu.plugins.modules import vgpu_profile

    tree = build(scenario="l40s-sriov")
    tree.start_vm("tenant-a_vm-1", [VF1])
    before = digest(tree.root)
    args = {"root": str(tree.root), "vfs": [VF1], "profile": "0", "nvidia_smi": "/nonexistent"}
    refused = run_module(vgpu_profile, args)
    assert refused["failed"] is True
    assert f"clearing {VF1} (used by VM tenant-a_vm-1 (pid 4242))" in refused["msg"]
    assert digest(tree.root) == before
