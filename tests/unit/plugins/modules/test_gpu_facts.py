"""gpu_facts: the shared sysfs inventory as facts."""

from __future__ import annotations

from ansible_collections.cozystack.gpu.plugins.modules import gpu_facts


def test_facts_carry_every_gpu_function_and_resource_name(build, run_module, digest):
    tree = build(scenario="mixed")
    before = digest(tree.root)
    result = run_module(gpu_facts, {"root": str(tree.root)}, use_main=True)
    assert result["failed"] is False and result["changed"] is False
    facts = result["ansible_facts"]["cozystack_gpu"]
    by_address = {f["address"]: f for f in facts["functions"]}
    assert "0000:18:00.1" not in by_address  # the NVIDIA audio function is no GPU
    assert "0000:01:00.0" not in by_address  # nor is the NIC
    assert by_address["0000:18:00.0"]["mode"] == "passthrough"
    assert by_address["0000:41:00.4"]["vgpu_type_name"] == "NVIDIA L40S-12C"
    assert by_address["0000:41:00.4"]["physfn"] == "0000:41:00.0"
    assert "nvidia.com/NVIDIA_L40S-12C" in facts["resource_names"]
    assert "nvidia.com/GRID_T4-4Q" in facts["resource_names"]
    assert digest(tree.root) == before


def test_check_mode_reads_the_same_facts(build, run_module):
    tree = build(scenario="l40s-sriov")
    normal = run_module(gpu_facts, {"root": str(tree.root)})
    checked = run_module(gpu_facts, {"root": str(tree.root)}, check_mode=True)
    assert checked["ansible_facts"] == normal["ansible_facts"]
    assert len(normal["ansible_facts"]["cozystack_gpu"]["functions"]) == 33  # PF + 32 VFs


def test_an_empty_root_is_an_empty_inventory_not_a_failure(tmp_path, run_module):
    result = run_module(gpu_facts, {"root": str(tmp_path)})
    assert result["failed"] is False
    assert result["ansible_facts"]["cozystack_gpu"]["functions"] == []


def test_the_facts_say_which_pci_ids_named_the_devices(build, run_module, tmp_path):
    tree = build(scenario="h100-x8")
    facts = run_module(gpu_facts, {"root": str(tree.root)})["ansible_facts"]["cozystack_gpu"]
    assert facts["pci_ids_path"] == str(tree.pci_ids)
    assert facts["pci_ids_version"] == "2025.06.09"
    assert facts["resource_names"] == ["nvidia.com/GH100_H100_SXM5_80GB"]
    # The device plugin's own pci.ids may name the device otherwise: predict from that file.
    plugins = tmp_path / "plugin-pci.ids"
    plugins.write_text("#\tVersion: 2023.04.10\n10de  NVIDIA Corporation\n\t2330  GH100[H100 SXM5 80GB]\n")
    predicted = run_module(gpu_facts, {"root": str(tree.root), "pci_ids": [str(plugins)]})
    facts = predicted["ansible_facts"]["cozystack_gpu"]
    assert (facts["pci_ids_path"], facts["pci_ids_version"]) == (str(plugins), "2023.04.10")
    assert facts["resource_names"] == ["nvidia.com/GH100H100_SXM5_80GB"]


def test_the_facts_name_the_vms_that_use_the_gpus_and_none_once_they_stop(build, run_module):
    tree = build(scenario="mixed")
    tree.start_vm("tenant-a_vm-1", ["0000:41:00.4", "0000:18:00.0"])
    facts = run_module(gpu_facts, {"root": str(tree.root)})["ansible_facts"]["cozystack_gpu"]
    named = ["VM tenant-a_vm-1 (pid 4242)"]
    assert facts["users"] == {"0000:41:00.4": named, "0000:18:00.0": named}
    assert facts["vms"] == named
    tree.stop_vm()
    facts = run_module(gpu_facts, {"root": str(tree.root)})["ansible_facts"]["cozystack_gpu"]
    assert (facts["users"], facts["vms"]) == ({}, [])
