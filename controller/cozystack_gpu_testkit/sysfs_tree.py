"""sysfs fixture trees for NVIDIA GPU hosts, built from compact descriptions.

Tests of the inventory library, the node agent, the Ansible modules (molecule) and the
stand-ins for ``sriov-manage`` and ``nvidia-smi`` all act on trees made here, so a tree
always looks the way the kernel and NVIDIA's vGPU host driver lay sysfs out, and it changes
the way they change it. Build a tree from :class:`Gpu` descriptions (the named trees the
tests share are ``sysfs_scenarios``'); change it through :class:`SysfsTree`, never by writing its
files directly, so that the dependent files (``sriov_numvfs``, the ``creatable_vgpu_types``
lists of a card, mdev ``available_instances``) follow.

Tree conventions (paths relative to the root; ``BDF`` is ``0000:41:00.0`` style):

* Function directories are ``sys/devices/pci0000:00/BDF/`` (flat, one fake host bridge);
  ``sys/bus/pci/devices/BDF`` links to them, as on a host.
* Each function has ``vendor``, ``device``, ``class`` (``0x``-hex and a newline),
  ``subsystem_vendor``, ``subsystem_device``, ``numa_node`` (decimal, ``-1`` unknown) and
  ``driver_override`` (``(null)``). ``driver`` links to ``sys/bus/pci/drivers/<name>/``,
  which holds ``bind``, ``unbind``, ``new_id`` and a link back per bound function; an
  unbound function has no ``driver`` link. ``iommu_group`` links to
  ``sys/kernel/iommu_groups/<N>/``, whose ``devices/`` links back. Every function gets a
  group of its own unless its description names one.
* SR-IOV PF (a model with ``total_vfs``): ``sriov_totalvfs``, ``sriov_numvfs``,
  ``sriov_offset`` (4) and ``sriov_stride`` (1). VF ``i`` (0-based) of a PF at devfn ``d``
  is at devfn ``d + 4 + i`` on the PF's bus (carrying into the next bus past 0xff): the
  32 VFs of ``0000:41:00.0`` are ``0000:41:00.4`` … ``0000:41:04.3``.
* Enabling VFs (:meth:`SysfsTree.enable_vfs`, what ``sriov-manage -e`` does) writes
  ``sriov_numvfs``, creates the PF's ``virtfn<i>`` links (``../<VF BDF>``) and per VF a
  function directory with the PF's IDs, class and NUMA node, driver ``nvidia``, its own
  IOMMU group, a ``physfn`` link (``../<PF BDF>``) and ``nvidia/current_vgpu_type``
  (``0``), ``nvidia/creatable_vgpu_types`` and ``nvidia/vgpu_params``. Enabling on a PF
  whose VFs are enabled fails with EBUSY unless the count is the same (then nothing
  changes); disabling removes every VF (there is no partial disable).
* ``nvidia/creatable_vgpu_types`` is the header line ``ID    : vGPU Name`` followed by
  ``<id> : <name>`` lines. The fixture's capacity model: a card's framebuffer is shared by
  its VFs; the PF and every VF without a type list the types whose framebuffer fits what is
  left (mixed sizes allowed), so a fully used card lists only the header; a VF with a type
  lists its own type (``vf_catalog="own"``) or only the header (``vf_catalog="header"``,
  the driver behaviour that makes the device plugin fall back to NVML). Writing a type ID
  (:meth:`SysfsTree.set_vgpu_type`) succeeds only for a type the VF lists and only on a VF
  without one (EINVAL / EBUSY otherwise); writing 0 removes the vGPU.
* mdev parent (a model with ``mdev_types``): ``mdev_supported_types/<type>/`` with
  ``name``, ``description``, ``device_api`` (``vfio-pci``), ``available_instances``,
  ``create`` and ``devices/``; the parent is listed in ``sys/class/mdev_bus/``. A created
  mdev (:meth:`SysfsTree.create_mdev`) is a directory ``<parent dir>/<uuid>/`` with an
  ``mdev_type`` link (``../mdev_supported_types/<type>``) and ``remove``, linked from the
  type's ``devices/`` and from ``sys/bus/mdev/devices/<uuid>``. One GPU runs one mdev type
  at a time: the other types show ``available_instances`` 0 while it has mdevs.
* ``usr/share/misc/pci.ids`` holds :data:`PCI_IDS_FIXTURE`, the excerpt of a real pci.ids
  release shipped beside this file (unless built without it). Every model's vendor and
  device ID is the one that release gives it.
* ``.sysfs-fixture.json`` at the root keeps the models of the cards, so another process
  (a stand-in) can reopen the tree with :meth:`SysfsTree.open` and act on it.

This file imports nothing but the standard library and stands alone: molecule copies it onto
its hosts and runs it there (``python3 sysfs_tree.py --help``: enable or disable VFs, set a
VF's vGPU type, a QEMU process holding devices), and the stand-ins import it from beside it.
``python -m cozystack_gpu_testkit.sysfs_scenarios build <scenario> ROOT`` builds a named tree.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HEADER = "ID    : vGPU Name"
STATE_FILE = ".sysfs-fixture.json"
PCI_IDS_PATH = "usr/share/misc/pci.ids"
DEVICES_DIR = "sys/devices/pci0000:00"
VF_OFFSET = 4
VF_STRIDE = 1

# The pci.ids every tree carries: real lines of one pci.ids release (its source and version
# are in the file's header), so fixture models are named as that release names them.
PCI_IDS_EXCERPT = Path(__file__).with_name("pci.ids")
PCI_IDS_FIXTURE = PCI_IDS_EXCERPT.read_text(encoding="utf-8")


@dataclass(frozen=True)
class VgpuTypeSpec:
    type_id: int
    name: str
    framebuffer_gb: int


@dataclass(frozen=True)
class MdevTypeSpec:
    type_dir: str  # nvidia-<N>
    name: str
    max_instances: int
    description: str = ""


@dataclass(frozen=True)
class CardModel:
    """What a GPU model looks like in sysfs and what its vGPU host driver offers."""

    key: str
    device_id: str  # 4 hex digits, as in pci.ids
    memory_gb: int
    class_code: str = "0x030200"
    vendor_id: str = "0x10de"
    total_vfs: int = 0
    vgpu_types: tuple[VgpuTypeSpec, ...] = ()
    mdev_types: tuple[MdevTypeSpec, ...] = ()

    def vgpu_type(self, type_id: int) -> VgpuTypeSpec | None:
        return next((t for t in self.vgpu_types if t.type_id == type_id), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CardModel:
        return cls(
            **{k: v for k, v in data.items() if k not in ("vgpu_types", "mdev_types")},
            vgpu_types=tuple(VgpuTypeSpec(**t) for t in data.get("vgpu_types", ())),
            mdev_types=tuple(MdevTypeSpec(**t) for t in data.get("mdev_types", ())),
        )


def _l40s_types() -> tuple[VgpuTypeSpec, ...]:
    sizes = (48, 24, 16, 12, 8, 6, 4, 3, 2, 1)
    return tuple(VgpuTypeSpec(1150 + i, f"NVIDIA L40S-{gb}C", gb) for i, gb in enumerate(sizes))


H100_SXM = CardModel("h100-sxm", "2330", 80)
A100_SXM = CardModel("a100-sxm", "20b0", 40)
RTX_A6000 = CardModel("rtx-a6000", "2230", 48, class_code="0x030000")  # a VGA-class GPU
L40S = CardModel("l40s", "26b9", 48, total_vfs=32, vgpu_types=_l40s_types())
T4 = CardModel(
    "t4",
    "1eb8",
    16,
    mdev_types=(
        MdevTypeSpec("nvidia-222", "GRID T4-1B", 16, "num_heads=4, frl_config=45"),
        MdevTypeSpec("nvidia-225", "GRID T4-4Q", 4, "num_heads=4, frl_config=60"),
        MdevTypeSpec("nvidia-228", "GRID T4-8Q", 2, "num_heads=4, frl_config=60"),
        MdevTypeSpec("nvidia-230", "GRID T4-16Q", 1, "num_heads=4, frl_config=60"),
    ),
)
# A GPU function of class 0x0380 (display controller, other): a GPU like any 0x03xx one.
H100_PCIE_OTHER_DISPLAY = CardModel("h100-pcie-other-display", "2331", 80, class_code="0x038000")
UNLISTED = CardModel("unlisted", "2bff", 24)  # no pci.ids line: named by its raw ID
NVIDIA_AUDIO = CardModel("nvidia-audio", "22ba", 0, class_code="0x040300")  # not a GPU
INTEL_NIC = CardModel("intel-nic", "1572", 0, class_code="0x020000", vendor_id="0x8086")
MODELS = {
    m.key: m
    for m in (
        H100_SXM,
        A100_SXM,
        RTX_A6000,
        L40S,
        T4,
        H100_PCIE_OTHER_DISPLAY,
        UNLISTED,
        NVIDIA_AUDIO,
        INTEL_NIC,
    )
}


@dataclass
class Gpu:
    """A compact description of one PCI function (and, on an SR-IOV PF, its VFs)."""

    address: str
    model: CardModel = H100_SXM
    driver: str | None = "vfio-pci"
    numa_node: int = 0
    iommu_group: int | None = None  # None: a group of its own
    vfs: int = 0  # VFs to enable
    profiles: Mapping[int, int | str] = field(default_factory=dict)  # VF index -> type ID/name
    mdevs: Sequence[tuple[str, str]] = ()  # (uuid, type dir)
    vf_catalog: str = "own"  # what a VF with a vGPU type lists: "own" or "header"


def _bdf(domain: int, bus: int, devfn: int) -> str:
    return f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}.{devfn & 7}"


def vf_address(pf: str, index: int) -> str:
    """The address of VF ``index`` (0-based) of ``pf`` under the fixture's offset and stride."""
    domain, bus, devfn = int(pf[0:4], 16), int(pf[5:7], 16), int(pf[8:10], 16) * 8 + int(pf[11])
    devfn += VF_OFFSET + index * VF_STRIDE
    return _bdf(domain, bus + devfn // 256, devfn % 256)


class SysfsTree:
    """A fixture tree below ``root``; every change keeps the dependent files consistent."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.cards: dict[str, CardModel] = {}
        self.vf_catalog: dict[str, str] = {}
        self.next_group = 10
        state = self.root / STATE_FILE
        if state.exists():
            data = json.loads(state.read_text())
            self.cards = {a: CardModel.from_dict(m) for a, m in data["cards"].items()}
            self.vf_catalog = dict(data["vf_catalog"])
            self.next_group = int(data["next_group"])

    @classmethod
    def open(cls, root: str | os.PathLike[str]) -> SysfsTree:
        """Reopen a tree built earlier, possibly by another process."""
        if not (Path(root) / STATE_FILE).exists():
            raise FileNotFoundError(f"{root} is not a sysfs fixture tree (no {STATE_FILE})")
        return cls(root)

    # --- paths -------------------------------------------------------------------------

    @property
    def pci_ids(self) -> Path:
        return self.root / PCI_IDS_PATH

    def device_dir(self, address: str) -> Path:
        return self.root / DEVICES_DIR / address

    def _save(self) -> None:
        data = {
            "cards": {a: asdict(m) for a, m in self.cards.items()},
            "vf_catalog": self.vf_catalog,
            "next_group": self.next_group,
        }
        (self.root / STATE_FILE).write_text(json.dumps(data, indent=1, sort_keys=True))

    # --- low-level writes (also for breaking a tree on purpose) ------------------------

    def write(self, address: str, relpath: str, content: str | bytes) -> Path:
        """Write one attribute file of a function as raw content."""
        path = self.device_dir(address) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def link(self, address: str, relpath: str, target: str) -> Path:
        """Create (or replace) a symlink in a function's directory, dangling or not."""
        path = self.device_dir(address) / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)
        return path

    def _symlink(self, path: Path, target: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.exists():
            path.unlink()
        path.symlink_to(target)

    # --- building ----------------------------------------------------------------------

    def add_function(
        self,
        address: str,
        model: CardModel,
        *,
        driver: str | None,
        numa_node: int = 0,
        iommu_group: int | None = None,
        physfn: str | None = None,
    ) -> None:
        """One PCI function with its identity, driver, IOMMU group and NUMA node."""
        if iommu_group is None:
            iommu_group = self.next_group
            self.next_group += 1
        else:
            self.next_group = max(self.next_group, iommu_group + 1)
        d = self.device_dir(address)
        d.mkdir(parents=True, exist_ok=True)
        for name, value in (
            ("vendor", model.vendor_id),
            ("device", "0x" + model.device_id),
            ("class", model.class_code),
            ("subsystem_vendor", model.vendor_id),
            ("subsystem_device", "0x0000"),
            ("numa_node", str(numa_node)),
            ("driver_override", "(null)"),
        ):
            (d / name).write_text(value + "\n")
        self._symlink(
            self.root / "sys/bus/pci/devices" / address, f"../../../devices/pci0000:00/{address}"
        )
        group = self.root / "sys/kernel/iommu_groups" / str(iommu_group)
        self._symlink(group / "devices" / address, f"../../../../devices/pci0000:00/{address}")
        self._symlink(d / "iommu_group", f"../../../kernel/iommu_groups/{iommu_group}")
        if physfn is not None:
            self._symlink(d / "physfn", f"../{physfn}")
        self.bind(address, driver)
        if model.total_vfs and physfn is None:
            self.cards[address] = model
            for name, value in (
                ("sriov_totalvfs", str(model.total_vfs)),
                ("sriov_numvfs", "0"),
                ("sriov_offset", str(VF_OFFSET)),
                ("sriov_stride", str(VF_STRIDE)),
            ):
                (d / name).write_text(value + "\n")
        if model.mdev_types:
            self.cards[address] = model
            for t in model.mdev_types:
                tdir = d / "mdev_supported_types" / t.type_dir
                (tdir / "devices").mkdir(parents=True, exist_ok=True)
                (tdir / "name").write_text(t.name + "\n")
                (tdir / "description").write_text(t.description + "\n")
                (tdir / "device_api").write_text("vfio-pci\n")
                (tdir / "create").write_text("")
            self._symlink(
                self.root / "sys/class/mdev_bus" / address, f"../../devices/pci0000:00/{address}"
            )
            self._refresh_mdev(address)
        if model.vgpu_types and physfn is None:
            self.refresh_card(address)
        self._save()

    def add_gpu(self, gpu: Gpu) -> None:
        """A GPU from its description: the function, then its VFs, profiles and mdevs."""
        self.vf_catalog[gpu.address] = gpu.vf_catalog
        self.add_function(
            gpu.address,
            gpu.model,
            driver=gpu.driver,
            numa_node=gpu.numa_node,
            iommu_group=gpu.iommu_group,
        )
        if gpu.vfs:
            self.enable_vfs(gpu.address, gpu.vfs)
        for index, profile in sorted(gpu.profiles.items()):
            self.set_vgpu_type(vf_address(gpu.address, index), self._type_id(gpu.address, profile))
        for uuid, type_dir in gpu.mdevs:
            self.create_mdev(gpu.address, type_dir, uuid)

    def _type_id(self, pf: str, profile: int | str) -> int:
        if isinstance(profile, int):
            return profile
        for t in self.cards[pf].vgpu_types:
            if t.name == profile:
                return t.type_id
        raise KeyError(f"{pf}: no vGPU type named {profile!r}")

    def write_pci_ids(self, text: str = PCI_IDS_FIXTURE) -> None:
        self.pci_ids.parent.mkdir(parents=True, exist_ok=True)
        self.pci_ids.write_text(text)

    # --- driver binding ----------------------------------------------------------------

    def driver_of(self, address: str) -> str | None:
        link = self.device_dir(address) / "driver"
        return os.path.basename(os.readlink(link)) if link.is_symlink() else None

    def bind(self, address: str, driver: str | None) -> None:
        """Bind a function to ``driver`` (None: unbind), with the driver's back link."""
        d = self.device_dir(address)
        old = self.driver_of(address)
        if old is not None:
            (d / "driver").unlink()
            back = self.root / "sys/bus/pci/drivers" / old / address
            if back.is_symlink():
                back.unlink()
        if driver is None:
            return
        ddir = self.root / "sys/bus/pci/drivers" / driver
        ddir.mkdir(parents=True, exist_ok=True)
        for name in ("bind", "unbind", "new_id"):
            if not (ddir / name).exists():
                (ddir / name).write_text("")
        self._symlink(ddir / address, f"../../../../devices/pci0000:00/{address}")
        self._symlink(d / "driver", f"../../../bus/pci/drivers/{driver}")

    # --- SR-IOV and vGPU ---------------------------------------------------------------

    def vfs_of(self, pf: str) -> list[str]:
        d = self.device_dir(pf)
        found = sorted(
            (int(p.name[len("virtfn") :]), os.path.basename(os.readlink(p)))
            for p in d.glob("virtfn*")
            if p.name[len("virtfn") :].isdigit()
        )
        return [address for _key, address in found]

    def enable_vfs(self, pf: str, count: int | None = None) -> list[str]:
        """Create ``count`` VFs (all of ``sriov_totalvfs`` by default), as the driver would."""
        model = self.cards.get(pf)
        if model is None or not model.total_vfs:
            raise OSError(errno.ENODEV, f"{pf} is not an SR-IOV physical function")
        count = model.total_vfs if count is None else count
        if not 0 <= count <= model.total_vfs:
            raise OSError(errno.ERANGE, f"{pf}: {count} VFs out of 0..{model.total_vfs}")
        current = self.vfs_of(pf)
        if current:
            if len(current) == count:
                return current
            raise OSError(errno.EBUSY, f"{pf}: {len(current)} VFs enabled; disable them first")
        if count == 0:
            return []
        numa = int((self.device_dir(pf) / "numa_node").read_text().strip())
        created = []
        for index in range(count):
            vf = vf_address(pf, index)
            self.add_function(vf, model, driver="nvidia", numa_node=numa, physfn=pf)
            self._symlink(self.device_dir(pf) / f"virtfn{index}", f"../{vf}")
            vdir = self.device_dir(vf) / "nvidia"
            vdir.mkdir(exist_ok=True)
            (vdir / "current_vgpu_type").write_text("0\n")
            (vdir / "vgpu_params").write_text("")
            created.append(vf)
        (self.device_dir(pf) / "sriov_numvfs").write_text(f"{count}\n")
        self.refresh_card(pf)
        self._save()
        return created

    def disable_vfs(self, pf: str) -> None:
        """Remove every VF of ``pf`` (writing 0 to ``sriov_numvfs``)."""
        for index, vf in enumerate(self.vfs_of(pf)):
            self.bind(vf, None)
            group = os.path.basename(os.readlink(self.device_dir(vf) / "iommu_group"))
            shutil.rmtree(self.root / "sys/kernel/iommu_groups" / group, ignore_errors=True)
            (self.root / "sys/bus/pci/devices" / vf).unlink(missing_ok=True)
            shutil.rmtree(self.device_dir(vf), ignore_errors=True)
            (self.device_dir(pf) / f"virtfn{index}").unlink(missing_ok=True)
        for stale in self.device_dir(pf).glob("virtfn*"):
            stale.unlink()
        (self.device_dir(pf) / "sriov_numvfs").write_text("0\n")
        self.refresh_card(pf)
        self._save()

    def current_vgpu_type(self, vf: str) -> int:
        return int((self.device_dir(vf) / "nvidia/current_vgpu_type").read_text().strip() or 0)

    def creatable_vgpu_types(self, address: str) -> list[int]:
        text = (self.device_dir(address) / "nvidia/creatable_vgpu_types").read_text()
        return [int(line.split(":")[0]) for line in text.splitlines()[1:] if line.strip()]

    def set_vgpu_type(self, vf: str, type_id: int) -> None:
        """Write ``current_vgpu_type`` as the driver takes it: a listed type on a free VF, or 0."""
        path = self.device_dir(vf) / "nvidia/current_vgpu_type"
        if not path.exists():
            raise OSError(errno.ENOENT, f"{vf} has no nvidia/current_vgpu_type")
        current = self.current_vgpu_type(vf)
        if type_id != 0:
            if current != 0:
                raise OSError(errno.EBUSY, f"{vf} already has vGPU type {current}")
            if type_id not in self.creatable_vgpu_types(vf):
                raise OSError(errno.EINVAL, f"{vf}: vGPU type {type_id} is not creatable")
        path.write_text(f"{type_id}\n")
        pf = os.path.basename(os.readlink(self.device_dir(vf) / "physfn"))
        self.refresh_card(pf)

    def refresh_card(self, pf: str) -> None:
        """Recompute the ``creatable_vgpu_types`` of a card's PF and VFs from what is in use."""
        model = self.cards[pf]
        vfs = self.vfs_of(pf)
        used = {vf: self.current_vgpu_type(vf) for vf in vfs}
        spent = sum(t.framebuffer_gb for t in map(model.vgpu_type, used.values()) if t)
        left = model.memory_gb - spent
        fitting = [t for t in model.vgpu_types if t.framebuffer_gb <= left]

        def listing(types: Iterable[VgpuTypeSpec]) -> str:
            return "".join([HEADER + "\n"] + [f"{t.type_id} : {t.name}\n" for t in types])

        pf_dir = self.device_dir(pf) / "nvidia"
        pf_dir.mkdir(exist_ok=True)
        (pf_dir / "creatable_vgpu_types").write_text(listing(fitting))
        catalog = self.vf_catalog.get(pf, "own")
        for vf, type_id in used.items():
            if type_id == 0:
                text = listing(fitting)
            elif catalog == "own":
                own = model.vgpu_type(type_id)
                text = listing([own] if own else [])
            else:
                text = listing([])
            (self.device_dir(vf) / "nvidia/creatable_vgpu_types").write_text(text)

    # --- mdev --------------------------------------------------------------------------

    def mdevs_of(self, parent: str) -> dict[str, str]:
        """uuid -> type dir of the mdevs below ``parent``."""
        found = {}
        for entry in self.device_dir(parent).iterdir():
            link = entry / "mdev_type"
            if entry.is_dir() and link.is_symlink():
                found[entry.name] = os.path.basename(os.readlink(link))
        return found

    def create_mdev(self, parent: str, type_dir: str, uuid: str) -> None:
        """Write ``uuid`` to a type's ``create``, as mdevctl does."""
        tdir = self.device_dir(parent) / "mdev_supported_types" / type_dir
        if not tdir.is_dir():
            raise OSError(errno.ENOENT, f"{parent}: no mdev type {type_dir}")
        if int((tdir / "available_instances").read_text()) < 1:
            raise OSError(errno.EDQUOT, f"{parent}: no {type_dir} instance available")
        d = self.device_dir(parent) / uuid
        d.mkdir()
        self._symlink(d / "mdev_type", f"../mdev_supported_types/{type_dir}")
        (d / "remove").write_text("")
        self._symlink(tdir / "devices" / uuid, f"../../../{uuid}")
        self._symlink(
            self.root / "sys/bus/mdev/devices" / uuid,
            f"../../../devices/pci0000:00/{parent}/{uuid}",
        )
        self._refresh_mdev(parent)

    def remove_mdev(self, uuid: str) -> None:
        """Write 1 to an mdev's ``remove``."""
        bus = self.root / "sys/bus/mdev/devices" / uuid
        parent = os.path.basename(os.path.dirname(os.readlink(bus)))
        type_dir = self.mdevs_of(parent)[uuid]
        (self.device_dir(parent) / "mdev_supported_types" / type_dir / "devices" / uuid).unlink()
        bus.unlink()
        shutil.rmtree(self.device_dir(parent) / uuid)
        self._refresh_mdev(parent)

    # --- running VMs: what QEMU holding VFIO devices open looks like from the host -----

    def start_vm(self, name: str, devices: Iterable[str], pid: int = 4242) -> int:
        """A QEMU process of VM ``name`` holding ``devices`` (PCI addresses, mdev UUIDs) open.

        ``proc/<pid>/cmdline`` carries ``-name guest=<name>`` (KubeVirt names the domain
        ``<namespace>_<vmi>``) and ``proc/<pid>/fd/`` one link per device to
        ``/dev/vfio/<its IOMMU group>`` (an mdev gets the group of its own the kernel gives
        it). A function on a vfio driver reads ``enable`` 1 while open, as vfio-pci enables
        the device at open. ``proc`` lives beside ``sys`` below the root.
        """
        proc = self.root / "proc" / str(pid)
        (proc / "fd").mkdir(parents=True, exist_ok=True)
        (proc / "cmdline").write_bytes(
            b"\0".join(
                [
                    b"/usr/bin/qemu-system-x86_64",
                    b"-name",
                    f"guest={name},debug-threads=on".encode(),
                ]
            )
            + b"\0"
        )
        for fd, device in enumerate(devices, start=20):
            if device.count(":") == 2:
                group = os.path.basename(os.readlink(self.device_dir(device) / "iommu_group"))
                if self.driver_of(device) in ("vfio-pci", "nvgrace_gpu_vfio_pci"):
                    self.write(device, "enable", "1\n")
            else:
                mdev = self.root / "sys/bus/mdev/devices" / device
                link = mdev / "iommu_group"
                if not link.is_symlink():
                    group_dir = self.root / "sys/kernel/iommu_groups" / str(self.next_group)
                    group_dir.mkdir(parents=True, exist_ok=True)
                    self._symlink(link, os.path.relpath(group_dir, mdev.resolve()))
                    self.next_group += 1
                    self._save()
                group = os.path.basename(os.readlink(link))
            self._symlink(proc / "fd" / str(fd), f"/dev/vfio/{group}")
        return pid

    def stop_vm(self, pid: int = 4242) -> None:
        """The QEMU process ends: its ``proc`` entry goes and its functions read ``enable`` 0."""
        proc = self.root / "proc" / str(pid)
        for fd in (proc / "fd").iterdir() if proc.exists() else ():
            group = os.path.basename(os.readlink(fd))
            members = self.root / "sys/kernel/iommu_groups" / group / "devices"
            for member in members.iterdir() if members.is_dir() else ():
                if (self.device_dir(member.name) / "enable").exists():
                    self.write(member.name, "enable", "0\n")
        shutil.rmtree(proc, ignore_errors=True)

    def _refresh_mdev(self, parent: str) -> None:
        model = self.cards[parent]
        in_use = self.mdevs_of(parent)
        for t in model.mdev_types:
            count = sum(1 for v in in_use.values() if v == t.type_dir)
            other = any(v != t.type_dir for v in in_use.values())
            left = 0 if other else t.max_instances - count
            (
                self.device_dir(parent)
                / "mdev_supported_types"
                / t.type_dir
                / "available_instances"
            ).write_text(f"{left}\n")


def build(
    root: str | os.PathLike[str],
    gpus: Iterable[Gpu],
    *,
    pci_ids: bool = True,
    others: Iterable[Gpu] = (),
) -> SysfsTree:
    """A fresh tree below ``root`` holding ``gpus`` (and non-GPU functions ``others``)."""
    tree = SysfsTree(root)
    tree.root.mkdir(parents=True, exist_ok=True)
    for name in (
        "sys/bus/pci/devices",
        "sys/bus/mdev/devices",
        "sys/kernel/iommu_groups",
        "sys/class/mdev_bus",
    ):
        (tree.root / name).mkdir(parents=True, exist_ok=True)
    if pci_ids:
        tree.write_pci_ids()
    for gpu in [*gpus, *others]:
        tree.add_gpu(gpu)
    tree._save()
    return tree


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cozystack_gpu_testkit.sysfs_tree",
        description=__doc__.split("\n", maxsplit=1)[0],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("enable-vfs", help="enable VFs on a PF (sriov-manage -e)")
    p.add_argument("root")
    p.add_argument("pf")
    p.add_argument("--count", type=int)
    p = sub.add_parser("disable-vfs", help="disable the VFs of a PF (sriov-manage -d)")
    p.add_argument("root")
    p.add_argument("pf")
    p = sub.add_parser("set-vgpu-type", help="write a VF's current_vgpu_type")
    p.add_argument("root")
    p.add_argument("vf")
    p.add_argument("type_id", type=int)
    p = sub.add_parser("start-vm", help="a QEMU process of VM NAME holding DEVICES open")
    p.add_argument("root")
    p.add_argument("name")
    p.add_argument("devices", nargs="+")
    p = sub.add_parser("stop-vm", help="the QEMU process of start-vm ends")
    p.add_argument("root")
    args = parser.parse_args(argv)
    try:
        if args.command == "enable-vfs":
            print("\n".join(SysfsTree.open(args.root).enable_vfs(args.pf, args.count)))
        elif args.command == "disable-vfs":
            SysfsTree.open(args.root).disable_vfs(args.pf)
        elif args.command == "start-vm":
            SysfsTree.open(args.root).start_vm(args.name, args.devices)
        elif args.command == "stop-vm":
            SysfsTree.open(args.root).stop_vm()
        else:
            SysfsTree.open(args.root).set_vgpu_type(args.vf, args.type_id)
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
