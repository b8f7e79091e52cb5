# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout's plan: a layout matched to the GPUs of a host, and the steps that reach it.

Pure: an inventory read by ``gpu_sysfs`` comes in, steps and refusals go out; nothing here
reads or writes the host (``gpu_layout_apply.py`` runs the steps, ``gpu_layout.py`` ties the
two together). ``resolve_layout`` matches each entry to its GPU and resolves profile names
to the card's own type IDs; ``plan_layout`` turns the difference between the host and the
layout into :class:`Step` s, refusing what needs ``force`` or is never done (unbinding a
GPU that carries vGPUs). Steps that can only be planned once earlier ones have changed the
host (profiles on VFs that do not exist yet) are ``pending``.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

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
    "ACTION_ORDER",
    "BIND_NVIDIA",
    "BIND_VFIO",
    "CLEAR_VGPU_TYPE",
    "CREATE_MDEV",
    "ENABLE_VFS",
    "NVIDIA_DRIVER",
    "PENDING",
    "REMOVE_MDEV",
    "SET_VGPU_TYPE",
    "VFIO_DRIVER",
    "NvidiaSmiLike",
    "Plan",
    "Resolved",
    "Step",
    "Target",
    "creatable_ids",
    "current_type",
    "host_summary",
    "live_vgpus",
    "mdev_uuid",
    "plan_layout",
    "plan_vf_profiles",
    "predict_inventory",
    "predict_summary",
    "resolve_layout",
]

VFIO_DRIVER = "vfio-pci"
NVIDIA_DRIVER = gpu_sysfs.NVIDIA_DRIVER

# Step actions, in the order the applier runs them within a round.
BIND_VFIO = "bind_vfio"
BIND_NVIDIA = "bind_nvidia"
ENABLE_VFS = "enable_vfs"
CLEAR_VGPU_TYPE = "clear_vgpu_type"
SET_VGPU_TYPE = "set_vgpu_type"
REMOVE_MDEV = "remove_mdev"
CREATE_MDEV = "create_mdev"
# Not executed: work that can only be planned once earlier steps have changed the host.
PENDING = "pending"
ACTION_ORDER = (
    BIND_VFIO,
    BIND_NVIDIA,
    ENABLE_VFS,
    REMOVE_MDEV,
    CLEAR_VGPU_TYPE,
    SET_VGPU_TYPE,
    CREATE_MDEV,
    PENDING,
)

# Fixed namespace of the mdev UUIDs this code creates, so a restore recreates the same UUIDs.
MDEV_UUID_NAMESPACE = uuid.UUID("6f0b8f3e-6a52-4c4e-9d0b-3a1c7c1e5a10")


class NvidiaSmiLike(Protocol):
    """What the resolver needs from nvidia-smi; tests pass a stand-in object."""

    def uuid_to_address(self, gpu_uuid: str) -> str | None: ...

    def supported_vgpu_types(self, address: str) -> dict[str, int]: ...


def _vfs_of(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], pf: gpu_sysfs.GpuFunction
) -> list[gpu_sysfs.GpuFunction]:
    if pf.sriov is None:
        return []
    return [inventory[a] for a in pf.sriov.vfs if a in inventory]


def live_vgpus(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], pf: gpu_sysfs.GpuFunction
) -> list[str]:
    """What carries a vGPU on this card: VFs with a type, mdevs on the PF or its VFs."""
    live = [f"mdev {m.uuid}" for m in pf.mdevs]
    for vf in _vfs_of(inventory, pf):
        if vf.vgpu is not None and vf.vgpu.current_type_id:
            live.append(f"VF {vf.address} (type {vf.vgpu.current_type_id})")
        live.extend(f"mdev {m.uuid} on VF {vf.address}" for m in vf.mdevs)
    return live


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
    vfs = _vfs_of(inventory, gpu)
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


