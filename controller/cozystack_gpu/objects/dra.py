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

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, Obj, dra_cel

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


# --- allocations and capacity --------------------------------------------------------------


class ClaimKey(NamedTuple):
    namespace: str
    name: str


def key_of(obj: Obj) -> ClaimKey:
    meta = obj.get("metadata") or {}
    return ClaimKey(str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def allocated_devices(resource_claim: Obj) -> frozenset[DeviceId]:
    """The devices a ResourceClaim's allocation holds. A result with ``adminAccess`` holds
    none: Kubernetes allocates such access beside the device's ordinary claims."""
    allocation = (resource_claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return frozenset(
        DeviceId(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
        for r in results
        if not r.get("adminAccess")
    )


@dataclass(frozen=True)
class DraCapacity:
    """What the nodes' devices give one class, before the model takes its claims' holds."""

    free: Mapping[str, int]  # by node: matching devices no other ResourceClaim holds
    matching: Mapping[str, int]  # by node: devices the class matches, held or not
    errors: tuple[str, ...] = ()  # why a selector could not judge a device

    def of(self, node: str) -> int:
        return self.free.get(node, 0)


def holders_of(resource_claims: Iterable[Obj]) -> dict[DeviceId, ClaimKey]:
    """Which ResourceClaim's allocation holds each device (one of them, for a device shared
    by several)."""
    return {
        device: key_of(resource_claim)
        for resource_claim in resource_claims
        for device in allocated_devices(resource_claim)
    }


@dataclass(frozen=True)
class NodeUnits:
    """What one node's devices give the ``dra`` classes, before the model takes their
    claims' holds (the view's input to the model, per node).

    - ``free``: by class, the devices it matches that no ResourceClaim holds, but those of
      its own claims held on this node (see ``dra_capacity`` for why that is SPEC §13's
      count once the model subtracts the holds);
    - ``matching``: by class, the devices it matches, held or not;
    - ``shared``: the classes one of whose devices (or its PCI function) another class also
      matches here: neither is served on the node, as two classes of one resource name on
      one node are not (``eligibility.shares_resource_on``), since a hold of one would not
      be told apart from the other's free devices;
    - ``errors``: by class, why a selector could not judge a device.
    """

    free: Mapping[str, int] = field(default_factory=dict)
    matching: Mapping[str, int] = field(default_factory=dict)
    shared: frozenset[str] = frozenset()
    errors: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def node_units(
    node: str,
    devices: Iterable[SliceDevice],
    holders: Mapping[DeviceId, ClaimKey],
    matchers: Mapping[str, DeviceMatcher],
    ours: Mapping[ClaimKey, tuple[str, str]],
) -> NodeUnits:
    """``node``'s units of each class of ``matchers`` (by class name), from its ``devices``
    and the ResourceClaims holding them (``holders_of``).

    ``ours`` maps the ResourceClaims the controller made for GPUClaims (``made_for``) to
    the claim's class and the node where the model counts its units ("" where it counts
    them nowhere: a Pending claim, a Lost one whose VM no longer runs). Only a class's own
    claims held on this node leave their devices counted: any other holder's devices are
    taken, and with them every device of the same PCI function (NVIDIA's driver offers a
    GPU both as ``gpu-N`` and as ``gpu-vfio-N`` and withdraws the sibling only once one is
    prepared)."""
    every = list(devices)
    usable = [d for d in every if d.allocatable]
    matched: dict[str, list[SliceDevice]] = {}
    errors: dict[str, tuple[str, ...]] = {}
    for name, matcher in sorted(matchers.items()):
        judged = [(device, matcher.judge(device)) for device in usable]
        matched[name] = [device for device, judgement in judged if judgement.matches]
        said = tuple(dict.fromkeys(j.error for _d, j in judged if j.error))
        if said:
            errors[name] = said
    free: dict[str, int] = {}
    for name, found in matched.items():
        taken = {device for device, holder in holders.items() if ours.get(holder) != (name, node)}
        functions = {d.pci_bus_id for d in every if d.id in taken and d.pci_bus_id}
        free[name] = sum(
            1
            for d in found
            if d.id not in taken and (not d.pci_bus_id or d.pci_bus_id not in functions)
        )
    return NodeUnits(
        free, {name: len(found) for name, found in matched.items()}, _shared(matched), errors
    )


def _shared(matched: Mapping[str, list[SliceDevice]]) -> frozenset[str]:
    """The classes one of whose devices, or a device of the same PCI function, another class
    matches too."""
    claimed: dict[Any, set[str]] = defaultdict(set)
    for name, found in matched.items():
        for device in found:
            claimed[device.id].add(name)
            if device.pci_bus_id:
                claimed[("pci", device.pci_bus_id)].add(name)
    return frozenset(name for names in claimed.values() if len(names) > 1 for name in names)


def dra_capacity(
    slices: Iterable[Obj],
    resource_claims: Iterable[Obj],
    matcher: DeviceMatcher,
    ours: Mapping[ClaimKey, str],
) -> DraCapacity:
    """Per node, the devices the class matches, less those allocated to any ResourceClaim
    that is not one of ours where its claim holds its units: ``node_units`` for one class
    over every node of ``slices``.

    ``ours`` maps the ResourceClaims the controller made for GPUClaims (``made_for``) to
    the node where the model counts their claim's units ("" where it counts them nowhere: a
    Pending claim, a Lost one whose VM no longer runs).

    Why this is SPEC §13's capacity (the devices matched, less the devices allocated to any
    ResourceClaim, less the units held by claims whose ResourceClaim is not allocated yet)
    once the model subtracts every held claim's units, as it does for ``devicePlugin``: our
    ResourceClaim requests exactly ``count`` devices of the class's DeviceClass and
    selectors, and kube-scheduler allocates it on the claim's node, so where it is
    allocated it holds ``count`` matching devices of the node where the claim holds
    ``count`` units. Leaving those devices in here and letting the model subtract the
    claim's units takes the same number as the SPEC's two terms together: allocated claims
    through their devices, unallocated ones through their units. Our ResourceClaim
    allocated on any other node (its claim moved or lost its node) holds devices no unit
    stands for, so there it counts as anyone's.
    """
    holders = holders_of(resource_claims)
    mine = {key: ("", node) for key, node in ours.items()}
    free: dict[str, int] = {}
    matching: dict[str, int] = {}
    errors: list[str] = []
    for node, devices in sorted(node_devices(slices).items()):
        units = node_units(node, devices, holders, {"": matcher}, mine)
        free[node], matching[node] = units.free[""], units.matching[""]
        errors += units.errors.get("", ())
    return DraCapacity(free, matching, tuple(dict.fromkeys(errors)))


# --- the ResourceClaim the controller makes ------------------------------------------------


def request_name(index: int) -> str:
    """The name of the ``index``-th unit's request (and of its VMI gpus entry's
    ``requestName``)."""
    return f"{keys.DRA_REQUEST_PREFIX}{index}"


def _owner_reference(gpu_claim: Obj) -> dict[str, Any]:
    meta = gpu_claim.get("metadata") or {}
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def resource_claim_for(gpu_claim: Obj, source: DraSource) -> MutableObj:
    """The ResourceClaim the controller makes for a claim of a ``dra`` class: the claim's
    name and namespace, owned by it (deleting the claim deletes it), one request per unit.

    One request per unit, each for exactly one device, because KubeVirt attaches a device
    per gpus entry and refuses two entries naming one (claimName, requestName) pair."""
    meta = gpu_claim.get("metadata") or {}
    spec = gpu_claim.get("spec") or {}
    exactly: dict[str, Any] = {
        "deviceClassName": source.device_class,
        "allocationMode": "ExactCount",
        "count": 1,
    }
    if source.selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in source.selectors]
    count = max(int(spec.get("count") or 1), 1)
    return {
        "apiVersion": keys.RESOURCE_CLAIM.api_version,
        "kind": keys.RESOURCE_CLAIM.kind,
        "metadata": {
            "name": str(meta.get("name") or ""),
            "namespace": str(meta.get("namespace") or ""),
            "labels": {
                keys.LABEL_MANAGED_BY: keys.MANAGED_BY_CONTROLLER,
                keys.LABEL_DRA_CLASS: str(spec.get("class") or ""),
            },
            "ownerReferences": [_owner_reference(gpu_claim)],
        },
        "spec": {
            "devices": {
                "requests": [
                    {"name": request_name(i), "exactly": dict(exactly)} for i in range(count)
                ]
            }
        },
    }


def made_for(resource_claim: Obj, gpu_claim: Obj) -> bool:
    """Whether the controller made this ResourceClaim for this claim: the same namespace and
    name, and a controller reference naming the claim's uid (a tenant can copy a name and
    labels, not a uid it has not been given)."""
    uid = str((gpu_claim.get("metadata") or {}).get("uid") or "")
    if not uid or key_of(resource_claim) != key_of(gpu_claim):
        return False
    return controller_claim_uid(resource_claim) == uid


def controller_claim_uid(resource_claim: Obj) -> str:
    """The uid of the GPUClaim a ResourceClaim names as its controller ("" for none)."""
    for ref in (resource_claim.get("metadata") or {}).get("ownerReferences") or ():
        if (
            ref.get("controller") is True
            and ref.get("kind") == keys.KIND_CLAIM
            and str(ref.get("apiVersion") or "").split("/", maxsplit=1)[0] == keys.GROUP
        ):
            return str(ref.get("uid") or "")
    return ""


def reserved_for_entry(gpu_claim: Obj) -> dict[str, str]:
    """The ``status.reservedFor`` entry that keeps the claim itself a consumer of its
    ResourceClaim, so Kubernetes keeps the allocation while no pod uses it (VEP 344)."""
    meta = gpu_claim.get("metadata") or {}
    return {
        "apiGroup": keys.GROUP,
        "resource": keys.PLURAL_CLAIMS,
        "name": str(meta.get("name") or ""),
        "uid": str(meta.get("uid") or ""),
    }


def is_reserved_for(resource_claim: Obj, gpu_claim: Obj) -> bool:
    """Whether the ResourceClaim's ``status.reservedFor`` holds the claim's entry."""
    wanted = reserved_for_entry(gpu_claim)
    return any(
        {k: str(entry.get(k) or "") for k in wanted} == wanted
        for entry in (resource_claim.get("status") or {}).get("reservedFor") or ()
    )


# --- the VMI side --------------------------------------------------------------------------


def vmi_claim_entry_name(claim_name: str) -> str:
    """The name of a held claim's ``spec.resourceClaims`` entry in a VMI: a DNS label, as
    KubeVirt and the launcher pod want, readable when the claim's name allows."""
    plain = keys.VMI_RESOURCE_CLAIM_PREFIX + claim_name
    if keys.is_dns_label(plain):
        return plain
    digest = hashlib.sha256(claim_name.encode()).hexdigest()[:10]
    head = plain.lower().replace(".", "-")[: 63 - 11].rstrip("-")
    return f"{head}-{digest}"


@dataclass(frozen=True)
class VmiClaimEntries:
    """What a VMI of a ``dra`` class carries for one held claim (KubeVirt's DRA form): one
    ``spec.resourceClaims`` entry naming the claim's ResourceClaim, and one
    ``spec.domain.devices.gpus`` entry per unit naming its request."""

    resource_claim: dict[str, str]
    gpus: tuple[dict[str, str], ...]


def vmi_claim_entries(claim_name: str, count: int, first_unit: int = 0) -> VmiClaimEntries:
    """The entries for a claim of ``count`` units whose first unit is the ``first_unit``-th
    of its VM's set: gpus entries are named per unit of the set, as for ``devicePlugin``
    classes, so several claims' entries never collide."""
    entry = vmi_claim_entry_name(claim_name)
    return VmiClaimEntries(
        resource_claim={"name": entry, "resourceClaimName": claim_name},
        gpus=tuple(
            {
                "name": f"{keys.VMI_GPU_NAME_PREFIX}{first_unit + i}",
                "claimName": entry,
                "requestName": request_name(i),
            }
            for i in range(count)
        ),
    )
