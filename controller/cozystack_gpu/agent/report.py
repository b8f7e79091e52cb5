"""From a sysfs inventory and what kubelet says to a GPUNode status: pure, no I/O.

Device plugins report devices to kubelet under IDs of their own choosing, so each ID is
resolved through sysfs by its shape, not by knowing the plugin:

* a PCI address names a function (kubevirt-gpu-device-plugin since v1.5.0, vGPU VFs);
* an mdev UUID names an mediated device, which counts on its parent function;
* a bare number is an IOMMU group (kubevirt-gpu-device-plugin v1.4.0 and earlier), but only
  through functions bound to a vfio driver: NVIDIA's container plugin may report plain
  indexes, which are not groups. A group counts once, on its lowest-addressed vfio GPU,
  however many GPUs it holds; the pods holding it hold every GPU in it;
* an NVML UUID (``GPU-…``, ``MIG-…``, with or without a ``::N`` replica suffix) cannot be
  placed through sysfs, but its resource name still joins ``resourceNames``, since pods
  request GPUs by it.

Health is what kubelet lists as allocatable (the API carries no health; kubelet lists only
healthy devices), counted per function, because an mdev parent serves several devices from
one function. Pods in a final phase are skipped: kubelet 1.32 and 1.33 still list them, with
devices a new pod may already hold.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import DeviceSet, PodDevices

FINAL_PHASES = frozenset({"Succeeded", "Failed"})
_NVML_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]+(::[0-9]+)?$")
_MAX_ERROR = 1024

# A pod's phase by (namespace, name); None when the API server does not know the pod.
PhaseOf = Callable[[str, str], str | None]


class Shape:
    PCI = "pci"
    MDEV = "mdev"
    IOMMU_GROUP = "iommu-group"
    NVML = "nvml"
    UNKNOWN = "unknown"


def id_shape(device_id: str) -> str:
    """Which kind of ID a device plugin reported, by its shape alone."""
    if sysfs.canonical_pci_address(device_id) is not None:
        return Shape.PCI
    if sysfs.is_mdev_uuid(device_id):
        return Shape.MDEV
    if device_id.isdecimal() and device_id.isascii():
        return Shape.IOMMU_GROUP
    if _NVML_UUID.match(device_id):
        return Shape.NVML
    return Shape.UNKNOWN


@dataclass(frozen=True)
class Resolution:
    """Where one device ID lands: the function it counts on and every function it holds."""

    shape: str
    counts_on: str | None = None
    holds: tuple[str, ...] = ()

    @property
    def placeable(self) -> bool:
        return self.counts_on is not None


class Resolver:
    """Resolves device IDs against one inventory."""

    def __init__(self, inventory: sysfs.Inventory) -> None:
        self.functions = inventory.by_address()
        self.mdev_parent = {
            m.uuid.lower(): m.parent
            for m in inventory.mdevs
            if m.parent is not None and m.parent in self.functions
        }
        groups: dict[int, list[str]] = {}
        for f in inventory.functions:
            if f.iommu_group is not None and f.driver in sysfs.VFIO_DRIVERS:
                groups.setdefault(f.iommu_group, []).append(f.address)
        self.vfio_groups = {g: tuple(sorted(members)) for g, members in groups.items()}

    def resolve(self, device_id: str) -> Resolution:
        shape = id_shape(device_id)
        if shape == Shape.PCI:
            address = sysfs.canonical_pci_address(device_id)
            if address in self.functions:
                return Resolution(shape, address, (address,))
        elif shape == Shape.MDEV:
            parent = self.mdev_parent.get(device_id.lower())
            if parent is not None:
                return Resolution(shape, parent, (parent,))
        elif shape == Shape.IOMMU_GROUP:
            members = self.vfio_groups.get(int(device_id))
            if members:
                return Resolution(shape, members[0], members)
        return Resolution(shape)


@dataclass
class NodeReport:
    """The agent's part of a GPUNode status, and what it could not place.

    ``other_resource_names``: names kubelet advertises whose devices all resolve to
    functions that are no GPU (a NIC or DPU VF under ``nvidia.com/``, an audio function, an
    NVSwitch, another vendor's mdev): not GPU names (seed 004), so a tenant may put one next
    to a GPU claim and ``rawResourceNames: forbidden`` does not refuse it; the hoster reads
    them here and names any that should count as GPUs in the chart's extra names.
    """

    devices: list[dict[str, Any]]
    resource_names: list[str]
    unresolved: dict[str, list[str]] = field(default_factory=dict)  # resource -> device IDs
    skipped_pods: list[str] = field(default_factory=list)  # namespace/name in a final phase
    other_resource_names: list[str] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """The fields the agent owns, ready for a merge patch (no conditions, no timestamps)."""
        return {
            "devices": self.devices,
            "resourceNames": self.resource_names,
            "otherResourceNames": self.other_resource_names,
        }

    def allocatable(self) -> int:
        return sum(int(d["allocatable"]) for d in self.devices)


def _device_entry(f: sysfs.GpuFunction) -> dict[str, Any]:
    entry: dict[str, Any] = {"pciAddress": f.address}
    if f.vendor_id is not None:
        entry["vendorID"] = f.vendor_id
    if f.device_id is not None:
        entry["deviceID"] = f.device_id
    if f.model is not None:
        entry["model"] = f.model[:256]
    entry["driver"] = f.driver or ""
    if f.iommu_group is not None:
        entry["iommuGroup"] = f.iommu_group
    entry["numaNode"] = -1 if f.numa_node is None else f.numa_node
    if f.physfn is not None:
        entry["physfn"] = f.physfn
    if f.sriov is not None:
        if f.sriov.total_vfs is not None:
            entry["sriovTotalVFs"] = f.sriov.total_vfs
        if f.sriov.num_vfs is not None:
            entry["sriovNumVFs"] = f.sriov.num_vfs
    if f.vgpu is not None and f.vgpu.current_type_id:
        vgpu: dict[str, Any] = {"id": f.vgpu.current_type_id}
        if f.vgpu_type_name:
            vgpu["name"] = f.vgpu_type_name
        entry["vgpuType"] = vgpu
    if f.mdev_types or f.mdevs:
        types = []
        for t in f.mdev_types:
            item: dict[str, Any] = {"id": t.type_id}
            if t.name is not None:
                item["name"] = t.name
            if t.available_instances is not None:
                item["availableInstances"] = t.available_instances
            types.append(item)
        devices = []
        for m in f.mdevs:
            dev: dict[str, Any] = {"uuid": m.uuid}
            if m.type_id is not None:
                dev["type"] = m.type_id
            if m.type_name is not None:
                dev["name"] = m.type_name
            devices.append(dev)
        entry["mdev"] = {"types": types, "devices": devices}
    return entry


def _errors_of(f: sysfs.GpuFunction) -> str:
    messages = list(f.errors) + [f"mdev {m.uuid}: {e}" for m in f.mdevs for e in m.errors]
    text = "; ".join(messages)
    return text if len(text) <= _MAX_ERROR else text[: _MAX_ERROR - 1] + "…"


def build_report(
    inventory: sysfs.Inventory,
    allocatable: Iterable[DeviceSet],
    pods: Iterable[PodDevices],
    phase_of: PhaseOf,
) -> NodeReport:
    """The GPUNode status of one node from its sysfs inventory and kubelet's answers.

    ``phase_of`` gives a pod's phase; a pod the API server does not know (None) is kept,
    since its containers may still hold the devices.
    """
    resolver = Resolver(inventory)
    counts: dict[str, int] = {}
    kubelet_names: dict[str, set[str]] = {}
    names: set[str] = set()
    unresolved: dict[str, set[str]] = {}

    # Names whose devices point at functions (PCI addresses, mdevs, IOMMU groups) that are no
    # GPU of this node's inventory; they are GPU names only if some device is a GPU after all.
    foreign: set[str] = set()
    # Names under the vendor prefix kubelet lists with no device, or only with IDs of no
    # known shape: nothing says what they are, so they count as GPU names, as before.
    unknown: set[str] = set()
    for device_set in allocatable:
        ids = set(device_set.device_ids)
        prefixed = device_set.resource_name.startswith(keys.NVIDIA_RESOURCE_PREFIX)
        if prefixed and all(id_shape(i) not in (Shape.PCI, Shape.MDEV) for i in ids):
            unknown.add(device_set.resource_name)
        for device_id in ids:
            res = resolver.resolve(device_id)
            if res.counts_on is not None:
                counts[res.counts_on] = counts.get(res.counts_on, 0) + 1
                for address in res.holds:
                    kubelet_names.setdefault(address, set()).add(device_set.resource_name)
                names.add(device_set.resource_name)
            elif res.shape == Shape.NVML:
                names.add(device_set.resource_name)
            else:
                unresolved.setdefault(device_set.resource_name, set()).add(device_id)
                # A PCI address or an mdev that is no GPU function of this node names
                # another device; a bare number may be a container plugin's GPU index.
                if res.shape in (Shape.PCI, Shape.MDEV):
                    foreign.add(device_set.resource_name)

    holders: dict[str, set[tuple[str, str]]] = {}
    skipped = []
    for pod in pods:
        if phase_of(pod.namespace, pod.name) in FINAL_PHASES:
            skipped.append(f"{pod.namespace}/{pod.name}")
            continue
        for device_set in pod.devices:
            for device_id in device_set.device_ids:
                res = resolver.resolve(device_id)
                for address in res.holds:
                    holders.setdefault(address, set()).add((pod.namespace, pod.name))
                if res.placeable or res.shape == Shape.NVML:
                    names.add(device_set.resource_name)

    devices = _devices(inventory, counts, kubelet_names, holders)
    names |= unknown - foreign
    return NodeReport(
        devices=devices,
        resource_names=sorted(names),
        unresolved={k: sorted(v) for k, v in sorted(unresolved.items())},
        skipped_pods=sorted(skipped),
        other_resource_names=sorted(foreign - names),
    )


def _devices(
    inventory: sysfs.Inventory,
    counts: Mapping[str, int],
    kubelet_names: Mapping[str, set[str]],
    holders: Mapping[str, set[tuple[str, str]]],
) -> list[dict[str, Any]]:
    """One device entry per GPU function: its resource name, what kubelet counts of it
    allocatable, the pods that hold it, and what sysfs could not read of it."""
    devices = []
    for f in inventory.functions:
        entry = _device_entry(f)
        seen = kubelet_names.get(f.address, set())
        # What kubelet shows is what the plugin did; sysfs alone cannot name a vGPU type on
        # a fully used card (the plugin asks NVML then), so kubelet's name wins when single.
        # A name only predicted from sysfs (the host's pci.ids; the plugin reads its own)
        # stays on the device for people to compare, but joins resourceNames only once
        # kubelet advertises it: the binder reports the difference on the GPUNode.
        name = next(iter(seen)) if len(seen) == 1 else f.resource_name
        if name:
            entry["resourceName"] = name
        entry["allocatable"] = counts.get(f.address, 0)
        entry["pods"] = [
            {"namespace": ns, "name": n} for ns, n in sorted(holders.get(f.address, set()))
        ]
        error = _errors_of(f)
        if error:
            entry["error"] = error
        devices.append(entry)
    return devices
