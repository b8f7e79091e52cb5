# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout matched to a host: each entry to its GPU, each profile name to a type ID.

Pure: a parsed layout (``gpu_layout_schema``) and an inventory read by ``gpu_sysfs`` come
in, :class:`Resolved` targets or a :class:`~gpu_layout_schema.LayoutError` naming every
entry that does not fit the host go out. Type IDs are per card, so names are resolved
against the card's own creatable lists (or nvidia-smi); names on an SR-IOV card whose VFs
do not exist yet are ``deferred``. The readers of what a card carries (its VFs, their
types, its live vGPUs) live here too, since the planner and the prediction ask the same
questions. ``gpu_layout_plan.py`` turns the targets into steps.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import gpu_layout_schema as layout_schema
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_schema as layout_schema,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_layout_schema as layout_schema
        import gpu_sysfs

__all__ = [
    "KIND_MDEV",
    "KIND_MDEV_VF",
    "KIND_SRIOV",
    "KIND_UNKNOWN",
    "NvidiaSmiLike",
    "Resolved",
    "Target",
    "creatable_ids",
    "current_type",
    "live_vgpus",
    "resolve_layout",
    "sriov_catalog",
    "vfs_of",
]


class NvidiaSmiLike(Protocol):
    """What the resolver needs from nvidia-smi; tests pass a stand-in object."""

    def uuid_to_address(self, gpu_uuid: str) -> str | None: ...

    def supported_vgpu_types(self, address: str) -> dict[str, int]: ...


def vfs_of(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], pf: gpu_sysfs.GpuFunction
) -> list[gpu_sysfs.GpuFunction]:
    """The VFs of ``pf`` the inventory holds (sysfs may list VFs not read yet)."""
    if pf.sriov is None:
        return []
    return [inventory[a] for a in pf.sriov.vfs if a in inventory]


def live_vgpus(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], pf: gpu_sysfs.GpuFunction
) -> list[str]:
    """What carries a vGPU on this card: VFs with a type, mdevs on the PF or its VFs."""
    live = [f"mdev {m.uuid}" for m in pf.mdevs]
    for vf in vfs_of(inventory, pf):
        if vf.vgpu is not None and vf.vgpu.current_type_id:
            live.append(f"VF {vf.address} (type {vf.vgpu.current_type_id})")
        live.extend(f"mdev {m.uuid} on VF {vf.address}" for m in vf.mdevs)
    return live


def current_type(vf: gpu_sysfs.GpuFunction) -> int:
    """The vGPU type ID the VF carries; 0 for none, and for a function without nvidia/."""
    return (vf.vgpu.current_type_id or 0) if vf.vgpu is not None else 0


def creatable_ids(vf: gpu_sysfs.GpuFunction) -> set[int]:
    """The type IDs the VF can take now (the creatable list shrinks as the card fills)."""
    return {t.type_id for t in vf.vgpu.creatable} if vf.vgpu is not None else set()


# Kinds of vGPU card.
KIND_SRIOV = "sriov"  # VFs with nvidia/current_vgpu_type (vGPU 17+, Ada/Hopper/Blackwell)
KIND_MDEV_VF = "mdev-vf"  # VFs that are mdev parents (older kernels)
KIND_MDEV = "mdev"  # the GPU itself is the mdev parent (pre-Ada cards)
KIND_UNKNOWN = "unknown"  # SR-IOV card whose VFs do not exist yet


@dataclass
class Target:
    """One layout entry matched to its GPU on this host."""

    spec: layout_schema.GpuSpec
    gpu: gpu_sysfs.GpuFunction
    kind: str | None = None  # None for passthrough
    # profile name -> card-local ID: a decimal type ID (sriov) or an mdev type directory.
    types: dict[str, int | str] = field(default_factory=dict)
    # profile names not resolvable yet (no VFs, no nvidia-smi answer): checked after enabling.
    deferred: list[str] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.gpu.address


@dataclass
class Resolved:
    layout: layout_schema.Layout
    targets: list[Target]
    deferred: list[str]


def _card_kind(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], gpu: gpu_sysfs.GpuFunction
) -> str | None:
    vfs = vfs_of(inventory, gpu)
    if vfs:
        if any(vf.vgpu is not None for vf in vfs):
            return KIND_SRIOV
        if any(vf.mdev_types for vf in vfs):
            return KIND_MDEV_VF
    if gpu.mdev_types:
        return KIND_MDEV
    if gpu.sriov is not None and (gpu.sriov.total_vfs or 0) > 0:
        return KIND_UNKNOWN if not vfs else None
    return None


