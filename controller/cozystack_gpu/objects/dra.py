"""The ``dra`` source (SPEC §13), pure: which devices of the nodes' ResourceSlices a class
matches, which of them ResourceClaims hold, how many a node can still give a class, and the
ResourceClaim and VMI entries the controller writes for a claim of such a class.

It reads ``resource.k8s.io/v1`` objects as the API server returns them (plain dicts) and
follows what kube-scheduler's allocator does with them (``k8s.io/dynamic-resource-
allocation/structured``), since a count that differs from the scheduler's would bind claims
that cannot start:

- a device is (driver, pool, name); of each pool only the slices of the newest generation
  count, and a pool that is incomplete (fewer slices of that generation than
  ``resourceSliceCount``) or invalid (a device name twice) gives nothing, as the scheduler
  allocates nothing from one;
- a device tainted ``NoSchedule`` or ``NoExecute`` is not allocated (our requests carry no
  tolerations), and a result with ``adminAccess`` holds no device;
- selectors are judged in order, the DeviceClass's first, the first false ending it; a
  selector that cannot judge a device (an evaluation error, a result that is not a bool)
  does not match it, and says why (kube-scheduler fails the allocation on that node then).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from cozystack_gpu.objects import Obj, dra_cel

# Kubernetes' standard attribute naming a device's PCI function (deviceattribute package).
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
# Device taint effects that keep the scheduler from allocating a device to a claim that does
# not tolerate them; any other effect ("None", or one added later) is informational.
BLOCKING_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


# --- the class's side ---------------------------------------------------------------------


@dataclass(frozen=True)
class DraSource:
    """A GPUClass's ``spec.source.dra``: the DeviceClass and the class's own selectors."""

    device_class: str
    selectors: tuple[str, ...] = ()


def _expression(selector: Any) -> str:
    """A selector written as a CEL string, or as a DeviceClass writes one
    (``{"cel": {"expression": ...}}``); "" when it is neither."""
    if isinstance(selector, str):
        return selector
    if isinstance(selector, Mapping):
        return str((selector.get("cel") or {}).get("expression") or "")
    return ""


def dra_source(gpu_class: Obj) -> DraSource | None:
    """The class's ``dra`` source, or None for a class of another source."""
    source = ((gpu_class.get("spec") or {}).get("source") or {}).get("dra")
    if not isinstance(source, Mapping):
        return None
    return DraSource(
        device_class=str(source.get("deviceClassName") or ""),
        selectors=tuple(_expression(s) for s in source.get("selectors") or ()),
    )


# --- devices ------------------------------------------------------------------------------


class DeviceId(NamedTuple):
    """A device as Kubernetes names it, in slices and in allocation results alike."""

    driver: str
    pool: str
    name: str


@dataclass(frozen=True)
class SliceDevice:
    """One device of a ResourceSlice of the newest generation of its pool, on one node."""

    id: DeviceId
    node: str
    attributes: Mapping[str, Any] = field(default_factory=dict)
    capacity: Mapping[str, Any] = field(default_factory=dict)
    taint_effects: frozenset[str] = frozenset()
    allow_multiple: bool = False

    @property
    def allocatable(self) -> bool:
        """Whether the scheduler may allocate it to a claim that tolerates no taint."""
        return not self.taint_effects & BLOCKING_TAINT_EFFECTS

    @property
    def pci_bus_id(self) -> str:
        """The PCI function it is, where its driver says; "" where it does not."""
        value = self.attributes.get(PCI_BUS_ID)
        return str(value.get("string") or "") if isinstance(value, Mapping) else ""


def _pool_of(resource_slice: Obj) -> tuple[tuple[str, str], int, int]:
    spec = resource_slice.get("spec") or {}
    pool = spec.get("pool") or {}
    key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
    return key, int(pool.get("generation") or 0), int(pool.get("resourceSliceCount") or 1)


def _newest_pools(slices: Iterable[Obj]) -> dict[tuple[str, str], list[Obj]]:
    """Each usable pool's slices of its newest generation. An older generation is what the
    driver is replacing: Kubernetes ignores it, and so does the count."""
    newest: dict[tuple[str, str], tuple[int, int, list[Obj]]] = {}
    for resource_slice in slices:
        key, generation, count = _pool_of(resource_slice)
        held = newest.get(key)
        if held is None or generation > held[0]:
            newest[key] = (generation, count, [resource_slice])
        elif generation == held[0]:
            held[2].append(resource_slice)
    pools = {}
    for key, (_generation, count, members) in newest.items():
        names = [
            str(d.get("name")) for s in members for d in (s.get("spec") or {}).get("devices") or ()
        ]
        if len(members) == count and len(names) == len(set(names)):
            pools[key] = members
    return pools


