"""Resolution of device-plugin IDs by shape, health per function, final-phase pods."""

from __future__ import annotations

from pathlib import Path

import pytest

from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import DeviceSet, PodDevices
from cozystack_gpu.agent.report import Shape, build_report, id_shape
from cozystack_gpu_testkit import sysfs_scenarios as sc
from cozystack_gpu_testkit import sysfs_tree as st

H100 = "nvidia.com/GH100_H100_SXM5_80GB"
A100 = "nvidia.com/GA100_A100_SXM4_40GB"
T4Q = "nvidia.com/GRID_T4-4Q"
MDEV_A, MDEV_B = (u for u, _type in sc.T4_MDEVS)


def running(_ns: str, _name: str) -> str | None:
    return "Running"


def by_address(report_devices: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {d["pciAddress"]: d for d in report_devices}


@pytest.mark.parametrize(
    ("device_id", "shape"),
    [
        ("0000:18:00.0", Shape.PCI),
        ("18:00.0", Shape.PCI),
        (MDEV_A, Shape.MDEV),
        (MDEV_A.upper(), Shape.MDEV),
        ("40", Shape.IOMMU_GROUP),
        ("GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763", Shape.NVML),
        ("GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763::2", Shape.NVML),
        ("MIG-4b17a0c2-8f2c-5da9-3e5a-9c2e1d90abb5", Shape.NVML),
        ("kvm", Shape.UNKNOWN),
        ("٣", Shape.UNKNOWN),  # a digit, but not an ASCII group number
    ],
)
def test_ids_are_told_apart_by_shape(device_id: str, shape: str) -> None:
    assert id_shape(device_id) == shape


def test_pci_addresses_count_on_their_function_and_pods_hold_it(tmp_path: Path) -> None:
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    healthy = ["0000:18:00.0", "2a:00.0", "0000:3a:00.0"]  # kubelet lists healthy devices only
    report = build_report(
        inv,
        [DeviceSet(H100, tuple(healthy))],
        [PodDevices("tenant", "virt-launcher-a", (DeviceSet(H100, ("0000:2a:00.0",)),))],
        running,
    )
    devices = by_address(report.devices)
    assert [devices[a]["allocatable"] for a in sorted(devices)] == [1, 1, 1, 0, 0, 0, 0, 0]
    assert devices["0000:2a:00.0"]["pods"] == [{"namespace": "tenant", "name": "virt-launcher-a"}]
    assert devices["0000:18:00.0"]["pods"] == []
    assert report.resource_names == [H100]
    assert report.allocatable() == 3
    first = devices["0000:18:00.0"]
    assert first == {
        "pciAddress": "0000:18:00.0",
        "vendorID": "10de",
        "deviceID": "2330",
        "model": "GH100 [H100 SXM5 80GB]",
        "driver": "vfio-pci",
        "iommuGroup": 10,
        "numaNode": 0,
        "resourceName": H100,
        "allocatable": 1,
        "pods": [],
    }


def test_mdev_uuids_count_on_their_parent_once_each(tmp_path: Path) -> None:
    sc.t4_mdev(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(
        inv,
        [DeviceSet(T4Q, (MDEV_A, MDEV_B, MDEV_A))],  # a repeated ID counts once
        [PodDevices("tenant", "vm", (DeviceSet(T4Q, (MDEV_B.upper(),)),))],
        running,
    )
    parent = by_address(report.devices)[sc.T4_PARENT]
    assert parent["allocatable"] == 2
    assert parent["pods"] == [{"namespace": "tenant", "name": "vm"}]
    assert parent["mdev"]["devices"] == [
        {"uuid": MDEV_A, "type": "nvidia-225", "name": "GRID T4-4Q"},
        {"uuid": MDEV_B, "type": "nvidia-225", "name": "GRID T4-4Q"},
    ]
    assert {"id": "nvidia-225", "name": "GRID T4-4Q", "availableInstances": 2} in parent["mdev"][
        "types"
    ]
    assert by_address(report.devices)["0000:af:00.0"]["allocatable"] == 0


def test_an_iommu_group_counts_once_on_its_lowest_vfio_gpu(tmp_path: Path) -> None:
    sc.shared_group(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(
        inv,
        [DeviceSet(A100, ("40", "41"))],  # kubevirt-gpu-device-plugin <= v1.4.0
        [PodDevices("tenant", "vm", (DeviceSet(A100, ("40",)),))],
        running,
    )
    devices = by_address(report.devices)
    assert [
        devices[a]["allocatable"] for a in ("0000:07:00.0", "0000:0f:00.0", "0000:47:00.0")
    ] == [
        1,
        0,
        1,
    ]
    # The group goes to a VM whole: its pod holds both GPUs.
    assert devices["0000:0f:00.0"]["pods"] == [{"namespace": "tenant", "name": "vm"}]
    assert devices["0000:47:00.0"]["pods"] == []


def test_plain_indexes_are_not_groups_unless_a_vfio_function_is_in_that_group(
    tmp_path: Path,
) -> None:
    # Host-owned GPUs (nvidia driver) in groups 10 and 11; a container plugin's index "10".
    st.build(tmp_path, [st.Gpu("0000:18:00.0", st.H100_SXM, driver="nvidia", iommu_group=10)])
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(inv, [DeviceSet("nvidia.com/gpu", ("10", "0"))], [], running)
    assert report.devices[0]["allocatable"] == 0
    # Not placeable, but advertised under nvidia.com/: a GPU name pods may request (seed 004).
    assert report.resource_names == ["nvidia.com/gpu"]
    assert report.unresolved == {"nvidia.com/gpu": ["0", "10"]}


def test_nvml_uuids_are_not_placed_but_their_name_is_reported(tmp_path: Path) -> None:
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    uuid = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
    report = build_report(
        inv,
        [DeviceSet("nvidia.com/gpu", (uuid, uuid + "::1")), DeviceSet(H100, ())],
        [PodDevices("ml", "trainer", (DeviceSet("nvidia.com/gpu", (uuid,)),))],
        running,
    )
    assert report.resource_names == [H100, "nvidia.com/gpu"]
    assert report.allocatable() == 0
    assert all(d["pods"] == [] for d in report.devices)
    assert report.unresolved == {}


def test_pods_in_a_final_phase_are_skipped_and_unknown_pods_kept(tmp_path: Path) -> None:
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    phases = {"done": "Succeeded", "crashed": "Failed", "live": "Running"}

    def phase_of(_ns: str, name: str) -> str | None:
        return phases.get(name)

    def pod(name: str, address: str) -> PodDevices:
        return PodDevices("t", name, (DeviceSet(H100, (address,)),))

    report = build_report(
        inv,
        [DeviceSet(H100, ("0000:18:00.0", "0000:2a:00.0"))],
        [
            pod("done", "0000:18:00.0"),
            pod("crashed", "0000:18:00.0"),
            pod("live", "0000:2a:00.0"),
            pod("deleted", "0000:3a:00.0"),
        ],
        phase_of,
    )
    devices = by_address(report.devices)
    assert devices["0000:18:00.0"]["pods"] == []
    assert devices["0000:2a:00.0"]["pods"] == [{"namespace": "t", "name": "live"}]
    assert devices["0000:3a:00.0"]["pods"] == [{"namespace": "t", "name": "deleted"}]
    assert report.skipped_pods == ["t/crashed", "t/done"]


def test_kubelets_name_wins_where_sysfs_cannot_name_a_vgpu_type(tmp_path: Path) -> None:
    sc.l40s_full(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    vf0, vf1 = st.vf_address(sc.L40S_PF, 0), st.vf_address(sc.L40S_PF, 1)
    report = build_report(
        inv,
        [  # the plugin named them through NVML
            DeviceSet("nvidia.com/NVIDIA_L40S-24C", (vf0,)),
            DeviceSet("nvidia.com/NVIDIA_L40S-12C", (vf1,)),
        ],
        [],
        running,
    )
    devices = by_address(report.devices)
    assert devices[vf0]["resourceName"] == "nvidia.com/NVIDIA_L40S-24C"
    assert devices[vf0]["vgpuType"] == {"id": 1151}
    assert "sysfs cannot name it" in devices[vf0]["error"]
    assert "resourceName" not in devices[st.vf_address(sc.L40S_PF, 2)]
    assert report.resource_names == ["nvidia.com/NVIDIA_L40S-12C", "nvidia.com/NVIDIA_L40S-24C"]


def test_sriov_and_vgpu_fields_of_a_card(tmp_path: Path) -> None:
    sc.l40s_sriov(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    vf0 = st.vf_address(sc.L40S_PF, 0)
    report = build_report(inv, [DeviceSet("nvidia.com/NVIDIA_L40S-24C", (vf0,))], [], running)
    devices = by_address(report.devices)
    assert len(devices) == 33
    pf = devices[sc.L40S_PF]
    assert (pf["sriovTotalVFs"], pf["sriovNumVFs"], pf["allocatable"]) == (32, 32, 0)
    assert devices[vf0]["physfn"] == sc.L40S_PF
    assert devices[vf0]["vgpuType"] == {"id": 1151, "name": "NVIDIA L40S-24C"}
    assert devices[vf0]["allocatable"] == 1
    # The 12C VF is named from sysfs on its device, but kubelet does not advertise the name:
    # it stays out of resourceNames (the binder reports the difference on the GPUNode).
    vf1 = next(
        a for a, d in devices.items() if (d.get("vgpuType") or {}).get("name") == "NVIDIA L40S-12C"
    )
    assert devices[vf1]["resourceName"] == "nvidia.com/NVIDIA_L40S-12C"
    assert report.resource_names == ["nvidia.com/NVIDIA_L40S-24C"]


def test_broken_functions_carry_their_error_and_the_rest_stays_valid(tmp_path: Path) -> None:
    sc.broken(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(inv, [DeviceSet(H100, (sc.BROKEN_BAD_NUMA,))], [], running)
    devices = by_address(report.devices)
    assert devices[sc.BROKEN_BAD_NUMA]["numaNode"] == -1
    assert devices[sc.BROKEN_BAD_NUMA]["allocatable"] == 1
    assert devices[sc.BROKEN_BAD_VENDOR]["error"].startswith("vendor: not a hex ID")
    assert "vendorID" not in devices[sc.BROKEN_BAD_VENDOR]
    assert (
        "mdev 00000000-0000-0000-0000-00000000dead: dangling link" in devices[sc.BROKEN_T4]["error"]
    )
    assert "error" not in devices[st.vf_address(sc.BROKEN_PF, 2)]


CX7_VF = "nvidia.com/MT2910_Family_ConnectX-7_VF"


def test_a_nic_vf_under_the_vendor_prefix_is_not_a_gpu_name(tmp_path: Path) -> None:
    """Seed 004's GPUDirect RDMA answer: a ConnectX VF the network device plugin advertises
    under nvidia.com/ resolves to no GPU function of the node, so it is reported apart and
    does not join resourceNames (a VM may then take it next to its GPU claims)."""
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(
        inv,
        [
            DeviceSet(H100, ("0000:18:00.0",)),
            DeviceSet(CX7_VF, ("0000:b1:00.2", "0000:b1:00.3")),
        ],
        [],
        running,
    )
    assert report.resource_names == [H100]
    assert report.other_resource_names == [CX7_VF]
    assert report.status()["otherResourceNames"] == [CX7_VF]


def test_a_vendor_name_with_nothing_to_judge_by_still_counts_as_a_gpu_name(
    tmp_path: Path,
) -> None:
    """Without a device, or with IDs of no known shape, nothing says what a name under the
    prefix is: it stays a GPU name, so rawResourceNames forbidden still catches it."""
    sc.h100_x8(tmp_path)
    inv = sysfs.read_inventory(str(tmp_path))
    report = build_report(
        inv, [DeviceSet(A100, ()), DeviceSet(T4Q, ("some-plugin-id",))], [], running
    )
    assert report.resource_names == [A100, T4Q]
    assert report.other_resource_names == []
