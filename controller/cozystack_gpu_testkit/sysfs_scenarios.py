"""Named sysfs trees for the tests, the benchmarks and the agent demo: eight H100s, an L40S
with SR-IOV VFs (half or fully configured), a T4 with mdevs, GPUs sharing an IOMMU group, a
mixed host, a broken one, and a large one for benchmarks. Built with ``sysfs_tree``, which
stays a file of its own (molecule copies it alone onto its hosts):

    python -m cozystack_gpu_testkit.sysfs_scenarios build mixed /tmp/host
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable, Sequence

from cozystack_gpu_testkit.sysfs_tree import (
    A100_SXM,
    H100_SXM,
    INTEL_NIC,
    L40S,
    NVIDIA_AUDIO,
    RTX_A6000,
    T4,
    UNLISTED,
    Gpu,
    SysfsTree,
    build,
    vf_address,
)

H100_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
L40S_PF = "0000:41:00.0"
T4_PARENT = "0000:3b:00.0"
T4_MDEVS = (
    ("9b1c6b2a-3f0e-4c7e-9a55-0c1f5d2b7a01", "nvidia-225"),
    ("9b1c6b2a-3f0e-4c7e-9a55-0c1f5d2b7a02", "nvidia-225"),
)


def h100_x8(root: str | os.PathLike[str]) -> SysfsTree:
    """Eight H100 SXM on vfio-pci (passthrough), four per NUMA node, a group each."""
    return build(
        root,
        [
            Gpu(f"0000:{bus:02x}:00.0", H100_SXM, numa_node=i // 4)
            for i, bus in enumerate(H100_BUSES)
        ],
    )


def l40s_sriov(root: str | os.PathLike[str]) -> SysfsTree:
    """An L40S with its 32 VFs: VF0 NVIDIA L40S-24C, VF1 NVIDIA L40S-12C, the rest empty."""
    return build(
        root,
        [
            Gpu(
                L40S_PF,
                L40S,
                driver="nvidia",
                numa_node=0,
                vfs=32,
                profiles={0: "NVIDIA L40S-24C", 1: "NVIDIA L40S-12C"},
            )
        ],
    )


def l40s_full(root: str | os.PathLike[str]) -> SysfsTree:
    """A fully used L40S: 24C + 12C + 12C; every creatable_vgpu_types holds only its header."""
    return build(
        root,
        [
            Gpu(
                L40S_PF,
                L40S,
                driver="nvidia",
                vfs=32,
                profiles={0: "NVIDIA L40S-24C", 1: "NVIDIA L40S-12C", 2: "NVIDIA L40S-12C"},
                vf_catalog="header",
            )
        ],
    )


def t4_mdev(root: str | os.PathLike[str]) -> SysfsTree:
    """A T4 on the nvidia driver with mdev types and two GRID T4-4Q mdevs; a second T4 idle."""
    return build(
        root,
        [
            Gpu(T4_PARENT, T4, driver="nvidia", numa_node=0, mdevs=T4_MDEVS),
            Gpu("0000:af:00.0", T4, driver="nvidia", numa_node=1),
        ],
    )


def shared_group(root: str | os.PathLike[str]) -> SysfsTree:
    """Two A100 on vfio-pci behind one switch without ACS: one IOMMU group (40) holds both."""
    return build(
        root,
        [
            Gpu("0000:07:00.0", A100_SXM, iommu_group=40),
            Gpu("0000:0f:00.0", A100_SXM, iommu_group=40),
            Gpu("0000:47:00.0", A100_SXM, iommu_group=41),
        ],
    )


MIXED_PASSTHROUGH = ("0000:18:00.0", "0000:2a:00.0")
MIXED_L40S = "0000:41:00.0"
MIXED_T4 = "0000:3b:00.0"
MIXED_HOST = "0000:5d:00.0"  # an H100 left on the nvidia driver: no resource
MIXED_UNLISTED = "0000:9a:00.0"
MIXED_VGA = "0000:ab:00.0"


def mixed(root: str | os.PathLike[str]) -> SysfsTree:
    """A node with every kind: passthrough, SR-IOV vGPU (4 VFs), mdev, host-owned, unlisted ID,
    a VGA-class GPU, and non-GPU functions (NVIDIA audio, an Intel NIC) that must be left out."""
    return build(
        root,
        [
            Gpu(MIXED_PASSTHROUGH[0], H100_SXM, numa_node=0),
            Gpu(MIXED_PASSTHROUGH[1], H100_SXM, numa_node=0),
            Gpu(
                MIXED_L40S,
                L40S,
                driver="nvidia",
                numa_node=0,
                vfs=4,
                profiles={0: "NVIDIA L40S-12C"},
            ),
            Gpu(MIXED_T4, T4, driver="nvidia", numa_node=1, mdevs=T4_MDEVS[:1]),
            Gpu(MIXED_HOST, H100_SXM, driver="nvidia", numa_node=1),
            Gpu(MIXED_UNLISTED, UNLISTED, numa_node=1),
            Gpu(MIXED_VGA, RTX_A6000, driver="vfio-pci", numa_node=1),
        ],
        others=[
            Gpu("0000:18:00.1", NVIDIA_AUDIO, driver="snd_hda_intel"),
            Gpu("0000:01:00.0", INTEL_NIC, driver="i40e"),
        ],
    )


BROKEN_BAD_VENDOR = "0000:18:00.0"
BROKEN_BAD_NUMA = "0000:2a:00.0"
BROKEN_UNREADABLE_CLASS = "0000:3a:00.0"
BROKEN_BAD_GROUP = "0000:5d:00.0"
BROKEN_DANGLING_DRIVER = "0000:9a:00.0"
BROKEN_PF = "0000:41:00.0"
BROKEN_T4 = "0000:3b:00.0"
BROKEN_MDEV_DANGLING = "00000000-0000-0000-0000-00000000dead"


def broken(root: str | os.PathLike[str]) -> SysfsTree:
    """Files no host should have: a non-hex vendor, a non-numeric numa_node, a directory where
    ``class`` should be, a group link that names no group, a dangling driver link, a PF with a
    dangling ``virtfn`` and a VF whose type lists are empty and whose type is junk, a T4 with an
    empty ``mdev_supported_types`` entry and a non-UTF-8 type name, and a dangling mdev."""
    tree = build(
        root,
        [
            Gpu(BROKEN_BAD_VENDOR, H100_SXM),
            Gpu(BROKEN_BAD_NUMA, H100_SXM),
            Gpu(BROKEN_UNREADABLE_CLASS, H100_SXM),
            Gpu(BROKEN_BAD_GROUP, H100_SXM),
            Gpu(BROKEN_DANGLING_DRIVER, H100_SXM),
            Gpu(BROKEN_PF, L40S, driver="nvidia", vfs=4, profiles={0: "NVIDIA L40S-24C"}),
            Gpu(BROKEN_T4, T4, driver="nvidia", mdevs=T4_MDEVS[:1]),
        ],
    )
    tree.write(BROKEN_BAD_VENDOR, "vendor", "0xzzzz\n")
    tree.write(BROKEN_BAD_NUMA, "numa_node", "first\n")
    (tree.device_dir(BROKEN_UNREADABLE_CLASS) / "class").unlink()
    (tree.device_dir(BROKEN_UNREADABLE_CLASS) / "class").mkdir()
    tree.link(BROKEN_BAD_GROUP, "iommu_group", "../../../kernel/iommu_groups/not-a-group")
    tree.link(BROKEN_DANGLING_DRIVER, "driver", "../../../bus/pci/drivers/gone-driver")
    gone = vf_address(BROKEN_PF, 3)
    (tree.root / "sys/bus/pci/devices" / gone).unlink()
    shutil.rmtree(tree.device_dir(gone))
    configured = vf_address(BROKEN_PF, 0)
    for address in [BROKEN_PF, *tree.vfs_of(BROKEN_PF)[:3]]:
        tree.write(address, "nvidia/creatable_vgpu_types", "")
    tree.write(configured, "nvidia/current_vgpu_type", "twelve\n")
    tree.write(vf_address(BROKEN_PF, 1), "nvidia/current_vgpu_type", "1153\n")  # listed nowhere now
    empty_type = tree.device_dir(BROKEN_T4) / "mdev_supported_types" / "nvidia-999"
    empty_type.mkdir()
    tree.write(BROKEN_T4, "mdev_supported_types/nvidia-228/name", b"\xff\xfe GRID\n")
    tree._symlink(
        tree.root / "sys/bus/mdev/devices" / BROKEN_MDEV_DANGLING,
        f"../../../devices/pci0000:00/{BROKEN_T4}/{BROKEN_MDEV_DANGLING}",
    )
    return tree


def bench(root: str | os.PathLike[str], gpus: int = 8, vfs: int = 32) -> SysfsTree:
    """``gpus`` L40S cards with ``vfs`` VFs each, every VF holding NVIDIA L40S-1C."""
    return build(
        root,
        [
            Gpu(
                f"0000:{0x41 + 0x10 * i:02x}:00.0",
                L40S,
                driver="nvidia",
                numa_node=i * 2 // gpus,
                vfs=vfs,
                profiles={v: "NVIDIA L40S-1C" for v in range(vfs)},
            )
            for i in range(gpus)
        ],
    )


SCENARIOS: dict[str, Callable[[str | os.PathLike[str]], SysfsTree]] = {
    "h100-x8": h100_x8,
    "l40s-sriov": l40s_sriov,
    "l40s-full": l40s_full,
    "t4-mdev": t4_mdev,
    "shared-group": shared_group,
    "mixed": mixed,
    "broken": broken,
    "bench": bench,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cozystack_gpu_testkit.sysfs_scenarios",
        description=__doc__.split("\n", maxsplit=1)[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("build", help="build a scenario below ROOT")
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("root")
    args = parser.parse_args(argv)
    try:
        SCENARIOS[args.scenario](args.root)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