def _sriov_catalog(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], gpu: gpu_sysfs.GpuFunction
) -> dict[str, int]:
    """Profile name -> type ID from the creatable lists of this card only (IDs are per card)."""
    catalog: dict[str, int] = {}
    for function in [gpu, *_vfs_of(inventory, gpu)]:
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
        vfs = _vfs_of(functions, gpu)
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
        catalog = _sriov_catalog(functions, gpu)
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


# --- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One change to the host. ``target`` is the function written; ``gpu`` its card."""

    action: str
    target: str
    gpu: str
    reason: str
    type_id: int | None = None
    profile: str | None = None
    old_type_id: int | None = None
    mdev_type: str | None = None
    mdev_uuid: str | None = None
    # Fill steps give way when the card is full by the time they run (no count was asked).
    fill: bool = False

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "action": self.action,
            "target": self.target,
            "gpu": self.gpu,
            "reason": self.reason,
        }
        for key in ("type_id", "profile", "old_type_id", "mdev_type", "mdev_uuid"):
            value = getattr(self, key)
            if value is not None:
                data[key] = value
        if self.fill:
            data["fill"] = True
        return data


@dataclass
class Plan:
    """Steps to reach the layout, and refusals (changes that need ``force`` or never happen)."""

    steps: list[Step] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    deferred: list[str] = field(default_factory=list)

    @property
    def executable(self) -> list[Step]:
        return [s for s in self.steps if s.action != PENDING]

    def to_dict(self) -> dict[str, Any]:
        return {
            "steps": [s.to_dict() for s in self.steps],
            "refusals": list(self.refusals),
            "deferred": list(self.deferred),
        }


def mdev_uuid(parent: str, mdev_type: str, ordinal: int) -> str:
    """The UUID of the ``ordinal``-th mdev of a type on a parent: the same at every boot."""
    return str(uuid.uuid5(MDEV_UUID_NAMESPACE, f"{parent}/{mdev_type}/{ordinal}"))


def current_type(vf: gpu_sysfs.GpuFunction) -> int:
    return (vf.vgpu.current_type_id or 0) if vf.vgpu is not None else 0


def creatable_ids(vf: gpu_sysfs.GpuFunction) -> set[int]:
    return {t.type_id for t in vf.vgpu.creatable} if vf.vgpu is not None else set()