def sriov_catalog(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], gpu: gpu_sysfs.GpuFunction
) -> dict[str, int]:
    """Profile name -> type ID from the creatable lists of this card only (IDs are per card)."""
    catalog: dict[str, int] = {}
    for function in [gpu, *vfs_of(inventory, gpu)]:
        if function.vgpu is not None:
            for vtype in function.vgpu.creatable:
                catalog.setdefault(vtype.name, vtype.type_id)
    return catalog


def _mdev_catalog(functions: Sequence[gpu_sysfs.GpuFunction]) -> dict[str, str]:
    catalog: dict[str, str] = {}
    for function in functions:
        for mtype in function.mdev_types:
            if mtype.name:
                catalog.setdefault(mtype.name, mtype.type_id)
    return catalog


def resolve_layout(
    layout: layout_schema.Layout,
    inventory: gpu_sysfs.Inventory,
    nvidia: NvidiaSmiLike | None = None,
) -> Resolved:
    """Match every entry to its GPU and resolve profile names to this card's type IDs.

    Raises :class:`layout_schema.LayoutError` naming each entry that does not fit the host.
    """
    functions = inventory.by_address()
    problems: list[str] = []
    deferred: list[str] = []
    targets: list[Target] = []
    claimed: dict[str, str] = {}
    for spec in layout.gpus:
        address = spec.address
        if spec.address.startswith("GPU-"):
            resolved = nvidia.uuid_to_address(spec.address) if nvidia is not None else None
            if resolved is None:
                problems.append(f"{spec.label}: no GPU with this UUID on this host (nvidia-smi)")
                continue
            address = resolved
        if address in claimed:
            problems.append(f"{spec.label}: duplicate of {claimed[address]} (both are {address})")
            continue
        claimed[address] = spec.label
        gpu = functions.get(address)
        if gpu is None:
            problems.append(f"{spec.label}: no NVIDIA GPU at {address} on this host")
            continue
        if gpu.is_vf:
            problems.append(
                f"{spec.label}: {address} is a VF of {gpu.physfn}; declare the card by its"
                " physical function and its VFs under vfs"
            )
            continue
        target = Target(spec=spec, gpu=gpu)
        targets.append(target)
        if spec.mode == layout_schema.MODE_PASSTHROUGH:
            continue
        kind = _card_kind(functions, gpu)
        if kind is None:
            problems.append(
                f"{spec.label}: mode vgpu, but {address} offers neither SR-IOV VFs nor mdev"
                " types (is the NVIDIA vGPU host driver loaded?)"
            )
            continue
        target.kind = kind
        vfs = vfs_of(functions, gpu)
        for vf_address, _profile in spec.vfs:
            vf = functions.get(vf_address)
            if vf is not None and vf.physfn != address:
                owner = f"a VF of {vf.physfn}" if vf.physfn else "not a VF"
                problems.append(
                    f"{spec.label}: vfs[{vf_address}] is {owner}, not of this GPU ({address})"
                )
            elif vf is None and vfs:
                problems.append(f"{spec.label}: vfs[{vf_address}] is no VF of {address}")
            elif vf is None:
                deferred.append(f"{spec.label}: vfs[{vf_address}] is checked once the VFs exist")
        wanted = sorted({p for _vf, p in spec.vfs} | ({spec.profile} if spec.profile else set()))
        if kind in (KIND_MDEV, KIND_MDEV_VF):
            mdev_catalog = _mdev_catalog([gpu] if kind == KIND_MDEV else vfs)
            for name in wanted:
                if name in mdev_catalog:
                    target.types[name] = mdev_catalog[name]
                else:
                    problems.append(
                        f"{spec.label}: profile {name!r} is not an mdev type of this card"
                        f" (offered: {', '.join(sorted(mdev_catalog)) or 'none'})"
                    )
            continue
        catalog = sriov_catalog(functions, gpu)
        missing = [name for name in wanted if name not in catalog]
        if missing and nvidia is not None:
            for name, type_id in nvidia.supported_vgpu_types(address).items():
                catalog.setdefault(name, type_id)
        for name in wanted:
            if name in catalog:
                target.types[name] = catalog[name]
            elif kind == KIND_UNKNOWN:
                target.deferred.append(name)
                deferred.append(f"{spec.label}: profile {name!r} is resolved once the VFs exist")
            else:
                problems.append(
                    f"{spec.label}: profile {name!r} is not a vGPU type of this card"
                    f" (offered: {', '.join(sorted(catalog)) or 'none'})"
                )
    if problems:
        raise layout_schema.LayoutError(problems)
    return Resolved(layout=layout, targets=targets, deferred=deferred)
