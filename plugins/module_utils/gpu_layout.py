# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout: which GPUs of a host are passthrough and which carry which vGPU profile.

One schema, one validator, one planner and one applier, used by the
``cozystack.gpu.gpu_node_layout`` and ``cozystack.gpu.vgpu_profile`` modules and, unchanged,
by the boot restore unit of the ``vgpu_layout`` role: VFs and vGPU profiles are gone after
every reboot, so the unit re-applies the layout with the same code as the module.

Schema (JSON or YAML; ``docs/node-layout.md`` carries the same text)::

    name: l40s-mixed                 # optional: the layout's name (node label value)
    gpus:                            # required: one entry per GPU this host declares
      - address: "0000:41:00.0"      # PCI address of the GPU (PF), domain optional,
                                     # or "GPU-<uuid>" as nvidia-smi prints it.
                                     # Never an index: indices shift on re-enumeration.
        mode: passthrough            # passthrough | vgpu
      - address: "81:00.0"
        mode: vgpu
        profile: NVIDIA L40S-24C     # vGPU type NAME for every VF (or every mdev) of the
                                     # card, resolved per card to its type ID
        count: 2                     # optional: exactly this many vGPUs; without it as many
                                     # as the card can hold (VFs / instances still creatable)
      - address: GPU-5e8b1c0a-1f2e-4d3c-9b8a-7f6e5d4c3b2a
        mode: vgpu
        vfs:                         # instead of profile: a profile per VF of THIS card
          "0000:c1:00.4": NVIDIA L40S-24C
          "0000:c1:00.5": NVIDIA L40S-12C

Rules (each refusal names the entry, e.g. ``gpus[2] (81:00.0): ...``): an address is a PCI
address or ``GPU-<uuid>``, never a bare number; no GPU twice once the PCI domain is
canonicalised (``01:00.0`` is ``0000:01:00.0``) and UUIDs are resolved; ``profile``,
``count`` and ``vfs`` only for ``vgpu``, which takes exactly one of ``profile`` and ``vfs``;
profiles by name (type IDs differ between cards) and only names the card offers; ``vfs`` keys
must be VFs of that same card. VFs a ``vfs`` map does not name are left as they are.

What the applier does, in order, and what it never does:

1. passthrough GPUs: ``driver_override`` = ``vfio-pci``, unbind, ``drivers_probe``. A GPU that
   carries vGPUs (a VF with a type, or an mdev) is never unbound: that would destroy them.
2. vgpu GPUs bound to vfio-pci go back to ``nvidia`` only with ``force`` (a VM may hold it).
3. SR-IOV VFs: ``sriov-manage -e <address>``, retried, and judged by ``sriov_numvfs`` alone,
   since it can exit 0 without creating any VF. VFs are never disabled.
4. Profiles: ``nvidia/current_vgpu_type`` read, compared, written and read back. A VF that
   carries another type is changed only with ``force``. mdev-based cards get mdevs with
   UUIDs derived from parent, type and ordinal, so a restore recreates the same UUIDs.
5. Nothing resets a GPU, disables VFs or reboots.

CLI (the boot restore unit runs this file as a script next to ``gpu_sysfs.py``)::

    python3 gpu_layout.py {validate,plan,apply} LAYOUT_FILE [--root /] [--force]
        [--sriov-manage /usr/lib/nvidia/sriov-manage] [--nvidia-smi nvidia-smi]
        [--retries 5] [--retry-delay 3]

``LAYOUT_FILE`` is JSON (YAML too when PyYAML is installed). ``--root`` is the directory
below which ``sys/bus/pci/devices`` is read (``/`` on a host, a fixture tree in tests). The
result is one JSON object on stdout; exit status 0 on success (``apply``: the layout is in
place), 1 when applying failed or did not converge, 2 when the layout is invalid for this
host or asks for a change that needs ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to gpu_sysfs.py
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_sysfs

__all__ = [
    "DEFAULT_NVIDIA_SMI",
    "DEFAULT_SRIOV_MANAGE",
    "MODES",
    "ApplyFailed",
    "ApplyResult",
    "GpuSpec",
    "Layout",
    "LayoutError",
    "NvidiaSmi",
    "Plan",
    "Step",
    "SysfsWriter",
    "apply_layout",
    "canonical_gpu_ref",
    "canonical_pci",
    "execute_steps",
    "host_summary",
    "load_layout_file",
    "main",
    "parse_layout",
    "plan_layout",
    "plan_vf_profiles",
    "predict_summary",
    "read_host",
    "resolve_layout",
]