def _device(driver: str, pool: str, node: str, device: Obj) -> SliceDevice:
    return SliceDevice(
        id=DeviceId(driver, pool, str(device.get("name") or "")),
        node=node,
        attributes=dict(device.get("attributes") or {}),
        capacity=dict(device.get("capacity") or {}),
        taint_effects=frozenset(str(t.get("effect") or "") for t in device.get("taints") or ()),
        allow_multiple=bool(device.get("allowMultipleAllocations")),
    )


def node_devices(slices: Iterable[Obj]) -> dict[str, tuple[SliceDevice, ...]]:
    """Every node's devices, by node name, sorted by device id.

    Only node-local devices count: a slice's ``nodeName``, or a device's own ``nodeName``
    in a slice with ``perDeviceNodeSelection``. Devices that a node selector or ``allNodes``
    offers to several nodes are no GPUs of one node, and are left out."""
    found: dict[str, list[SliceDevice]] = defaultdict(list)
    for (driver, pool), members in _newest_pools(slices).items():
        for resource_slice in members:
            spec = resource_slice.get("spec") or {}
            per_device = bool(spec.get("perDeviceNodeSelection"))
            for device in spec.get("devices") or ():
                node = str((device.get("nodeName") if per_device else spec.get("nodeName")) or "")
                if node and device.get("name"):
                    found[node].append(_device(driver, pool, node, device))
    return {node: tuple(sorted(devices, key=lambda d: d.id)) for node, devices in found.items()}


# --- the matcher --------------------------------------------------------------------------


@dataclass(frozen=True)
class Judgement:
    """Whether a class's selectors match a device; ``error`` says why one could not judge."""

    matches: bool
    error: str = ""


@dataclass(frozen=True)
class DeviceMatcher:
    """The selectors of a DeviceClass and of a GPUClass, compiled once, in the order
    Kubernetes judges them. A matcher with ``errors`` (a selector that does not compile, a
    missing DeviceClass) matches no device: the class offers nothing until they are fixed."""

    selectors: tuple[tuple[str, dra_cel.Selector], ...] = ()
    errors: tuple[str, ...] = ()

    @cached_property
    def domains(self) -> frozenset[str]:
        """The domains its selectors look up by name (each device gets an empty map for
        those it lacks, as Kubernetes gives one)."""
        return frozenset(d for _where, selector in self.selectors for d in selector.domains)

    def judge(self, device: SliceDevice) -> Judgement:
        if self.errors:
            return Judgement(False, "; ".join(self.errors))
        try:
            variable = dra_cel.device_variable(
                device.id.driver,
                device.attributes,
                device.capacity,
                self.domains,
                device.allow_multiple,
            )
        except ValueError as error:
            return Judgement(False, f"device {_named(device.id)}: {error}")
        for where, selector in self.selectors:
            verdict = selector.evaluate(variable)
            if isinstance(verdict, str):
                return Judgement(False, f"{where} on device {_named(device.id)}: {verdict}")
            if not verdict:
                return Judgement(False)
        return Judgement(True)

    def matches(self, device: SliceDevice) -> bool:
        return self.judge(device).matches


def _named(device: DeviceId) -> str:
    return "/".join(device)


def compile_matcher(
    device_class: Obj | None, selectors: Iterable[Any] = (), class_name: str = ""
) -> DeviceMatcher:
    """The matcher of a DeviceClass (None when it does not exist) and a GPUClass's own
    selectors (``source.dra.selectors``: CEL strings). Never raises: what cannot be
    compiled is in ``errors``, each naming the object, the selector and the expression."""
    compiled: list[tuple[str, dra_cel.Selector]] = []
    errors: list[str] = []
    if device_class is None:
        errors.append("the DeviceClass does not exist")
        device_class = {}
    device_class_name = str((device_class.get("metadata") or {}).get("name") or "")
    owners = (
        (f"DeviceClass {device_class_name}", (device_class.get("spec") or {}).get("selectors")),
        (f"GPUClass {class_name}".rstrip(), selectors),
    )
    for owner, items in owners:
        for index, item in enumerate(items or ()):
            where = f"selector #{index} of {owner}"
            expression = _expression(item)
            if not expression and not isinstance(item, str):
                errors.append(f"{where} is not a CEL selector: {item!r}")
                continue
            selector = dra_cel.compile_selector(expression)
            if isinstance(selector, str):
                errors.append(f"{where} ({expression!r}) {selector}")
            else:
                compiled.append((f"{where} ({expression!r})", selector))
    return DeviceMatcher(tuple(compiled), tuple(errors))


def selector_errors(
    device_class: Obj | None, selectors: Iterable[Any] = (), class_name: str = ""
) -> tuple[str, ...]:
    """Why the class's selectors cannot be used, one text each; () when they can."""
    return compile_matcher(device_class, selectors, class_name).errors
