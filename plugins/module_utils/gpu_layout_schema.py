# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The node layout's schema: the shape of a layout document, checked before any host is read.

Part of the layout code shared by the ``cozystack.gpu.gpu_node_layout`` module and the boot
restore unit (``gpu_layout.py`` tells the whole story); this file knows nothing of the host.

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
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_sysfs

__all__ = [
    "ENTRY_KEYS",
    "LAYOUT_KEYS",
    "MODES",
    "MODE_PASSTHROUGH",
    "MODE_VGPU",
    "GpuSpec",
    "Layout",
    "LayoutError",
    "address_problem",
    "canonical_gpu_ref",
    "canonical_pci",
    "load_layout_file",
    "parse_layout",
]

MODE_PASSTHROUGH = "passthrough"
MODE_VGPU = "vgpu"
MODES = (MODE_PASSTHROUGH, MODE_VGPU)

LAYOUT_KEYS = ("name", "gpus")
ENTRY_KEYS = ("address", "mode", "profile", "count", "vfs")

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


def address_problem(label: str, value: object, what: str) -> str | None:
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
        problem = address_problem(label, written, "address")
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
                    problem = address_problem(vf_label, vf_written, "VF address")
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