class _Planner:
    def __init__(
        self,
        inventory: gpu_sysfs.Inventory,
        force: bool,
        in_use: Mapping[str, Sequence[str]] | None = None,
        drained: bool = False,
    ) -> None:
        self.functions = inventory.by_address()
        self.force = force
        self.in_use = dict(in_use or {})
        self.drained = drained
        self.plan = Plan()

    @property
    def may_replace(self) -> bool:
        """A vGPU, or a GPU on vfio-pci, may be replaced: with force, or once a drain has moved
        every hold off the node (then only a running VM can still use it, see ``busy``)."""
        return self.force or self.drained

    def busy(self, label: str, what: str, devices: Sequence[str]) -> bool:
        """Refuse, and answer True, when a running VM uses one of ``devices`` (PCI addresses
        or mdev UUIDs) and force is off: nothing is reconfigured under a running VM."""
        used = [f"{d} (used by {', '.join(self.in_use[d])})" for d in devices if self.in_use.get(d)]
        if not used or self.force:
            return False
        self.refuse(
            f"{label}: {what} {'; '.join(used)}: a GPU or vGPU a running VM uses is never"
            " reset or reconfigured; stop the VM (or let the drain move its claim) first, or"
            " set force to break it"
        )
        return True

    def step(self, action: str, target: str, gpu: str, reason: str, **extra: Any) -> None:
        self.plan.steps.append(Step(action=action, target=target, gpu=gpu, reason=reason, **extra))

    def refuse(self, message: str) -> None:
        self.plan.refusals.append(message)

    def passthrough(self, target: Target) -> None:
        gpu = target.gpu
        if gpu.driver == VFIO_DRIVER or gpu.driver in gpu_sysfs.VFIO_DRIVERS:
            return
        live = live_vgpus(self.functions, gpu)
        if live:
            # Not even force: unbinding the card destroys every vGPU it carries.
            self.refuse(
                f"{target.spec.label}: declared passthrough but carries live vGPUs"
                f" ({', '.join(live)}); a GPU with live vGPUs is never unbound or reset."
                " Remove them first"
            )
            return
        self.step(BIND_VFIO, gpu.address, gpu.address, f"bound to {gpu.driver or 'no driver'}")

    def vgpu(self, target: Target) -> None:
        gpu, spec = target.gpu, target.spec
        if gpu.driver in gpu_sysfs.VFIO_DRIVERS:
            if self.busy(spec.label, f"declared vgpu, but on {gpu.driver}:", [gpu.address]):
                return
            if not self.may_replace:
                self.refuse(
                    f"{spec.label}: declared vgpu but bound to {gpu.driver}, where a VM may"
                    " hold it; set force to rebind it to nvidia"
                )
                return
            self.step(BIND_NVIDIA, gpu.address, gpu.address, f"bound to {gpu.driver}")
            self.step(PENDING, gpu.address, gpu.address, "vGPUs once nvidia drives the card")
            return
        if gpu.driver is None:
            self.step(BIND_NVIDIA, gpu.address, gpu.address, "bound to no driver")
            self.step(PENDING, gpu.address, gpu.address, "vGPUs once nvidia drives the card")
            return
        if target.kind == KIND_UNKNOWN:
            self.step(ENABLE_VFS, gpu.address, gpu.address, "no VFs enabled")
            self.step(PENDING, gpu.address, gpu.address, "profiles once the VFs exist")
            return
        if target.kind == KIND_MDEV:
            self.mdev_parent(target)
            return
        vfs = _vfs_of(self.functions, gpu)
        if spec.vfs:
            by_address = {vf.address: vf for vf in vfs}
            for vf_address, profile in spec.vfs:
                vf = by_address.get(vf_address)
                if vf is not None:
                    self.vf_slot(target, vf, profile, fill=False)
            return
        if spec.profile is not None:  # parse_layout guarantees one of profile and vfs
            self.vf_profile(target, vfs, spec.profile, spec.count)

    # SR-IOV and mdev-on-VF cards: one vGPU per VF.
    def _vf_current(self, target: Target, vf: gpu_sysfs.GpuFunction) -> int | str:
        if target.kind == KIND_MDEV_VF:
            return vf.mdevs[0].type_id or "?" if vf.mdevs else 0
        return current_type(vf)

    def _vf_can_take(self, target: Target, vf: gpu_sysfs.GpuFunction, wanted: int | str) -> bool:
        if target.kind == KIND_MDEV_VF:
            return any(
                t.type_id == wanted and (t.available_instances or 0) > 0 for t in vf.mdev_types
            )
        return wanted in creatable_ids(vf)

    def vf_slot(self, target: Target, vf: gpu_sysfs.GpuFunction, profile: str, fill: bool) -> None:
        wanted = target.types.get(profile)
        if wanted is None:
            return
        current = self._vf_current(target, vf)
        if current == wanted:
            return
        if current and self.busy(target.spec.label, f"replacing type {current}:", [vf.address]):
            return
        if current and not self.may_replace:
            self.refuse(
                f"{target.spec.label}: VF {vf.address} carries type {current}, not {profile!r}"
                f" ({wanted}); set force to replace it"
            )
            return
        self._write_vf(target, vf, profile, wanted, current, fill)

    def _write_vf(
        self,
        target: Target,
        vf: gpu_sysfs.GpuFunction,
        profile: str,
        wanted: int | str,
        current: int | str,
        fill: bool,
    ) -> None:
        gpu = target.gpu.address
        if target.kind == KIND_MDEV_VF:
            for mdev in vf.mdevs:
                self.step(
                    REMOVE_MDEV,
                    vf.address,
                    gpu,
                    "replaced (force)",
                    mdev_uuid=mdev.uuid,
                )
            self.step(
                CREATE_MDEV,
                vf.address,
                gpu,
                f"profile {profile}",
                profile=profile,
                mdev_type=str(wanted),
                mdev_uuid=mdev_uuid(vf.address, str(wanted), 0),
                fill=fill,
            )
            return
        if not isinstance(wanted, int):
            raise layout_schema.LayoutError(
                [f"{target.spec.label}: {profile!r} resolved to {wanted!r}"]
            )
        self.step(
            SET_VGPU_TYPE,
            vf.address,
            gpu,
            f"profile {profile}" + (" (replaces another type: force)" if current else ""),
            type_id=wanted,
            profile=profile,
            old_type_id=current if isinstance(current, int) else None,
            fill=fill,
        )

    def vf_profile(
        self,
        target: Target,
        vfs: list[gpu_sysfs.GpuFunction],
        profile: str,
        count: int | None,
    ) -> None:
        wanted = target.types.get(profile)
        if wanted is None:
            return
        label = target.spec.label
        keep = [vf for vf in vfs if self._vf_current(target, vf) == wanted]
        empty = [vf for vf in vfs if not self._vf_current(target, vf)]
        other = [vf for vf in vfs if vf not in keep and vf not in empty]
        if count is None:
            if other and self.busy(label, "replacing", [v.address for v in other]):
                return
            if other and not self.may_replace:
                self.refuse(
                    f"{label}: VFs {', '.join(v.address for v in other)} carry another type"
                    f" than {profile!r}; set force to replace them"
                )
                return
            for vf in other:
                self._write_vf(target, vf, profile, wanted, self._vf_current(target, vf), True)
            if other:
                # Replacing frees capacity the creatable lists do not show yet.
                self.step(PENDING, target.address, target.address, "fill once replaced")
                return
            for vf in empty:
                if self._vf_can_take(target, vf, wanted):
                    self._write_vf(target, vf, profile, wanted, 0, True)
            return
        if len(vfs) < count:
            self.refuse(f"{label}: count {count}, but the card has only {len(vfs)} VFs")
            return
        if len(keep) > count:
            extra = keep[count:]
            if self.busy(label, "removing the vGPU of", [v.address for v in extra]):
                return
            if not self.may_replace:
                self.refuse(
                    f"{label}: {len(keep)} VFs carry {profile!r}, count is {count}; set force"
                    f" to remove the vGPUs of {', '.join(v.address for v in extra)}"
                )
                return
            for vf in extra:
                self._clear_vf(target, vf, "beyond count (force)")
            return
        need = count - len(keep)
        chosen = empty[:need]
        if len(chosen) < need:
            replaced = other[: need - len(chosen)]
            if self.busy(label, "replacing", [v.address for v in replaced]):
                return
            if not self.may_replace:
                self.refuse(
                    f"{label}: count {count} needs {need} more VFs, {len(chosen)} are free and"
                    f" {', '.join(v.address for v in other)} carry another type; set force to"
                    " replace them"
                )
                return
            chosen += replaced
        for vf in chosen:
            self._write_vf(target, vf, profile, wanted, self._vf_current(target, vf), False)

    def _clear_vf(self, target: Target, vf: gpu_sysfs.GpuFunction, reason: str) -> None:
        gpu = target.gpu.address
        if target.kind == KIND_MDEV_VF:
            for mdev in vf.mdevs:
                self.step(REMOVE_MDEV, vf.address, gpu, reason, mdev_uuid=mdev.uuid)
            return
        self.step(
            CLEAR_VGPU_TYPE,
            vf.address,
            gpu,
            reason,
            type_id=0,
            old_type_id=current_type(vf),
        )

    # Cards that are themselves the mdev parent: count mdevs of one type.
    def mdev_parent(self, target: Target) -> None:
        gpu, spec = target.gpu, target.spec
        label = spec.label
        if spec.profile is None:  # parse_layout guarantees one of profile and vfs
            raise layout_schema.LayoutError([f"{label}: a vgpu GPU needs a profile"])
        wanted = str(target.types[spec.profile])
        keep = [m for m in gpu.mdevs if m.type_id == wanted]
        other = [m for m in gpu.mdevs if m.type_id != wanted]
        if other:
            if self.busy(label, "removing mdev", [m.uuid for m in other]):
                return
            if not self.may_replace:
                self.refuse(
                    f"{label}: mdevs {', '.join(m.uuid for m in other)} are of another type"
                    f" than {spec.profile!r}; set force to remove them"
                )
                return
            for mdev in other:
                self.step(
                    REMOVE_MDEV,
                    gpu.address,
                    gpu.address,
                    "other type (force)",
                    mdev_uuid=mdev.uuid,
                )
            # One type per GPU: the wanted type has instances only once the others are gone.
            self.step(PENDING, gpu.address, gpu.address, "mdevs once the others are removed")
            return
        mtype = next((t for t in gpu.mdev_types if t.type_id == wanted), None)
        available = (mtype.available_instances or 0) if mtype is not None else 0
        if spec.count is None:
            need, fill = available, True
        else:
            if len(keep) > spec.count:
                extra = keep[spec.count :]
                if self.busy(label, "removing mdev", [m.uuid for m in extra]):
                    return
                if not self.may_replace:
                    self.refuse(
                        f"{label}: {len(keep)} mdevs of {spec.profile!r}, count is"
                        f" {spec.count}; set force to remove {', '.join(m.uuid for m in extra)}"
                    )
                    return
                for mdev in extra:
                    self.step(
                        REMOVE_MDEV,
                        gpu.address,
                        gpu.address,
                        "beyond count (force)",
                        mdev_uuid=mdev.uuid,
                    )
            need, fill = max(spec.count - len(keep), 0), False
        existing = {m.uuid for m in gpu.mdevs}
        ordinal = 0
        for _count in range(need):
            while mdev_uuid(gpu.address, wanted, ordinal) in existing:
                ordinal += 1
            self.step(
                CREATE_MDEV,
                gpu.address,
                gpu.address,
                f"profile {spec.profile}",
                profile=spec.profile,
                mdev_type=wanted,
                mdev_uuid=mdev_uuid(gpu.address, wanted, ordinal),
                fill=fill,
            )
            ordinal += 1


