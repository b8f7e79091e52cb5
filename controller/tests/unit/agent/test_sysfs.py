"""The sysfs inventory library on fixture trees: what it finds, how it names it, and that a
broken file becomes an error on its function rather than an exception."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_scenarios as sc
from cozystack_gpu_testkit import sysfs_tree as st


def test_eight_h100_on_vfio_are_passthrough_gpus_named_from_pci_ids(tmp_path: Path) -> None:
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    assert inv.errors == []
    assert [f.address for f in inv.functions] == [f"0000:{b:02x}:00.0" for b in sc.H100_BUSES]
    for i, f in enumerate(inv.functions):
        assert (f.vendor_id, f.device_id, f.class_code) == ("10de", "2330", "030200")
        assert f.model == "GH100 [H100 SXM5 80GB]"
        assert f.driver == "vfio-pci"
        assert f.mode == "passthrough"
        assert f.numa_node == i // 4
        assert f.resource_name == "nvidia.com/GH100_H100_SXM5_80GB"
        assert f.errors == []
    assert len({f.iommu_group for f in inv.functions}) == 8
    assert inv.resource_names() == ["nvidia.com/GH100_H100_SXM5_80GB"]
    assert inv.pci_ids_path == str(tmp_path / st.PCI_IDS_PATH)


@pytest.mark.parametrize(
    ("pci_name", "expected"),
    [
        ("AD102GL [L40S]", "AD102GL_L40S"),
        ("GH100 [H100 SXM5 80GB]", "GH100_H100_SXM5_80GB"),
        ("TU102 [GeForce RTX 2080 Ti Rev. A]", "TU102_GEFORCE_RTX_2080_TI_REV__A"),
        ("AD102GL [L40S / L40 / L20 ES/QS]", "AD102GL_L40S___L40___L20_ES_QS"),
        ("  GA100\t[A100 SXM4 40GB]  ", "GA100_A100_SXM4_40GB"),
    ],
)
def test_passthrough_names_follow_the_device_plugin(pci_name: str, expected: str) -> None:
    assert sysfs.passthrough_name(pci_name) == expected


@pytest.mark.parametrize(
    ("type_name", "expected"),
    [
        ("NVIDIA L40S-24C", "NVIDIA_L40S-24C"),
        ("GRID T4-4Q\n", "GRID_T4-4Q"),
        ("NVIDIA  H200X-141C", "NVIDIA_H200X-141C"),
    ],
)
def test_vgpu_and_mdev_names_turn_whitespace_runs_into_underscores(
    type_name: str, expected: str
) -> None:
    assert sysfs.vgpu_type_name(type_name) == expected


def test_mixed_node_keeps_gpus_and_leaves_other_functions_out(tmp_path: Path) -> None:
    sc.mixed(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    by = inv.by_address()
    assert "0000:18:00.1" not in by  # NVIDIA audio function
    assert "0000:01:00.0" not in by  # Intel NIC
    assert by[sc.MIXED_UNLISTED].model == "2bff"
    assert by[sc.MIXED_UNLISTED].resource_name == "nvidia.com/2bff"  # raw ID, as is
    assert by[sc.MIXED_VGA].class_code == "030000"
    assert by[sc.MIXED_VGA].resource_name == "nvidia.com/GA102GL_RTX_A6000"
    assert by[sc.MIXED_HOST].driver == "nvidia"
    assert by[sc.MIXED_HOST].resource_name is None
    assert by[sc.MIXED_HOST].mode is None
    assert inv.resource_names() == [
        "nvidia.com/2bff",
        "nvidia.com/GA102GL_RTX_A6000",
        "nvidia.com/GH100_H100_SXM5_80GB",
        "nvidia.com/GRID_T4-4Q",
        "nvidia.com/NVIDIA_L40S-12C",
    ]
    json.dumps(inv.to_dict())  # plain data all the way down
    assert inv.to_dict()["functions"][0]["mode"] == "passthrough"


def test_every_display_controller_class_of_the_vendor_is_a_gpu_function(tmp_path: Path) -> None:
    # SPEC: a GPU function is any 0x03xx function of 0x10de, not only VGA (0300) and 3D
    # (0302); one left out adds no GPU name, so raw requests of it pass under `forbidden`.
    st.build(
        tmp_path,
        [
            st.Gpu("0000:18:00.0", st.H100_PCIE_OTHER_DISPLAY),
            st.Gpu("0000:18:00.1", st.NVIDIA_AUDIO),
        ],
    )
    inv = sysfs.read_inventory(str(tmp_path))
    by = inv.by_address()
    assert "0000:18:00.0" in by, "the 0x0380 display controller was not taken for a GPU"
    assert by["0000:18:00.0"].class_code == "038000"
    assert by["0000:18:00.0"].mode == "passthrough"
    assert "0000:18:00.1" not in by  # 0x0403 audio: the vendor's, but no display controller
    assert inv.resource_names() == ["nvidia.com/GH100_H100_PCIE"]


def test_without_pci_ids_models_and_names_fall_back_to_the_raw_id(tmp_path: Path) -> None:
    st.build(tmp_path, [st.Gpu("0000:18:00.0", st.H100_SXM)], pci_ids=False)
    inv = sysfs.read_inventory(str(tmp_path), pci_ids_paths=["/nonexistent/pci.ids"])
    (f,) = inv.functions
    assert (f.model, f.resource_name) == ("2330", "nvidia.com/2330")
    assert inv.pci_ids_path is None
    assert inv.errors == ["no pci.ids found; models are raw device IDs"]


def test_pci_ids_reader_takes_only_nvidias_section() -> None:
    ids = sysfs.parse_pci_ids(st.PCI_IDS_FIXTURE)
    assert ids.name("2330") == "GH100 [H100 SXM5 80GB]"  # not Intel's 2330
    assert ids.name("1572") is None and ids.name("0100") is None  # Intel's, Evans & Sutherland's
    assert ids.name("1f02") == "TU106 [GeForce RTX 2070]"
    assert ids.name("1043") is None  # the subsystem line under 1f02 is not a device
    assert ids.version == "2025.06.09"  # the release's own header line, below ours


def test_the_inventory_names_the_pci_ids_release_it_used(tmp_path: Path) -> None:
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    assert (inv.pci_ids_path, inv.pci_ids_version) == (
        str(tmp_path / st.PCI_IDS_PATH),
        "2025.06.09",
    )
    assert inv.to_dict()["pci_ids_version"] == "2025.06.09"
    unversioned = sysfs.parse_pci_ids("10de  NVIDIA Corporation\n\t2330  GH100 [H100 SXM5 80GB]\n")
    assert unversioned.version is None and unversioned.name("2330") == "GH100 [H100 SXM5 80GB]"


def test_l40s_vfs_are_named_from_their_cards_creatable_types(tmp_path: Path) -> None:
    sc.l40s_sriov(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    by = inv.by_address()
    pf = by[sc.L40S_PF]
    assert pf.sriov is not None
    assert (pf.sriov.total_vfs, pf.sriov.num_vfs) == (32, 32)
    assert pf.sriov.vfs == [st.vf_address(sc.L40S_PF, i) for i in range(32)]
    assert pf.sriov.vfs[-1] == "0000:41:04.3"
    assert pf.resource_name is None and not pf.is_vf
    vf0, vf1, vf2 = (by[st.vf_address(sc.L40S_PF, i)] for i in range(3))
    assert vf0.physfn == sc.L40S_PF and vf0.is_vf
    assert (vf0.vgpu_type_name, vf0.resource_name) == (
        "NVIDIA L40S-24C",
        "nvidia.com/NVIDIA_L40S-24C",
    )
    assert (vf1.vgpu_type_name, vf1.resource_name) == (
        "NVIDIA L40S-12C",
        "nvidia.com/NVIDIA_L40S-12C",
    )
    assert vf2.vgpu is not None and vf2.vgpu.current_type_id == 0
    assert vf2.resource_name is None and vf2.mode is None
    # 24 + 12 of 48 GB used: what is left fits 12C at most.
    assert max(t.type_id for t in vf2.vgpu.creatable) == 1159
    assert min(t.type_id for t in vf2.vgpu.creatable) == 1153
    assert all(f.errors == [] for f in inv.functions)


def test_a_fully_used_card_cannot_name_its_types_from_sysfs(tmp_path: Path) -> None:
    sc.l40s_full(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    by = inv.by_address()
    assert by[sc.L40S_PF].vgpu is not None and by[sc.L40S_PF].vgpu.creatable == []
    for i in range(3):
        vf = by[st.vf_address(sc.L40S_PF, i)]
        assert vf.vgpu is not None and vf.vgpu.current_type_id in (1151, 1153)
        assert vf.resource_name is None
        assert "sysfs cannot name it" in vf.errors[0]
    assert inv.resource_names() == []


def test_type_ids_are_resolved_per_card_never_from_another_card(tmp_path: Path) -> None:
    # Card B calls type 1151 something else, and is full: it must not borrow A's name.
    other = st.CardModel(
        "l40s-b",
        "26b9",
        48,
        total_vfs=4,
        vgpu_types=(st.VgpuTypeSpec(1151, "NVIDIA L40S-48C", 48),),
    )
    st.build(
        tmp_path,
        [
            st.Gpu("0000:41:00.0", st.L40S, driver="nvidia", vfs=2, profiles={0: 1151}),
            st.Gpu(
                "0000:61:00.0",
                other,
                driver="nvidia",
                vfs=2,
                profiles={0: 1151},
                vf_catalog="header",
            ),
        ],
    )
    by = sysfs.read_inventory(str(tmp_path)).by_address()
    assert by["0000:41:00.4"].vgpu_type_name == "NVIDIA L40S-24C"
    assert by["0000:61:00.4"].vgpu_type_name is None
    assert by["0000:61:00.4"].resource_name is None


def test_t4_mdevs_hang_off_their_parent_with_the_type_name(tmp_path: Path) -> None:
    sc.t4_mdev(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    parent = inv.by_address()[sc.T4_PARENT]
    assert [m.uuid for m in parent.mdevs] == [u for u, _type in sc.T4_MDEVS]
    assert {m.type_id for m in parent.mdevs} == {"nvidia-225"}
    assert parent.resource_name == "nvidia.com/GRID_T4-4Q"
    assert parent.mode == "vgpu"
    types = {t.type_id: t for t in parent.mdev_types}
    assert types["nvidia-225"].available_instances == 2
    assert types["nvidia-225"].devices == [u for u, _type in sc.T4_MDEVS]
    assert types["nvidia-222"].available_instances == 0  # one type per GPU at a time
    assert types["nvidia-222"].resource_name == "nvidia.com/GRID_T4-1B"
    idle = inv.by_address()["0000:af:00.0"]
    assert idle.mdevs == [] and idle.resource_name is None
    assert {t.type_id: t.available_instances for t in idle.mdev_types}["nvidia-230"] == 1


def test_two_gpus_can_share_one_iommu_group(tmp_path: Path) -> None:
    sc.shared_group(tmp_path)
    groups = {f.address: f.iommu_group for f in sysfs.read_inventory(str(tmp_path)).functions}
    assert groups == {"0000:07:00.0": 40, "0000:0f:00.0": 40, "0000:47:00.0": 41}


def test_broken_files_become_errors_on_their_own_functions(tmp_path: Path) -> None:
    sc.broken(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    by = inv.by_address()
    assert by[sc.BROKEN_BAD_VENDOR].errors == ["vendor: not a hex ID: '0xzzzz\\n'"]
    assert by[sc.BROKEN_BAD_VENDOR].resource_name == "nvidia.com/GH100_H100_SXM5_80GB"
    assert by[sc.BROKEN_BAD_NUMA].numa_node is None
    assert by[sc.BROKEN_BAD_NUMA].errors == ["numa_node: not a number: 'first\\n'"]
    assert by[sc.BROKEN_UNREADABLE_CLASS].errors == ["class: unreadable: Is a directory"]
    assert by[sc.BROKEN_BAD_GROUP].iommu_group is None
    assert "not a group number" in by[sc.BROKEN_BAD_GROUP].errors[0]
    assert by[sc.BROKEN_DANGLING_DRIVER].driver == "gone-driver"
    assert by[sc.BROKEN_DANGLING_DRIVER].errors == ["driver: dangling link to gone-driver"]
    assert by[sc.BROKEN_PF].errors == ["virtfn3: dangling link to 0000:41:00.7"]
    assert "0000:41:00.7" not in by
    vf0 = by[st.vf_address(sc.BROKEN_PF, 0)]
    assert vf0.errors == ["nvidia/current_vgpu_type: not a number: 'twelve'"]
    vf1 = by[st.vf_address(sc.BROKEN_PF, 1)]
    assert vf1.vgpu is not None and vf1.vgpu.creatable == [] and vf1.resource_name is None
    assert "sysfs cannot name it" in vf1.errors[0]
    t4 = by[sc.BROKEN_T4]
    assert t4.errors == [
        "mdev_supported_types/nvidia-228/name: not text",
        "mdev_supported_types/nvidia-999/name: missing or empty",
    ]
    dangling = next(m for m in t4.mdevs if m.uuid == sc.BROKEN_MDEV_DANGLING)
    assert dangling.errors == ["dangling link"] and dangling.resource_name is None
    assert t4.resource_name == "nvidia.com/GRID_T4-4Q"
    assert inv.errors == []


def test_a_function_whose_vendor_and_class_are_both_unreadable_is_shown_not_dropped(
    tmp_path: Path,
) -> None:
    tree = st.build(tmp_path, [st.Gpu("0000:18:00.0", st.H100_SXM)])
    tree.write("0000:18:00.0", "vendor", "junk")
    tree.write("0000:18:00.0", "class", "junk")
    (f,) = sysfs.read_inventory(str(tmp_path)).functions
    assert f.vendor_id is None and f.class_code is None
    assert len(f.errors) == 2 and f.device_id is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0000:41:00.4", "0000:41:00.4"),
        ("41:00.4", "0000:41:00.4"),
        ("0001:AB:1f.7", "0001:ab:1f.7"),
        ("0000:41:20.0", None),  # device numbers stop at 0x1f
        ("0000:41:00.8", None),
        ("41", None),
        ("GPU-1234", None),
    ],
)
def test_pci_addresses_are_canonicalised(text: str, expected: str | None) -> None:
    assert sysfs.canonical_pci_address(text) == expected


def test_creatable_types_skip_the_header_and_junk() -> None:
    text = "ID    : vGPU Name\n1428 : NVIDIA H200X-141C\n  1414 :  NVIDIA H200X-70C  \njunk\n"
    assert sysfs.parse_creatable_vgpu_types(text) == [
        sysfs.VgpuType(1428, "NVIDIA H200X-141C"),
        sysfs.VgpuType(1414, "NVIDIA H200X-70C"),
    ]
    assert sysfs.parse_creatable_vgpu_types("ID    : vGPU Name\n") == []


# --- the builder behaves like the driver ---------------------------------------------------


def test_enabling_vfs_follows_the_kernels_rules(tmp_path: Path) -> None:
    tree = st.build(tmp_path, [st.Gpu(sc.L40S_PF, st.L40S, driver="nvidia")])
    assert tree.vfs_of(sc.L40S_PF) == []
    assert sysfs.read_inventory(str(tmp_path)).functions[0].sriov == sysfs.SriovInfo(32, 0, [])
    reopened = st.SysfsTree.open(tmp_path)  # another process, such as a stand-in
    created = reopened.enable_vfs(sc.L40S_PF, 4)
    assert created == ["0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7"]
    assert reopened.enable_vfs(sc.L40S_PF, 4) == created  # same count: nothing changes
    with pytest.raises(OSError) as busy:
        reopened.enable_vfs(sc.L40S_PF, 8)
    assert busy.value.errno == errno.EBUSY
    inv = sysfs.read_inventory(str(tmp_path))
    assert [f.address for f in inv.functions if f.physfn == sc.L40S_PF] == created
    vf = inv.by_address()[created[0]]
    assert vf.driver == "nvidia" and vf.vgpu is not None and vf.vgpu.current_type_id == 0
    assert len(vf.vgpu.creatable) == 10
    reopened.disable_vfs(sc.L40S_PF)
    inv = sysfs.read_inventory(str(tmp_path))
    assert [f.address for f in inv.functions] == [sc.L40S_PF]
    assert inv.functions[0].sriov == sysfs.SriovInfo(32, 0, [])


def test_writing_a_vgpu_type_follows_the_drivers_rules(tmp_path: Path) -> None:
    tree = st.build(tmp_path, [st.Gpu(sc.L40S_PF, st.L40S, driver="nvidia", vfs=3)])
    vf0, vf1, _vf2 = tree.vfs_of(sc.L40S_PF)
    tree.set_vgpu_type(vf0, 1150)  # 48C: the whole card
    assert tree.creatable_vgpu_types(sc.L40S_PF) == []
    with pytest.raises(OSError) as invalid:
        tree.set_vgpu_type(vf1, 1159)
    assert invalid.value.errno == errno.EINVAL
    with pytest.raises(OSError) as busy:
        tree.set_vgpu_type(vf0, 1151)
    assert busy.value.errno == errno.EBUSY
    tree.set_vgpu_type(vf0, 0)
    assert len(tree.creatable_vgpu_types(vf1)) == 10


def test_mdevs_come_and_go_with_available_instances(tmp_path: Path) -> None:
    tree = st.build(tmp_path, [st.Gpu(sc.T4_PARENT, st.T4, driver="nvidia")])
    uuid = "11111111-2222-3333-4444-555555555555"
    tree.create_mdev(sc.T4_PARENT, "nvidia-230", uuid)
    with pytest.raises(OSError):
        tree.create_mdev(sc.T4_PARENT, "nvidia-230", "11111111-2222-3333-4444-666666666666")
    (f,) = sysfs.read_inventory(str(tmp_path)).functions
    assert [m.resource_name for m in f.mdevs] == ["nvidia.com/GRID_T4-16Q"]
    tree.remove_mdev(uuid)
    (f,) = sysfs.read_inventory(str(tmp_path)).functions
    assert f.mdevs == [] and {t.available_instances for t in f.mdev_types} == {16, 4, 2, 1}


def test_the_builder_cli_builds_a_scenario_and_enables_vfs(tmp_path: Path) -> None:
    root = str(tmp_path / "t")
    assert sc.main(["build", "mixed", root]) == 0
    assert len(sysfs.read_inventory(root).functions) == 11
    assert st.main(["enable-vfs", root, sc.MIXED_L40S, "--count", "8"]) == 1  # EBUSY
    assert st.main(["set-vgpu-type", root, st.vf_address(sc.MIXED_L40S, 1), "1159"]) == 0
    assert sysfs.read_inventory(root).by_address()["0000:41:00.5"].vgpu_type_name == (
        "NVIDIA L40S-1C"
    )