DEFAULT_SRIOV_MANAGE = "/usr/lib/nvidia/sriov-manage"
DEFAULT_NVIDIA_SMI = "nvidia-smi"
MODE_PASSTHROUGH = "passthrough"
MODE_VGPU = "vgpu"
MODES = (MODE_PASSTHROUGH, MODE_VGPU)
VFIO_DRIVER = "vfio-pci"
NVIDIA_DRIVER = gpu_sysfs.NVIDIA_DRIVER

LAYOUT_KEYS = ("name", "gpus")
ENTRY_KEYS = ("address", "mode", "profile", "count", "vfs")

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

_INDEX = re.compile(r"^\s*[0-9]+\s*$")
_GPU_UUID = re.compile(
    r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
# nvidia-smi prints an eight-digit domain (00000000:41:00.0); sysfs uses four.
_LONG_DOMAIN = re.compile(r"^([0-9a-fA-F]{5,8}):(.+)$")


# --- addresses ---------------------------------------------------------------------------


def canonical_pci(text: object) -> str | None:
    """``0000:41:00.0`` for any spelling of a PCI address (no domain, 8-digit domain)."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    long_domain = _LONG_DOMAIN.match(text)
    if long_domain:
        domain = int(long_domain.group(1), 16)
        if domain > 0xFFFF:
            return None
        text = f"{domain:04x}:{long_domain.group(2)}"
    return gpu_sysfs.canonical_pci_address(text)


def canonical_gpu_ref(text: object) -> str | None:
    """A canonical PCI address, ``GPU-<uuid>`` in lower case, or None for anything else."""
    address = canonical_pci(text)
    if address is not None:
        return address
    if isinstance(text, str) and _GPU_UUID.match(text.strip()):
        return "GPU-" + text.strip()[4:].lower()
    return None


# --- schema ------------------------------------------------------------------------------


class LayoutError(Exception):
    """A layout that is malformed, does not fit the host, or needs ``force``.

    ``problems`` holds one message per bad entry, each naming it.
    """

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


@dataclass(frozen=True)
class GpuSpec:
    """One validated ``gpus`` entry. ``address`` is canonical; ``written`` as the user wrote it."""

    position: int
    address: str
    written: str
    mode: str
    profile: str | None = None
    count: int | None = None
    vfs: tuple[tuple[str, str], ...] = ()
    # How messages name the entry when it does not come from a layout's gpus list.
    named: str | None = None

    @property
    def label(self) -> str:
        return self.named or f"gpus[{self.position}] ({self.written})"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"address": self.address, "mode": self.mode}
        if self.profile is not None:
            data["profile"] = self.profile
        if self.count is not None:
            data["count"] = self.count
        if self.vfs:
            data["vfs"] = dict(self.vfs)
        return data


@dataclass(frozen=True)
class Layout:
    """A validated layout (the shape only; :func:`resolve_layout` checks it against a host)."""

    gpus: tuple[GpuSpec, ...]
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"gpus": [g.to_dict() for g in self.gpus]}
        if self.name is not None:
            data["name"] = self.name
        return data


def _address_problem(label: str, value: object, what: str) -> str | None:
    if isinstance(value, bool):
        return f"{label}: {what} must be a PCI address or GPU-<uuid>, not {value!r}"
    if isinstance(value, int) or (isinstance(value, str) and _INDEX.match(value)):
        return (
            f"{label}: {what} {value!r} looks like a GPU index; indices change when devices"
            " are re-enumerated, so name the GPU by PCI address (0000:41:00.0) or GPU-<uuid>"
        )
    if not isinstance(value, str) or not value.strip():
        return f"{label}: {what} is required: a PCI address (0000:41:00.0) or GPU-<uuid>"
    return None


def _profile_problem(label: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return f"{label}: a profile is a vGPU type name such as 'NVIDIA L40S-24C'"
    if isinstance(value, int) or _INDEX.match(value):
        return (
            f"{label}: profile {value!r} is a type ID; name the profile"
            " (e.g. 'NVIDIA L40S-24C'), since type IDs differ from card to card"
        )
    if not value.strip():
        return f"{label}: profile must not be empty"
    return None


def parse_layout(data: object) -> Layout:
    """Validate the shape of a layout document; raise :class:`LayoutError` naming bad entries."""
    problems: list[str] = []
    if not isinstance(data, Mapping):
        raise LayoutError(["layout: must be a mapping with a 'gpus' list"])
    unknown = sorted(str(k) for k in data if k not in LAYOUT_KEYS)
    if unknown:
        problems.append(f"layout: unknown keys {', '.join(unknown)} (known: name, gpus)")
    name = data.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        problems.append("layout: name must be a non-empty string")
    entries = data.get("gpus")
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise LayoutError([*problems, "layout: gpus must be a list"])

    specs: list[GpuSpec] = []
    seen: dict[str, str] = {}
    seen_vfs: dict[str, str] = {}
    for position, entry in enumerate(entries):
        label = f"gpus[{position}]"
        if not isinstance(entry, Mapping):
            problems.append(f"{label}: must be a mapping with address and mode")
            continue
        written = entry.get("address")
        if isinstance(written, (str, int)) and not isinstance(written, bool):
            label = f"gpus[{position}] ({written})"
        bad = sorted(str(k) for k in entry if k not in ENTRY_KEYS)
        if bad:
            problems.append(
                f"{label}: unknown keys {', '.join(bad)} (known: {', '.join(ENTRY_KEYS)})"
            )
        problem = _address_problem(label, written, "address")
        address = None if problem else canonical_gpu_ref(written)
        if problem:
            problems.append(problem)
        elif address is None:
            problems.append(
                f"{label}: address {written!r} is neither a PCI address (0000:41:00.0)"
                " nor GPU-<uuid>"
            )
        elif address in seen:
            problems.append(f"{label}: duplicate of {seen[address]} (both are {address})")
        else:
            seen[address] = label

        mode = entry.get("mode")
        if mode not in MODES:
            problems.append(f"{label}: mode must be passthrough or vgpu, not {mode!r}")
        profile = entry.get("profile")
        count = entry.get("count")
        vfs = entry.get("vfs")
        if mode == MODE_PASSTHROUGH:
            for key in ("profile", "count", "vfs"):
                if entry.get(key) is not None:
                    problems.append(
                        f"{label}: {key} is set for a passthrough GPU; a passthrough GPU"
                        " goes to a VM whole and carries no vGPU profile"
                    )
        elif mode == MODE_VGPU and (profile is None) == (vfs is None):
            problems.append(
                f"{label}: a vgpu GPU takes exactly one of profile (every VF of the card)"
                " and vfs (a profile per VF)"
            )
        if profile is not None:
            problem = _profile_problem(label, profile)
            if problem:
                problems.append(problem)
        if count is not None:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                problems.append(f"{label}: count must be a whole number of at least 1")
            elif vfs is not None:
                problems.append(f"{label}: count goes with profile, not with vfs")
        vf_items: list[tuple[str, str]] = []
        if vfs is not None:
            if not isinstance(vfs, Mapping) or not vfs:
                problems.append(f"{label}: vfs must map VF addresses to profile names")
            else:
                for vf_written, vf_profile in vfs.items():
                    vf_label = f"{label}: vfs[{vf_written}]"
                    problem = _address_problem(vf_label, vf_written, "VF address")
                    vf_address = None if problem else canonical_pci(vf_written)
                    if problem:
                        problems.append(problem)
                        continue
                    if vf_address is None:
                        problems.append(f"{vf_label}: not a PCI address")
                        continue
                    problem = _profile_problem(vf_label, vf_profile)
                    if problem:
                        problems.append(problem)
                        continue
                    if vf_address in seen_vfs:
                        problems.append(
                            f"{vf_label}: duplicate of {seen_vfs[vf_address]} (both are"
                            f" {vf_address})"
                        )
                        continue
                    seen_vfs[vf_address] = vf_label
                    vf_items.append((vf_address, str(vf_profile).strip()))
        if address is not None and mode in MODES:
            specs.append(
                GpuSpec(
                    position=position,
                    address=address,
                    written=str(written),
                    mode=str(mode),
                    profile=str(profile).strip() if isinstance(profile, str) else None,
                    count=count if isinstance(count, int) and not isinstance(count, bool) else None,
                    vfs=tuple(sorted(vf_items)),
                )
            )
    for vf_address, vf_label in seen_vfs.items():
        if vf_address in seen:
            problems.append(
                f"{vf_label}: {vf_address} is also declared as a GPU by {seen[vf_address]}"
            )
    if problems:
        raise LayoutError(problems)
    return Layout(gpus=tuple(specs), name=name.strip() if isinstance(name, str) else None)


def load_layout_file(path: str) -> object:
    """A layout document from a JSON file, or YAML when PyYAML is importable."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    try:
        return json.loads(text)
    except ValueError as json_error:
        try:
            import yaml  # optional: the restore unit writes JSON
        except ImportError:
            raise LayoutError([f"{path}: not JSON ({json_error}) and PyYAML is missing"]) from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as yaml_error:
            raise LayoutError([f"{path}: neither JSON nor YAML: {yaml_error}"]) from None


# --- the NVIDIA tools --------------------------------------------------------------------


class NvidiaSmiLike(Protocol):
    """What the resolver needs from nvidia-smi; tests pass a stand-in object."""

    def uuid_to_address(self, gpu_uuid: str) -> str | None: ...

    def supported_vgpu_types(self, address: str) -> dict[str, int]: ...


class NvidiaSmi:
    """GPU UUIDs and supported vGPU types from the ``nvidia-smi`` command.

    Only used where sysfs cannot answer: sysfs knows no GPU UUIDs, and a card whose VFs do
    not exist yet or are all in use lists no creatable types to resolve a profile name by.
    """

    def __init__(self, path: str = DEFAULT_NVIDIA_SMI, timeout: float = 60.0) -> None:
        self.path = path
        self.timeout = timeout
        self._uuids: dict[str, str] | None = None

    def _run(self, *args: str) -> str | None:
        try:
            done = subprocess.run(
                [self.path, *args],
                capture_output=True,
                text=True,
                timeout=self.timeout,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None

    def uuid_to_address(self, gpu_uuid: str) -> str | None:
        if self._uuids is None:
            self._uuids = {}
            out = self._run("--query-gpu=pci.bus_id,uuid", "--format=csv,noheader")
            for line in (out or "").splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2:
                    address, ref = canonical_pci(parts[0]), canonical_gpu_ref(parts[1])
                    if address and ref:
                        self._uuids[ref] = address
        return self._uuids.get(gpu_uuid)

    def supported_vgpu_types(self, address: str) -> dict[str, int]:
        """Profile name -> type ID, from ``nvidia-smi vgpu -s -v -i <address>``."""
        out = self._run("vgpu", "-s", "-v", "-i", address)
        types: dict[str, int] = {}
        type_id: int | None = None
        for line in (out or "").splitlines():
            key, _colon, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "vGPU Type ID":
                try:
                    type_id = int(value, 0)
                except ValueError:
                    type_id = None
            elif key == "Name" and type_id is not None:
                types.setdefault(value, type_id)
                type_id = None
        return types


# --- the host ----------------------------------------------------------------------------


def read_host(root: str) -> gpu_sysfs.Inventory:
    """The GPU inventory below ``root``, through the shared sysfs reader."""
    return gpu_sysfs.read_inventory(root)


def _vfs_of(
    inventory: Mapping[str, gpu_sysfs.GpuFunction], pf: gpu_sysfs.GpuFunction
) -> list[gpu_sysfs.GpuFunction]:
    if pf.sriov is None:
        return []
    return [inventory[a] for a in pf.sriov.vfs if a in inventory]


def _live_vgpus(
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

    spec: GpuSpec
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
    layout: Layout
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
    layout: Layout,
    inventory: gpu_sysfs.Inventory,
    nvidia: NvidiaSmiLike | None = None,
) -> Resolved:
    """Match every entry to its GPU and resolve profile names to this card's type IDs.

    Raises :class:`LayoutError` naming each entry that does not fit the host.
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
        if spec.mode == MODE_PASSTHROUGH:
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
        raise LayoutError(problems)
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


def _current_type(vf: gpu_sysfs.GpuFunction) -> int:
    return (vf.vgpu.current_type_id or 0) if vf.vgpu is not None else 0


def _creatable_ids(vf: gpu_sysfs.GpuFunction) -> set[int]:
    return {t.type_id for t in vf.vgpu.creatable} if vf.vgpu is not None else set()


class _Planner:
    def __init__(self, inventory: gpu_sysfs.Inventory, force: bool) -> None:
        self.functions = inventory.by_address()
        self.force = force
        self.plan = Plan()

    def step(self, action: str, target: str, gpu: str, reason: str, **extra: Any) -> None:
        self.plan.steps.append(Step(action=action, target=target, gpu=gpu, reason=reason, **extra))

    def refuse(self, message: str) -> None:
        self.plan.refusals.append(message)

    def passthrough(self, target: Target) -> None:
        gpu = target.gpu
        if gpu.driver == VFIO_DRIVER or gpu.driver in gpu_sysfs.VFIO_DRIVERS:
            return
        live = _live_vgpus(self.functions, gpu)
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
            if not self.force:
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
        return _current_type(vf)

    def _vf_can_take(self, target: Target, vf: gpu_sysfs.GpuFunction, wanted: int | str) -> bool:
        if target.kind == KIND_MDEV_VF:
            return any(
                t.type_id == wanted and (t.available_instances or 0) > 0 for t in vf.mdev_types
            )
        return wanted in _creatable_ids(vf)

    def vf_slot(self, target: Target, vf: gpu_sysfs.GpuFunction, profile: str, fill: bool) -> None:
        wanted = target.types.get(profile)
        if wanted is None:
            return
        current = self._vf_current(target, vf)
        if current == wanted:
            return
        if current and not self.force:
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
            raise LayoutError([f"{target.spec.label}: {profile!r} resolved to {wanted!r}"])
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
            if other and not self.force:
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
            if not self.force:
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
            if not self.force:
                self.refuse(
                    f"{label}: count {count} needs {need} more VFs, {len(chosen)} are free and"
                    f" {', '.join(v.address for v in other)} carry another type; set force to"
                    " replace them"
                )
                return
            chosen += other[: need - len(chosen)]
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
            old_type_id=_current_type(vf),
        )

    # Cards that are themselves the mdev parent: count mdevs of one type.
    def mdev_parent(self, target: Target) -> None:
        gpu, spec = target.gpu, target.spec
        label = spec.label
        if spec.profile is None:  # parse_layout guarantees one of profile and vfs
            raise LayoutError([f"{label}: a vgpu GPU needs a profile"])
        wanted = str(target.types[spec.profile])
        keep = [m for m in gpu.mdevs if m.type_id == wanted]
        other = [m for m in gpu.mdevs if m.type_id != wanted]
        if other:
            if not self.force:
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
                if not self.force:
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


def plan_layout(resolved: Resolved, inventory: gpu_sysfs.Inventory, force: bool = False) -> Plan:
    """The steps from the host's current state to the layout (pure: reads and writes nothing)."""
    planner = _Planner(inventory, force)
    for target in resolved.targets:
        if target.spec.mode == MODE_PASSTHROUGH:
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
) -> Plan:
    """Steps that give each VF in ``vfs`` the vGPU type named ``profile`` (None or "0": none).

    The name is resolved per VF against its own card's types. A VF carrying another type is
    refused unless ``force``; clearing a VF is what was asked for and needs no force. Raises
    :class:`LayoutError` for an address that is no SR-IOV vGPU VF or a name its card lacks.
    """
    functions = inventory.by_address()
    name = "" if profile is None else str(profile).strip()
    clear = name in ("", "0")
    problems: list[str] = []
    planner = _Planner(inventory, force)
    seen: set[str] = set()
    for written in vfs:
        address = canonical_pci(written)
        label = f"vfs[{written}]"
        if address is None:
            problems.append(
                _address_problem(label, written, "VF address") or f"{label}: not a PCI address"
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
        current = _current_type(vf)
        pf = functions.get(vf.physfn)
        target = Target(
            spec=GpuSpec(
                position=0, address=vf.physfn, written=str(written), mode=MODE_VGPU, named=label
            ),
            gpu=pf if pf is not None else vf,
            kind=KIND_SRIOV,
        )
        if clear:
            if current:
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
        raise LayoutError(problems)
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
            entry["vgpu_type"] = _current_type(gpu)
        if gpu.sriov is not None:
            entry["num_vfs"] = gpu.sriov.num_vfs or 0
            entry["vfs"] = {vf.address: _current_type(vf) for vf in _vfs_of(functions, gpu)}
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


# --- applying ----------------------------------------------------------------------------


class ApplyFailed(Exception):
    """A step that did not take effect; the message names the step and what sysfs shows."""


Runner = Callable[[Sequence[str]], "tuple[int, str]"]


def _run_command(argv: Sequence[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


class SysfsWriter:
    """Writes below the root. Tests subclass it to play the kernel's part on a fixture tree."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def write(self, path: str, value: str) -> None:
        with open(path, "w", encoding="ascii") as handle:
            handle.write(value)


def _device_path(writer: SysfsWriter, address: str, *parts: str) -> str:
    return writer.path(gpu_sysfs.PCI_DEVICES_DIR, address, *parts)


@dataclass
class ApplyResult:
    """What happened: the plan at the start, the steps run, and what is still missing."""

    layout: Layout
    plan: Plan
    done: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    remaining: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    check_mode: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.done) or (self.check_mode and bool(self.plan.steps))

    @property
    def ok(self) -> bool:
        return self.error is None and not self.remaining and not self.plan.refusals

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "ok": self.ok,
            "layout": self.layout.to_dict(),
            "plan": self.plan.to_dict(),
            "done": self.done,
            "skipped": self.skipped,
            "remaining": self.remaining,
            "error": self.error,
        }


class _Applier:
    def __init__(
        self,
        root: str,
        writer: SysfsWriter,
        sriov_manage: str,
        runner: Runner,
        retries: int,
        retry_delay: float,
        sleep: Callable[[float], None],
        log: Callable[[str], None],
    ) -> None:
        self.root = root
        self.writer = writer
        self.sriov_manage = sriov_manage
        self.runner = runner
        self.retries = max(retries, 1)
        self.retry_delay = retry_delay
        self.sleep = sleep
        self.log = log

    def function(self, address: str) -> gpu_sysfs.GpuFunction:
        function = gpu_sysfs.read_function(self.root, address)
        if function is None:
            raise ApplyFailed(f"{address} is gone from sysfs")
        return function

    def run(self, step: Step) -> str | None:
        """Run one step; a string back means it was skipped for that reason."""
        handler = getattr(self, "_" + step.action)
        result: str | None = handler(step)
        return result

    def _bind(self, step: Step, driver: str, override: str) -> None:
        current = self.function(step.target)
        if current.driver == driver:
            return
        if driver == VFIO_DRIVER:
            pf_inventory = {current.address: current}
            for vf_address in current.sriov.vfs if current.sriov else []:
                vf = gpu_sysfs.read_function(self.root, vf_address)
                if vf is not None:
                    pf_inventory[vf_address] = vf
            live = _live_vgpus(pf_inventory, current)
            if live:
                raise ApplyFailed(
                    f"{step.target} carries live vGPUs ({', '.join(live)}); not unbinding it"
                )
        self.writer.write(_device_path(self.writer, step.target, "driver_override"), override)
        if current.driver is not None:
            self.writer.write(
                _device_path(self.writer, step.target, "driver", "unbind"), step.target
            )
        self.writer.write(self.writer.path("sys/bus/pci/drivers_probe"), step.target)
        after = self.function(step.target).driver
        if after != driver:
            raise ApplyFailed(
                f"{step.target}: still bound to {after or 'no driver'} after binding to {driver}"
            )

    def _bind_vfio(self, step: Step) -> None:
        self._bind(step, VFIO_DRIVER, VFIO_DRIVER)

    def _bind_nvidia(self, step: Step) -> None:
        # An empty line clears driver_override, so the device matches nvidia by its ID again.
        self._bind(step, NVIDIA_DRIVER, "\n")

    def _enable_vfs(self, step: Step) -> str | None:
        output = ""
        for attempt in range(1, self.retries + 1):
            before = self.function(step.target)
            if before.sriov is not None and (before.sriov.num_vfs or 0) > 0:
                return None if attempt > 1 else "VFs already enabled"
            code, output = self.runner([self.sriov_manage, "-e", step.target])
            after = self.function(step.target)
            # Judged by sriov_numvfs only: sriov-manage can exit 0 without creating VFs.
            if after.sriov is not None and (after.sriov.num_vfs or 0) > 0:
                return None
            self.log(
                f"{step.target}: sriov-manage -e attempt {attempt}/{self.retries} exited"
                f" {code}, sriov_numvfs is still 0: {output}"
            )
            if attempt < self.retries:
                self.sleep(self.retry_delay)
        raise ApplyFailed(
            f"{step.target}: no VFs after {self.retries} sriov-manage -e attempts"
            f" (sriov_numvfs 0); last output: {output or '(none)'}"
        )

    def _type_file(self, address: str) -> str:
        return _device_path(self.writer, address, "nvidia", "current_vgpu_type")

    def _write_type(self, address: str, type_id: int) -> None:
        self.writer.write(self._type_file(address), f"{type_id}\n")
        now = _current_type(self.function(address))
        if now != type_id:
            raise ApplyFailed(f"{address}: current_vgpu_type reads {now} after writing {type_id}")

    def _clear_vgpu_type(self, step: Step) -> str | None:
        if _current_type(self.function(step.target)) == 0:
            return "already clear"
        self._write_type(step.target, 0)
        return None

    def _set_vgpu_type(self, step: Step) -> str | None:
        if step.type_id is None:
            raise ApplyFailed("a set_vgpu_type step without a type ID")
        vf = self.function(step.target)
        current = _current_type(vf)
        if current == step.type_id:
            return "already set"
        if current and current != step.old_type_id:
            raise ApplyFailed(
                f"{step.target}: carries type {current} now, not {step.old_type_id or 0} as"
                " planned; not changing it"
            )
        if current:
            self._write_type(step.target, 0)
            vf = self.function(step.target)
        if step.type_id not in _creatable_ids(vf):
            if step.fill:
                return f"card full: {step.profile} no longer creatable on this VF"
            raise ApplyFailed(
                f"{step.target}: {step.profile} ({step.type_id}) is not creatable on this VF"
                " (the card has no room left for it)"
            )
        self._write_type(step.target, step.type_id)
        return None

    def _create_mdev(self, step: Step) -> str | None:
        if step.mdev_type is None or step.mdev_uuid is None:
            raise ApplyFailed("a create_mdev step without type or UUID")
        parent = self.function(step.target)
        if any(m.uuid == step.mdev_uuid for m in parent.mdevs):
            return "already present"
        mtype = next((t for t in parent.mdev_types if t.type_id == step.mdev_type), None)
        if mtype is None or (mtype.available_instances or 0) < 1:
            if step.fill:
                return f"card full: no {step.profile} instance available"
            raise ApplyFailed(f"{step.target}: no instance of {step.profile} available")
        self.writer.write(
            _device_path(
                self.writer,
                step.target,
                "mdev_supported_types",
                step.mdev_type,
                "create",
            ),
            step.mdev_uuid,
        )
        if not os.path.exists(self.writer.path(gpu_sysfs.MDEV_DEVICES_DIR, step.mdev_uuid)):
            raise ApplyFailed(f"{step.target}: mdev {step.mdev_uuid} missing after create")
        return None

    def _remove_mdev(self, step: Step) -> str | None:
        if step.mdev_uuid is None:
            raise ApplyFailed("a remove_mdev step without a UUID")
        base = self.writer.path(gpu_sysfs.MDEV_DEVICES_DIR, step.mdev_uuid)
        if not os.path.exists(base):
            return "already gone"
        self.writer.write(os.path.join(base, "remove"), "1")
        if os.path.exists(base):
            raise ApplyFailed(f"mdev {step.mdev_uuid} still present after remove")
        return None


def execute_steps(
    steps: Sequence[Step],
    root: str = "/",
    *,
    writer: SysfsWriter | None = None,
    sriov_manage: str = DEFAULT_SRIOV_MANAGE,
    runner: Runner | None = None,
    retries: int = 5,
    retry_delay: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
    done: list[dict[str, Any]] | None = None,
    skipped: list[dict[str, Any]] | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run ``steps`` in order; ``(done, skipped)``, appended to the lists given, if any.

    Raises :class:`ApplyFailed` at the first step that does not take effect; the steps
    before it stay done (and are in ``done``).
    """
    applier = _Applier(
        root=root,
        writer=writer or SysfsWriter(root),
        sriov_manage=sriov_manage,
        runner=runner or _run_command,
        retries=retries,
        retry_delay=retry_delay,
        sleep=sleep,
        log=log or (lambda message: None),
    )
    done = [] if done is None else done
    skipped = [] if skipped is None else skipped
    for step in steps:
        if step.action == PENDING:
            continue
        try:
            reason = applier.run(step)
        except (OSError, ApplyFailed) as exc:
            message = str(exc)
            where = (
                step.action if message.startswith(step.target) else f"{step.action} {step.target}"
            )
            raise ApplyFailed(f"{where}: {message}") from exc
        if reason:
            skipped.append({**step.to_dict(), "skipped": reason})
        else:
            done.append(step.to_dict())
    return done, skipped


def apply_layout(
    layout: Layout,
    root: str = "/",
    *,
    force: bool = False,
    check_mode: bool = False,
    nvidia: NvidiaSmiLike | None = None,
    sriov_manage: str = DEFAULT_SRIOV_MANAGE,
    writer: SysfsWriter | None = None,
    runner: Runner | None = None,
    retries: int = 5,
    retry_delay: float = 3.0,
    sleep: Callable[[float], None] = time.sleep,
    log: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Validate ``layout`` against the host below ``root``, plan, and (unless check mode) apply.

    Raises :class:`LayoutError` when the layout does not fit the host. Refusals (changes
    that need ``force``) are reported in ``plan.refusals`` and stop the run before any write.
    Runs in rounds, since VF and mdev steps can only be planned once the card is bound and
    its VFs exist: at most three rounds, then one last read tells what is still missing.
    """
    inventory = read_host(root)
    resolved = resolve_layout(layout, inventory, nvidia)
    plan = plan_layout(resolved, inventory, force)
    result = ApplyResult(layout=layout, plan=plan, check_mode=check_mode)
    if check_mode or plan.refusals:
        return result
    current = plan
    for _round in range(3):
        try:
            execute_steps(
                current.steps,
                root,
                writer=writer,
                sriov_manage=sriov_manage,
                runner=runner,
                retries=retries,
                retry_delay=retry_delay,
                sleep=sleep,
                log=log,
                done=result.done,
                skipped=result.skipped,
            )
        except ApplyFailed as exc:
            result.error = str(exc)
            return result
        if not any(s.action == PENDING for s in current.steps):
            break
        inventory = read_host(root)
        try:
            resolved = resolve_layout(layout, inventory, nvidia)
        except LayoutError as exc:
            result.error = str(exc)
            return result
        current = plan_layout(resolved, inventory, force)
        if current.refusals:
            result.error = "; ".join(current.refusals)
            return result
    inventory = read_host(root)
    try:
        final = plan_layout(resolve_layout(layout, inventory, nvidia), inventory, force)
    except LayoutError as exc:
        result.error = str(exc)
        return result
    skipped_targets = {(s["action"], s["target"]) for s in result.skipped}
    result.remaining = [
        s.to_dict() for s in final.steps if not (s.fill and (s.action, s.target) in skipped_targets)
    ]
    return result


# --- the CLI -----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpu_layout.py",
        description="Validate, plan or apply a cozystack.gpu node layout on this host.",
    )
    parser.add_argument("command", choices=("validate", "plan", "apply"))
    parser.add_argument("layout", help="layout file (JSON, or YAML with PyYAML)")
    parser.add_argument("--root", default="/", help="directory holding sys/ (default /)")
    parser.add_argument("--force", action="store_true", help="replace other vGPU types")
    parser.add_argument("--sriov-manage", default=DEFAULT_SRIOV_MANAGE)
    parser.add_argument("--nvidia-smi", default=DEFAULT_NVIDIA_SMI)
    parser.add_argument("--retries", type=int, default=5)
    parser.add_argument("--retry-delay", type=float, default=3.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (0 ok, 1 apply failed, 2 invalid or refused)."""
    args = _parser().parse_args(argv)

    def emit(data: Mapping[str, Any]) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")

    def log(message: str) -> None:
        sys.stderr.write(f"gpu_layout: {message}\n")

    try:
        layout = parse_layout(load_layout_file(args.layout))
        if args.command == "validate":
            inventory = read_host(args.root)
            resolved = resolve_layout(layout, inventory, NvidiaSmi(args.nvidia_smi))
            emit({"ok": True, "layout": layout.to_dict(), "deferred": resolved.deferred})
            return 0
        result = apply_layout(
            layout,
            args.root,
            force=args.force,
            check_mode=args.command == "plan",
            nvidia=NvidiaSmi(args.nvidia_smi),
            sriov_manage=args.sriov_manage,
            retries=args.retries,
            retry_delay=args.retry_delay,
            log=log,
        )
    except LayoutError as exc:
        for problem in exc.problems:
            log(problem)
        emit({"ok": False, "problems": exc.problems})
        return 2
    except OSError as exc:
        log(str(exc))
        emit({"ok": False, "problems": [str(exc)]})
        return 2
    emit(result.to_dict())
    for refusal in result.plan.refusals:
        log(refusal)
    if result.plan.refusals:
        return 2
    if args.command == "plan":
        return 0
    if result.error:
        log(result.error)
    for step in result.remaining:
        log(f"not in place: {step['action']} {step['target']} ({step['reason']})")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
