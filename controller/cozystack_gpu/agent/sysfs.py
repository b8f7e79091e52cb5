# Copyright: cozystack.gpu contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""NVIDIA GPU inventory read from sysfs: one reader for the gpu_facts module and the node agent.

The host layer (``gpu_facts``) and the node agent in the cluster must agree on what a GPU
function is, what it is called and under which device-plugin resource name pods ask for it,
so the parsing lives here once. The controller package owns this file (its image is built
from ``controller/`` alone); the collection reaches it through the file link
``plugins/module_utils/gpu_sysfs.py``, and the boot restore unit runs a copy of it beside
``gpu_layout.py``. It therefore imports nothing but the standard library and runs on the
Pythons Ansible targets.

Everything is read below a configurable ``root`` (``/`` on a host, the host's root mounted
somewhere in a container, a fixture tree in tests). A file that cannot be read or parsed
becomes a message in ``errors`` of the function it belongs to (or of the inventory, when it
belongs to none); no exception leaves :func:`read_inventory`.

Resource names follow NVIDIA's kubevirt-gpu-device-plugin, since pods request GPUs by them:

* passthrough: functions bound to ``vfio-pci`` or ``nvgrace_gpu_vfio_pci`` are advertised as
  ``nvidia.com/<pci.ids device name>``, upper-cased, ``/``, ``.`` and whitespace runs turned
  into ``_``, everything but ``[A-Za-z0-9_]`` dropped; a device ID missing from pci.ids is
  advertised under the raw ID (``nvidia.com/2bff``);