def plan_layout(
    resolved: Resolved,
    inventory: gpu_sysfs.Inventory,
    force: bool = False,
    *,
    in_use: Mapping[str, Sequence[str]] | None = None,
    drained: bool = False,
) -> Plan:
    """The steps from the host's current state to the layout (pure: reads and writes nothing).

    ``in_use`` maps PCI addresses and mdev UUIDs a running VM uses to who uses it (see
    ``gpu_layout.read_users``): changing one needs ``force``, and the refusal names them.
    ``drained`` says every hold on the node's units has been moved off it (the cluster-aware
    drain): vGPUs no VM uses may then be replaced without ``force``.
    """
    planner = _Planner(inventory, force, in_use, drained)
    for target in resolved.targets:
        if target.spec.mode == layout_schema.MODE_PASSTHROUGH:
            planner.passthrough(target)
        else:
            planner.vgpu(target)
    planner.plan.deferred = list(resolved.deferred)
    order = {action: i for i, action in enumerate(ACTION_ORDER)}
    planner.plan.steps.sort(key=lambda s: order[s.action])  # stable within an action
    return planner.plan


def plan_vf_profiles(
    inventory: gpu_sysfs.Inventory,
    vfs: Sequence[str],
    profile: str | None,
    force: bool = False,
    nvidia: NvidiaSmiLike | None = None,
    in_use: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
    """Steps that give each VF in ``vfs`` the vGPU type named ``profile`` (None or "0": none).

    The name is resolved per VF against its own card's types. A VF carrying another type is
    refused unless ``force``; clearing a VF is what was asked for and needs no force, unless
    a running VM uses it (``in_use``, as for ``plan_layout``). Raises
    :class:`~gpu_layout_schema.LayoutError` for an address that is no SR-IOV vGPU VF or a name
    its card lacks.
    """
    functions = inventory.by_address()
    name = "" if profile is None else str(profile).strip()
    clear = name in ("", "0")
    problems: list[str] = []
    planner = _Planner(inventory, force, in_use)
    seen: set[str] = set()
    for written in vfs:
        address = layout_schema.canonical_pci(written)
        label = f"vfs[{written}]"
        if address is None:
            problems.append(
                layout_schema.address_problem(label, written, "VF address")
                or f"{label}: not a PCI address"
            )
            continue
        if address in seen:
            problems.append(f"{label}: listed twice (both are {address})")
            continue
        seen.add(address)
        vf = functions.get(address)
        if vf is None:
            problems.append(f"{label}: no NVIDIA GPU function at {address} on this host")
            continue
        if vf.physfn is None or vf.vgpu is None:
            problems.append(f"{label}: {address} is not an SR-IOV vGPU VF (no physfn or nvidia/)")
            continue
        current = current_type(vf)
        pf = functions.get(vf.physfn)
        target = Target(
            spec=layout_schema.GpuSpec(
                position=0,
                address=vf.physfn,
                written=str(written),
                mode=layout_schema.MODE_VGPU,
                named=label,
            ),
            gpu=pf if pf is not None else vf,
            kind=KIND_SRIOV,
        )
        if clear:
            if current and not planner.busy(label, "clearing", [address]):
                planner.step(
                    CLEAR_VGPU_TYPE, address, vf.physfn, "cleared", type_id=0, old_type_id=current
                )
            continue
        catalog = _sriov_catalog(functions, pf) if pf is not None else {}
        if name not in catalog and nvidia is not None:
            catalog.update(
                {
                    k: v
                    for k, v in nvidia.supported_vgpu_types(vf.physfn).items()
                    if k not in catalog
                }
            )
        if name not in catalog:
            problems.append(
                f"{label}: profile {name!r} is not a vGPU type of card {vf.physfn}"
                f" (offered: {', '.join(sorted(catalog)) or 'none'})"
            )
            continue
        target.types[name] = catalog[name]
        planner.vf_slot(target, vf, name, fill=False)
    if problems:
        raise layout_schema.LayoutError(problems)
    return planner.plan


def host_summary(
    inventory: gpu_sysfs.Inventory, addresses: Sequence[str]
) -> dict[str, dict[str, Any]]:
    """What matters of each GPU in ``addresses`` (and its VFs), for diffs and reports."""
    functions = inventory.by_address()
    summary: dict[str, dict[str, Any]] = {}
    for address in addresses:
        gpu = functions.get(address)
        if gpu is None:
            continue
        entry: dict[str, Any] = {"driver": gpu.driver}
        if gpu.physfn is not None and gpu.vgpu is not None:
            entry["vgpu_type"] = current_type(gpu)
        if gpu.sriov is not None:
            entry["num_vfs"] = gpu.sriov.num_vfs or 0
            entry["vfs"] = {vf.address: current_type(vf) for vf in _vfs_of(functions, gpu)}
        if gpu.mdev_types:
            entry["mdevs"] = {m.uuid: m.type_id for m in gpu.mdevs}
        summary[address] = entry
    return summary


def predict_summary(summary: Mapping[str, Mapping[str, Any]], plan: Plan) -> dict[str, Any]:
    """``summary`` as it will read once the executable steps of ``plan`` have run."""
    after: dict[str, dict[str, Any]] = json.loads(json.dumps(summary))
    for step in plan.steps:
        entry = after.setdefault(step.gpu, {})
        if step.action == BIND_VFIO:
            entry["driver"] = VFIO_DRIVER
        elif step.action == BIND_NVIDIA:
            entry["driver"] = NVIDIA_DRIVER
        elif step.action == ENABLE_VFS:
            entry["num_vfs"] = "enabled by sriov-manage"
        elif step.action in (SET_VGPU_TYPE, CLEAR_VGPU_TYPE):
            if step.target == step.gpu or step.gpu not in after:
                entry["vgpu_type"] = step.type_id
            else:
                entry.setdefault("vfs", {})[step.target] = step.type_id
            if step.target in after:
                after[step.target]["vgpu_type"] = step.type_id
        elif step.action == CREATE_MDEV and step.mdev_uuid:
            entry.setdefault("mdevs", {})[step.mdev_uuid] = step.mdev_type
        elif step.action == REMOVE_MDEV and step.mdev_uuid:
            entry.setdefault("mdevs", {}).pop(step.mdev_uuid, None)
        elif step.action == PENDING:
            entry["pending"] = step.reason
    return after


def _passthrough_resource(function: gpu_sysfs.GpuFunction) -> str | None:
    """What the device plugin would advertise ``function`` as on vfio-pci (see gpu_sysfs)."""
    if function.device_id is None:
        return None
    listed = function.model if function.model != function.device_id else None
    name = gpu_sysfs.passthrough_name(listed) if listed else ""
    return gpu_sysfs.resource_name(name or function.device_id)


def predict_inventory(
    inventory: gpu_sysfs.Inventory, plan: Plan
) -> tuple[gpu_sysfs.Inventory, list[str]]:
    """``inventory`` as it will read once ``plan`` has run, and the GPUs it cannot foresee.

    Drivers, vGPU types (named from the steps' profiles), mdevs and the resource names the
    device plugin derives from them follow the executable steps. A GPU with a ``pending``
    step (VFs still to enable, a card to refill once replaced) is listed as unforeseen: how
    many vGPUs it ends with depends on what the card offers then.
    """
    after = copy.deepcopy(inventory)
    functions = after.by_address()
    unsure: list[str] = []
    for step in plan.steps:
        function = functions.get(step.target)
        if step.action == PENDING:
            if step.gpu not in unsure:
                unsure.append(step.gpu)
            continue
        if function is None:
            continue
        if step.action == BIND_VFIO:
            function.driver = VFIO_DRIVER
            function.resource_name = _passthrough_resource(function)
        elif step.action == BIND_NVIDIA:
            function.driver = NVIDIA_DRIVER
            function.resource_name = None
        elif step.action in (SET_VGPU_TYPE, CLEAR_VGPU_TYPE):
            if function.vgpu is None:
                function.vgpu = gpu_sysfs.VendorVgpu()
            function.vgpu.current_type_id = step.type_id or 0
            name = step.profile if step.type_id else None
            function.vgpu_type_name = name
            function.resource_name = (
                gpu_sysfs.resource_name(gpu_sysfs.vgpu_type_name(name)) if name else None
            )
        elif step.action == REMOVE_MDEV:
            function.mdevs = [m for m in function.mdevs if m.uuid != step.mdev_uuid]
            after.mdevs = [m for m in after.mdevs if m.uuid != step.mdev_uuid]
        elif step.action == CREATE_MDEV and step.mdev_uuid:
            name = step.profile or ""
            mdev = gpu_sysfs.MdevDevice(
                uuid=step.mdev_uuid,
                parent=function.address,
                type_id=step.mdev_type,
                type_name=name or None,
                resource_name=(
                    gpu_sysfs.resource_name(gpu_sysfs.vgpu_type_name(name)) if name else None
                ),
            )
            function.mdevs.append(mdev)
            after.mdevs.append(mdev)
        if step.action in (REMOVE_MDEV, CREATE_MDEV) and function.driver != VFIO_DRIVER:
            served = {m.resource_name for m in function.mdevs if m.resource_name}
            function.resource_name = served.pop() if len(served) == 1 else None
    return after, unsure
