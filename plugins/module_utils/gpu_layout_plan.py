# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout's plan: the steps from a host's current state to its resolved layout.

Pure: targets resolved by ``gpu_layout_resolve.py`` and the inventory come in, steps and
refusals go out; nothing here reads or writes the host (``gpu_layout_apply.py`` runs the
steps, ``gpu_layout.py`` ties the parts together). ``plan_layout`` turns the difference
between the host and the layout into :class:`Step` s, refusing what needs ``force`` or is
never done (unbinding a GPU that carries vGPUs). Steps that can only be planned once earlier
ones have changed the host (profiles on VFs that do not exist yet) are ``pending``.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_layout_resolve as layout_resolve
    import gpu_layout_schema as layout_schema
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_resolve as layout_resolve,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_schema as layout_schema,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_layout_resolve as layout_resolve
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
    "Plan",
    "Step",
    "mdev_uuid",
    "plan_layout",
    "plan_vf_profiles",
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

    def passthrough(self, target: layout_resolve.Target) -> None:
        gpu = target.gpu
        if gpu.driver == VFIO_DRIVER or gpu.driver in gpu_sysfs.VFIO_DRIVERS:
            return
        live = layout_resolve.live_vgpus(self.functions, gpu)
        if live:
            # Not even force: unbinding the card destroys every vGPU it carries.
            self.refuse(
                f"{target.spec.label}: declared passthrough but carries live vGPUs"
                f" ({', '.join(live)}); a GPU with live vGPUs is never unbound or reset."
                " Remove them first"
            )
            return
        self.step(BIND_VFIO, gpu.address, gpu.address, f"bound to {gpu.driver or 'no driver'}")

    def vgpu(self, target: layout_resolve.Target) -> None:
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
        if target.kind == layout_resolve.KIND_UNKNOWN:
            self.step(ENABLE_VFS, gpu.address, gpu.address, "no VFs enabled")
            self.step(PENDING, gpu.address, gpu.address, "profiles once the VFs exist")
            return
        if target.kind == layout_resolve.KIND_MDEV:
            self.mdev_parent(target)
            return
        vfs = layout_resolve.vfs_of(self.functions, gpu)
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
    def _vf_current(self, target: layout_resolve.Target, vf: gpu_sysfs.GpuFunction) -> int | str:
        if target.kind == layout_resolve.KIND_MDEV_VF:
            return vf.mdevs[0].type_id or "?" if vf.mdevs else 0
        return layout_resolve.current_type(vf)

    def _vf_can_take(
        self, target: layout_resolve.Target, vf: gpu_sysfs.GpuFunction, wanted: int | str
    ) -> bool:
        if target.kind == layout_resolve.KIND_MDEV_VF:
            return any(
                t.type_id == wanted and (t.available_instances or 0) > 0 for t in vf.mdev_types
            )
        return wanted in layout_resolve.creatable_ids(vf)

    def vf_slot(
        self, target: layout_resolve.Target, vf: gpu_sysfs.GpuFunction, profile: str, fill: bool
    ) -> None:
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
        target: layout_resolve.Target,
        vf: gpu_sysfs.GpuFunction,
        profile: str,
        wanted: int | str,
        current: int | str,
        fill: bool,
    ) -> None:
        gpu = target.gpu.address
        if target.kind == layout_resolve.KIND_MDEV_VF:
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
        target: layout_resolve.Target,
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

    def _clear_vf(
        self, target: layout_resolve.Target, vf: gpu_sysfs.GpuFunction, reason: str
    ) -> None:
        gpu = target.gpu.address
        if target.kind == layout_resolve.KIND_MDEV_VF:
            for mdev in vf.mdevs:
                self.step(REMOVE_MDEV, vf.address, gpu, reason, mdev_uuid=mdev.uuid)
            return
        self.step(
            CLEAR_VGPU_TYPE,
            vf.address,
            gpu,
            reason,
            type_id=0,
            old_type_id=layout_resolve.current_type(vf),
        )

    # Cards that are themselves the mdev parent: count mdevs of one type.
    def mdev_parent(self, target: layout_resolve.Target) -> None:
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
    resolved: layout_resolve.Resolved,
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
    nvidia: layout_resolve.NvidiaSmiLike | None = None,
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
        current = layout_resolve.current_type(vf)
        pf = functions.get(vf.physfn)
        target = layout_resolve.Target(
            spec=layout_schema.GpuSpec(
                position=0,
                address=vf.physfn,
                written=str(written),
                mode=layout_schema.MODE_VGPU,
                named=label,
            ),
            gpu=pf if pf is not None else vf,
            kind=layout_resolve.KIND_SRIOV,
        )
        if clear:
            if current and not planner.busy(label, "clearing", [address]):
                planner.step(
                    CLEAR_VGPU_TYPE, address, vf.physfn, "cleared", type_id=0, old_type_id=current
                )
            continue
        catalog = layout_resolve.sriov_catalog(functions, pf) if pf is not None else {}
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