* vGPU on SR-IOV VFs (the plugin's vendor-VFIO support): a VF on the ``nvidia`` driver whose
  ``nvidia/current_vgpu_type`` is not ``0`` is advertised under the name its type ID has in
  the ``creatable_vgpu_types`` lists of its own card (the PF and every VF on ``nvidia``,
  merged, first seen wins), whitespace runs turned into ``_``. Type IDs are unique only
  within one card, so another card's list is never used; when no list of the card names the
  type (a fully used card lists only the header) the name is unknown here;
* mdev: ``nvidia.com/<mdev type name>``, whitespace runs turned into ``_``; the device
  plugin reports each mdev by its UUID.

These names are predictions. The device plugin names passthrough functions from the pci.ids
bundled in its own image (``/usr/pci.ids``), never from the host's, so a passthrough name
read here agrees with the plugin's only when both files name the device alike; the
inventory says which file and release it used (``pci_ids_path``, ``pci_ids_version``). What
kubelet advertises (the Node's ``status.allocatable``, the pod-resources API) is the truth.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

NVIDIA_VENDOR_ID = "10de"
RESOURCE_NAMESPACE = "nvidia.com"
# Drivers the device plugin takes a function from for passthrough.
VFIO_DRIVERS = frozenset(("vfio-pci", "nvgrace_gpu_vfio_pci"))
# The host driver SR-IOV vGPU VFs stay on (vfio-pci refuses them).
NVIDIA_DRIVER = "nvidia"
# PCI base class of a GPU: display controller (0x03), whatever its subclass (VGA 0x00, XGA
# 0x01, 3D 0x02, other 0x80). SPEC counts every 0x03xx function of the vendor as a GPU.
GPU_BASE_CLASS = "03"

PCI_DEVICES_DIR = "sys/bus/pci/devices"
MDEV_DEVICES_DIR = "sys/bus/mdev/devices"
# Where distributions keep pci.ids, looked up below the root first, then as given.
DEFAULT_PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/pci.ids")

_PCI_ADDRESS = re.compile(r"^(?:([0-9a-fA-F]{1,4}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")
_MDEV_UUID = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_HEX_ID = re.compile(r"^0x([0-9a-fA-F]+)$")
# Go's regexp \s, which the device plugin uses: ASCII whitespace only.
_GO_SPACE = re.compile(r"[\t\n\f\r ]+")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.]+")
_CREATABLE_LINE = re.compile(r"^[\t\n\f\r ]*([0-9]+)[\t\n\f\r ]*:[\t\n\f\r ]*(.+?)[\t\n\f\r ]*$")
_VIRTFN = re.compile(r"^virtfn([0-9]+)$")
# pci.ids names its release in a header comment: "#\tVersion: 2025.06.09".
_PCI_IDS_VERSION = re.compile(r"^#[\t ]*Version:[\t ]*(\S+)")
_ASCII_UPPER = {c: c - 32 for c in range(ord("a"), ord("z") + 1)}

# A file this large in a sysfs attribute directory is not what it claims to be.
_MAX_READ = 1 << 20


# --- names and shapes ----------------------------------------------------------------------


def canonical_pci_address(text: str) -> str | None:
    """``0000:41:00.0`` form of a PCI address (domain added, lower case); None if not one."""
    match = _PCI_ADDRESS.match(text.strip()) if isinstance(text, str) else None
    if not match:
        return None
    domain, bus, dev, fn = match.groups()
    if int(dev, 16) > 0x1F:
        return None
    return "{:04x}:{}:{}.{}".format(int(domain or "0", 16), bus.lower(), dev.lower(), fn)


def is_mdev_uuid(text: str) -> bool:
    """True for an mdev UUID (the device ID the device plugin reports for an mdev)."""
    return isinstance(text, str) and bool(_MDEV_UUID.match(text))


def passthrough_name(pci_name: str) -> str:
    """The device plugin's name for a pci.ids name: ``AD102GL [L40S]`` -> ``AD102GL_L40S``."""
    name = pci_name.strip().translate(_ASCII_UPPER)
    name = name.replace("/", "_").replace(".", "_")
    name = _GO_SPACE.sub("_", name)
    return _NOT_NAME.sub("", name)


def vgpu_type_name(type_name: str) -> str:
    """The device plugin's name for a vGPU/mdev type: ``GRID T4-4Q`` -> ``GRID_T4-4Q``."""
    return _GO_SPACE.sub("_", type_name.strip("\n"))


def resource_name(name_part: str) -> str:
    """An extended resource name in the device plugin's namespace."""
    return RESOURCE_NAMESPACE + "/" + name_part


def parse_creatable_vgpu_types(text: str) -> list[VgpuType]:
    """``<id> : <name>`` lines of ``nvidia/creatable_vgpu_types``; header and junk skipped."""
    types = []
    for line in text.split("\n"):
        match = _CREATABLE_LINE.match(line)
        if match:
            types.append(VgpuType(type_id=int(match.group(1)), name=match.group(2)))
    return types


# --- pci.ids -------------------------------------------------------------------------------


class PciIds:
    """NVIDIA's device names from one pci.ids file (device ID, lower-case hex -> name).

    ``version`` is the file's own ``Version:`` header line (``2025.06.09``), None without one:
    names are a prediction from this release, and the device plugin reads its own copy.
    """

    def __init__(
        self,
        path: str | None = None,
        names: dict[str, str] | None = None,
        version: str | None = None,
    ) -> None:
        self.path = path
        self.names = dict(names or {})
        self.version = version

    def name(self, device_id: str) -> str | None:
        return self.names.get(device_id)


_PCI_IDS_CACHE: dict[str, tuple[tuple[float, int], PciIds]] = {}


def parse_pci_ids(text: str, path: str | None = None) -> PciIds:
    """NVIDIA's device lines from pci.ids text, read the way the device plugin reads them."""
    names: dict[str, str] = {}
    version: str | None = None
    in_vendor = False
    for line in text.splitlines():
        if line.startswith("#"):
            found = _PCI_IDS_VERSION.match(line) if version is None else None
            if found:
                version = found.group(1)
            continue
        if not in_vendor:
            in_vendor = line.startswith(NVIDIA_VENDOR_ID)
            continue
        if not line.startswith("\t"):
            break
        if line.startswith("\t\t"):
            continue
        parts = line[1:].split(None, 1)
        if len(parts) == 2:
            names.setdefault(parts[0].lower(), parts[1].strip())
    return PciIds(path, names, version)


def load_pci_ids(root: str = "/", paths: list[str] | tuple[str, ...] | None = None) -> PciIds:
    """The first readable pci.ids of ``paths``, each tried below ``root`` and then as given.

    Parsed files are cached by path, modification time and size: the agent reads the
    inventory on every refresh and pci.ids is over a megabyte.
    """
    candidates = []
    for path in paths or DEFAULT_PCI_IDS_PATHS:
        under_root = os.path.join(root, path.lstrip("/"))
        candidates.append(under_root)
        if under_root != path:
            candidates.append(path)
    for candidate in candidates:
        try:
            stat = os.stat(candidate)
        except OSError:
            continue
        key = (stat.st_mtime, stat.st_size)
        cached = _PCI_IDS_CACHE.get(candidate)
        if cached is not None and cached[0] == key:
            return cached[1]
        try:
            with open(candidate, "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            continue
        parsed = parse_pci_ids(text, candidate)
        _PCI_IDS_CACHE[candidate] = (key, parsed)
        return parsed
    return PciIds()


# --- result types --------------------------------------------------------------------------


@dataclass
class VgpuType:
    """One ``<id> : <name>`` entry of ``creatable_vgpu_types``; IDs are unique per card only."""

    type_id: int
    name: str


@dataclass
class VendorVgpu:
    """A function's ``nvidia/`` directory (SR-IOV vGPU, vGPU 17+)."""

    current_type_id: int | None = None  # 0: no vGPU on this VF
    creatable: list[VgpuType] = field(default_factory=list)


@dataclass
class SriovInfo:
    """SR-IOV capability of a physical function."""

    total_vfs: int | None = None
    num_vfs: int | None = None
    vfs: list[str] = field(default_factory=list)  # VF addresses, in virtfn order


@dataclass
class MdevType:
    """One ``mdev_supported_types/<type_id>`` entry of a parent function."""

    type_id: str
    name: str | None = None
    description: str | None = None
    available_instances: int | None = None
    device_api: str | None = None
    devices: list[str] = field(default_factory=list)
    resource_name: str | None = None


@dataclass
class MdevDevice:
    """One mediated device from ``/sys/bus/mdev/devices``."""

    uuid: str
    parent: str | None = None
    type_id: str | None = None
    type_name: str | None = None
    resource_name: str | None = None
    errors: list[str] = field(default_factory=list)


@dataclass
class GpuFunction:
    """One NVIDIA GPU PCI function (a whole GPU, a PF or a VF) and what sysfs says of it."""

    address: str
    vendor_id: str | None = None
    device_id: str | None = None
    class_code: str | None = None
    model: str | None = None  # pci.ids device name, or the raw device ID
    driver: str | None = None
    iommu_group: int | None = None
    numa_node: int | None = None  # None when the kernel says -1
    physfn: str | None = None  # the PF, on a VF
    sriov: SriovInfo | None = None  # on a PF
    vgpu: VendorVgpu | None = None
    vgpu_type_name: str | None = None  # the name of vgpu.current_type_id on this card
    mdev_types: list[MdevType] = field(default_factory=list)
    mdevs: list[MdevDevice] = field(default_factory=list)
    resource_name: str | None = None  # what the device plugin advertises this function as
    errors: list[str] = field(default_factory=list)

    @property
    def is_vf(self) -> bool:
        return self.physfn is not None

    @property
    def mode(self) -> str | None:
        """``passthrough``, ``vgpu`` (a VF with a vGPU type, or an mdev parent) or None."""
        if self.driver in VFIO_DRIVERS:
            return "passthrough"
        if (self.vgpu is not None and self.vgpu.current_type_id) or self.mdevs:
            return "vgpu"
        return None

    @property
    def resource_names(self) -> list[str]:
        """Every resource name this function serves: its own and its mdevs'."""
        names = set(m.resource_name for m in self.mdevs if m.resource_name)
        if self.resource_name:
            names.add(self.resource_name)
        return sorted(names)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["is_vf"] = self.is_vf
        data["mode"] = self.mode
        data["resource_names"] = self.resource_names
        return data


@dataclass
class Inventory:
    """Every NVIDIA GPU function below one root, sorted by address."""

    root: str
    functions: list[GpuFunction] = field(default_factory=list)
    mdevs: list[MdevDevice] = field(default_factory=list)  # every mdev, GPU parent or not
    pci_ids_path: str | None = None
    pci_ids_version: str | None = None
    errors: list[str] = field(default_factory=list)

    def by_address(self) -> dict[str, GpuFunction]:
        return dict((f.address, f) for f in self.functions)

    def resource_names(self) -> list[str]:
        names = set()
        for function in self.functions:
            names.update(function.resource_names)
        return sorted(names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "functions": [f.to_dict() for f in self.functions],
            "mdevs": [asdict(m) for m in self.mdevs],
            "pci_ids_path": self.pci_ids_path,
            "pci_ids_version": self.pci_ids_version,
            "resource_names": self.resource_names(),
            "errors": list(self.errors),
        }


# --- low-level reads -----------------------------------------------------------------------


class _Bad(Exception):
    """A sysfs attribute that exists but cannot be used; its message goes into ``errors``."""


def _label(path: str) -> str:
    """A path as an error names it: relative to the function or mdev it belongs to."""
    parts = path.split(os.sep)
    for index in range(len(parts) - 1, -1, -1):
        if canonical_pci_address(parts[index]) == parts[index] or is_mdev_uuid(parts[index]):
            return "/".join(parts[index + 1 :]) or parts[index]
    return os.path.basename(path)


def _read(path: str) -> str | None:
    """A sysfs attribute as text; None when absent; _Bad when unreadable."""
    # os-level reads: a buffered read(n) allocates n bytes per call, which dominated a
    # refresh of a few hundred functions. sysfs attributes fit one page.
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _Bad(f"{_label(path)}: unreadable: {exc.strerror or exc}") from None
    try:
        chunks = []
        size = 0
        while size <= _MAX_READ:
            chunk = os.read(fd, 16384)
            chunks.append(chunk)
            size += len(chunk)
            if len(chunk) < 16384:  # a short read is the end, for sysfs and plain files
                break
    except OSError as exc:
        raise _Bad(f"{_label(path)}: unreadable: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if size > _MAX_READ:
        raise _Bad(f"{_label(path)}: larger than {_MAX_READ} bytes")
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise _Bad(f"{_label(path)}: not text") from None


def _link_name(path: str) -> str | None:
    """Basename of a symlink's target, read like the device plugin does (a dangling link counts)."""
    try:
        target = os.readlink(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if os.path.lexists(path):
            raise _Bad(f"{_label(path)}: not a link: {exc.strerror or exc}") from None
        return None
    name = os.path.basename(target.rstrip("/"))
    if not name:
        raise _Bad(f"{_label(path)}: link to {target!r} has no name")
    return name


def _hex_attr(path: str, width: int) -> str | None:
    text = _read(path)
    if text is None:
        return None
    match = _HEX_ID.match(text.strip())
    if not match or len(match.group(1)) > width:
        raise _Bad(f"{_label(path)}: not a hex ID: {text[:40]!r}")
    return match.group(1).lower().rjust(width, "0")


def _int_attr(path: str) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise _Bad(f"{_label(path)}: not a number: {text[:40]!r}") from None


def _text_attr(path: str) -> str | None:
    text = _read(path)
    return None if text is None else text.strip()


def _listdir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise _Bad(f"{_label(path)}: unlistable: {exc.strerror or exc}") from None


_T = TypeVar("_T")


def _attempt(errors: list[str], read: Callable[..., _T | None], *args: Any) -> _T | None:
    """Run one attribute read; a _Bad goes into errors and None comes back."""
    try:
        return read(*args)
    except _Bad as exc:
        errors.append(str(exc))
        return None


# --- one function --------------------------------------------------------------------------


def _is_gpu(vendor: str | None, class_code: str | None) -> bool:
    """Whether a function may be an NVIDIA GPU. Unknown attributes keep it in, with errors."""
    if vendor is not None and vendor != NVIDIA_VENDOR_ID:
        return False
    if class_code is not None and not class_code.startswith(GPU_BASE_CLASS):
        return False
    return vendor is not None or class_code is not None


def _read_sriov(path: str, function: GpuFunction, present: set[str]) -> None:
    if "sriov_totalvfs" not in present:
        return
    errors = function.errors
    total = _attempt(errors, _int_attr, path + "/sriov_totalvfs")
    info = SriovInfo(total_vfs=total, num_vfs=_attempt(errors, _int_attr, path + "/sriov_numvfs"))
    numbered = []
    for entry in present:
        match = _VIRTFN.match(entry)
        if not match:
            continue
        vf = _attempt(errors, _link_name, path + "/" + entry)
        address = canonical_pci_address(vf) if vf else None
        if address is None:
            errors.append(f"{entry}: does not name a PCI function")
            continue
        if not os.path.exists(path + "/" + entry):
            errors.append(f"{entry}: dangling link to {address}")
        numbered.append((int(match.group(1)), address))
    info.vfs = [address for _index, address in sorted(numbered)]
    function.sriov = info


def _read_vendor_vgpu(path: str, function: GpuFunction) -> None:
    vdir = path + "/nvidia"
    if not os.path.isdir(vdir):
        return
    errors = function.errors
    vgpu = VendorVgpu()
    current = _attempt(errors, _text_attr, vdir + "/current_vgpu_type")
    if current is not None:
        if current.isdigit():
            vgpu.current_type_id = int(current)
        elif current:
            errors.append(f"nvidia/current_vgpu_type: not a number: {current[:40]!r}")
    creatable = _attempt(errors, _read, vdir + "/creatable_vgpu_types")
    if creatable is not None:
        vgpu.creatable = parse_creatable_vgpu_types(creatable)
    function.vgpu = vgpu


def _read_mdev_types(path: str, function: GpuFunction) -> None:
    tdir = path + "/mdev_supported_types"
    errors = function.errors
    for type_id in _attempt(errors, _listdir, tdir) or []:
        base = tdir + "/" + type_id
        mtype = MdevType(type_id=type_id)
        failed = len(errors)
        raw_name = _attempt(errors, _read, base + "/name")
        if raw_name is not None and raw_name.strip():
            mtype.name = raw_name.strip()
            mtype.resource_name = resource_name(vgpu_type_name(raw_name))
        elif len(errors) == failed:
            errors.append(f"mdev_supported_types/{type_id}/name: missing or empty")
        mtype.description = _attempt(errors, _text_attr, base + "/description")
        mtype.available_instances = _attempt(errors, _int_attr, base + "/available_instances")
        mtype.device_api = _attempt(errors, _text_attr, base + "/device_api")
        mtype.devices = [
            d for d in _attempt(errors, _listdir, base + "/devices") or [] if is_mdev_uuid(d)
        ]
        function.mdev_types.append(mtype)


def read_function(
    root: str, address: str, pci_ids: PciIds | None = None, _seen: dict[str, bool] | None = None
) -> GpuFunction | None:
    """One function below ``root``; None when it is not an NVIDIA GPU. Never raises."""
    function = GpuFunction(address=address)
    try:
        return _read_function(root, address, pci_ids or PciIds(), function, _seen or {})
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # A guard, not a path: every expected failure is a _Bad above. An inventory that
        # loses one function still reports the others.
        function.errors.append(f"unexpected failure: {type(exc).__name__}: {exc}")
        return function


def _driver_alive(path: str, driver: str, seen: dict[str, bool]) -> bool:
    """Whether a driver link resolves; asked once per driver and pass, not per function."""
    key = os.path.dirname(path) + "\0" + driver
    if key not in seen:
        seen[key] = os.path.exists(path + "/driver")
    return seen[key]


def _read_function(
    root: str, address: str, pci_ids: PciIds, function: GpuFunction, seen: dict[str, bool]
) -> GpuFunction | None:
    path = os.path.join(root, PCI_DEVICES_DIR) + "/" + address
    errors = function.errors
    function.vendor_id = _attempt(errors, _hex_attr, path + "/vendor", 4)
    function.class_code = _attempt(errors, _hex_attr, path + "/class", 6)
    if not _is_gpu(function.vendor_id, function.class_code):
        if errors and function.vendor_id is None and function.class_code is None:
            return function  # nothing identifies it, and something is broken: show it
        return None
    for attr, value in (("vendor", function.vendor_id), ("class", function.class_code)):
        if value is None and not any(e.startswith(attr + ":") for e in errors):
            errors.append(f"{attr}: missing")
    # One listing instead of a failed open or stat per optional attribute.
    present = set(_attempt(errors, _listdir, path) or [])
    function.device_id = _attempt(errors, _hex_attr, path + "/device", 4)
    listed = None
    if function.device_id is not None:
        listed = pci_ids.name(function.device_id)
        function.model = listed or function.device_id
    function.driver = _attempt(errors, _link_name, path + "/driver")
    if function.driver is not None and not _driver_alive(path, function.driver, seen):
        errors.append(f"driver: dangling link to {function.driver}")
    group = _attempt(errors, _link_name, path + "/iommu_group")
    if group is not None:
        if group.isdigit():
            function.iommu_group = int(group)
        else:
            errors.append(f"iommu_group: link to {group!r} is not a group number")
    numa = _attempt(errors, _int_attr, path + "/numa_node")
    function.numa_node = numa if numa is not None and numa >= 0 else None
    physfn = _attempt(errors, _link_name, path + "/physfn") if "physfn" in present else None
    if physfn is not None:
        function.physfn = canonical_pci_address(physfn)
        if function.physfn is None:
            errors.append(f"physfn: link to {physfn!r} is not a PCI function")
        elif not os.path.exists(os.path.dirname(path) + "/" + function.physfn):
            errors.append(f"physfn: dangling link to {function.physfn}")
    _read_sriov(path, function, present)
    if "nvidia" in present:
        _read_vendor_vgpu(path, function)
    if "mdev_supported_types" in present:
        _read_mdev_types(path, function)
    if function.driver in VFIO_DRIVERS and function.device_id is not None:
        # The plugin falls back to the raw ID as it is when pci.ids has no usable name.
        function.resource_name = resource_name(
            (passthrough_name(listed) if listed else "") or function.device_id
        )
    return function


# --- the inventory -------------------------------------------------------------------------


def _read_mdev(root: str, uuid: str) -> MdevDevice:
    mdev = MdevDevice(uuid=uuid)
    entry = os.path.join(root, MDEV_DEVICES_DIR, uuid)
    errors = mdev.errors
    try:
        target = os.readlink(entry)
        parent = os.path.basename(os.path.dirname(target.rstrip("/")))
    except OSError:
        parent = os.path.basename(os.path.dirname(os.path.realpath(entry)))
    mdev.parent = canonical_pci_address(parent)
    if mdev.parent is None:
        errors.append(f"parent: {parent!r} is not a PCI function")
    if not os.path.exists(entry):
        errors.append("dangling link")
        return mdev
    mdev.type_id = _attempt(errors, _link_name, entry + "/mdev_type")
    failed = len(errors)
    raw_name = _attempt(errors, _read, entry + "/mdev_type/name")
    if raw_name is not None and raw_name.strip():
        mdev.type_name = raw_name.strip()
        mdev.resource_name = resource_name(vgpu_type_name(raw_name))
    elif len(errors) == failed:
        errors.append("mdev_type/name: missing or empty")
    return mdev


def _resolve_vgpu_names(functions: list[GpuFunction]) -> None:
    """Name each VF's vGPU type from its own card's creatable lists, as the device plugin does."""
    catalogs: dict[str, dict[int, str]] = {}
    for function in functions:  # sorted by address: first seen wins, like the plugin's walk
        if function.driver != NVIDIA_DRIVER or function.vgpu is None:
            continue
        card = function.physfn or function.address
        catalog = catalogs.setdefault(card, {})
        for vtype in function.vgpu.creatable:
            catalog.setdefault(vtype.type_id, vtype.name)
    for function in functions:
        vgpu = function.vgpu
        if (
            function.physfn is None
            or function.sriov is not None
            or vgpu is None
            or not vgpu.current_type_id
        ):
            continue
        name = catalogs.get(function.physfn, {}).get(vgpu.current_type_id)
        if name is None:
            function.errors.append(
                f"vGPU type {vgpu.current_type_id} is in no creatable_vgpu_types of card"
                f" {function.physfn} (a full card lists only its header): sysfs cannot name it"
            )
            continue
        function.vgpu_type_name = name
        if function.driver == NVIDIA_DRIVER:
            function.resource_name = resource_name(vgpu_type_name(name))


def read_inventory(
    root: str = "/",
    pci_ids_paths: list[str] | tuple[str, ...] | None = None,
    pci_ids: PciIds | None = None,
) -> Inventory:
    """Every NVIDIA GPU function below ``root``, with SR-IOV, vGPU and mdev state. Never raises."""
    inventory = Inventory(root=root)
    try:
        names = pci_ids if pci_ids is not None else load_pci_ids(root, pci_ids_paths)
        inventory.pci_ids_path = names.path
        inventory.pci_ids_version = names.version
        if names.path is None:
            inventory.errors.append("no pci.ids found; models are raw device IDs")
        base = os.path.join(root, PCI_DEVICES_DIR)
        entries = _attempt(inventory.errors, _listdir, base) or []
        seen: dict[str, bool] = {}
        for entry in entries:
            address = canonical_pci_address(entry)
            if address is None or address != entry:
                continue
            function = read_function(root, address, names, seen)
            if function is not None:
                inventory.functions.append(function)
        by_address = inventory.by_address()
        for uuid in (
            _attempt(inventory.errors, _listdir, os.path.join(root, MDEV_DEVICES_DIR)) or []
        ):
            if not is_mdev_uuid(uuid):
                continue
            mdev = _read_mdev(root, uuid)
            inventory.mdevs.append(mdev)
            parent = by_address.get(mdev.parent or "")
            if parent is not None:
                parent.mdevs.append(mdev)
        _resolve_vgpu_names(inventory.functions)
        for function in inventory.functions:
            if function.resource_name is None and function.mdevs:
                served = set(m.resource_name for m in function.mdevs if m.resource_name)
                if len(served) == 1:
                    function.resource_name = served.pop()
    except Exception as exc:  # pylint: disable=broad-exception-caught
        # A guard: the inventory is reported with what was read so far.
        inventory.errors.append(f"unexpected failure: {type(exc).__name__}: {exc}")
    return inventory
