"""The cluster view's DRA devices (SPEC §13): what each node's ResourceSlices give the ``dra``
classes, for the model's capacity (``NodeInfo.dra_units``, ``dra_shared``).

A node's units are ``objects.dra.node_units`` over its devices, the ResourceClaims holding
them and the claims of each class held there. They are kept per node and built again only
for the nodes an event touches: a slice (every node of its pool), a ResourceClaim's
allocation (the nodes of its devices), a claim of a ``dra`` class moving (the nodes of its
ResourceClaim's devices), a DeviceClass or a ``dra`` class (every node with devices).
Each touched node is marked dirty, so the next sync gives the model its new units.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cozystack_gpu import keys
from cozystack_gpu.cluster.dirty import Dirty
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import MutableObj, Obj, dra, translate

Key = tuple[str, str]
Pool = tuple[str, str]  # (driver, pool)

# The phases in which the model counts a claim's units on its node.
_HELD = (Phase.BOUND.value, Phase.ATTACHED.value)


@dataclass(frozen=True)
class DraNode:
    """One node's units per ``dra`` class key, and the keys of classes it shares out."""

    units: Mapping[str, int]
    shared: frozenset[str]


@dataclass(frozen=True)
class _Claim:
    gpu_class: str
    node: str  # where the model counts its units; "" where it counts them nowhere
    uid: str


class DraIndex:
    def __init__(
        self,
        raw: Callable[[str], Mapping[Key, MutableObj]],
        dirty: Callable[[], Dirty],
        labels: Callable[[str], Mapping[str, str] | None],
    ) -> None:
        self._raw = raw  # a kind's objects as the view holds them
        self._dirty = dirty
        self._labels = labels  # a Node's labels, None while the view has no such Node
        self._devices: dict[str, tuple[dra.SliceDevice, ...]] | None = None  # built lazily
        self._pool_of_slice: dict[Key, tuple[Pool, frozenset[str]]] = {}  # and its nodes
        self._classes: dict[str, tuple[dra.DraSource, Mapping[str, str]]] = {}
        self._matchers: dict[str, dra.DeviceMatcher] = {}
        self._claims: dict[dra.ClaimKey, _Claim] = {}  # every claim: its class may come later
        # ResourceClaims' allocations by pool, and the uid of the claim each names its
        # controller (the controller makes one per claim of a dra class; ``made_for``).
        self._held: dict[Pool, dict[dra.DeviceId, dra.ClaimKey]] = defaultdict(dict)
        self._allocations: dict[dra.ClaimKey, frozenset[dra.DeviceId]] = {}
        self._owner_uid: dict[dra.ClaimKey, str] = {}
        self._nodes: dict[str, DraNode] = {}

    # --- events --------------------------------------------------------------------------

    def on_slice(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        touched: set[str] = set()
        before = self._pool_of_slice.pop(key, None)
        if before is not None:
            touched |= self._pool_nodes(before[0]) | before[1]
        if new is not None:
            pool = _pool(new)
            self._pool_of_slice[key] = (pool, _slice_nodes(new))
            touched |= self._pool_nodes(pool)
        self._devices = None
        self._touch(touched)

    def on_device_class(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        named = [n for n, (source, _sel) in self._classes.items() if source.device_class == key[1]]
        for name in named:
            self._matchers.pop(name, None)
        if named:
            self._touch(self._device_nodes())

    def on_resource_claim(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        claim = dra.ClaimKey(*key)
        before = self._allocations.pop(claim, frozenset())
        for device in before:
            held = self._held.get((device.driver, device.pool))
            if held is not None and held.get(device) == claim:
                del held[device]
        after = dra.allocated_devices(new) if new is not None else frozenset()
        for device in after:
            self._held[(device.driver, device.pool)][device] = claim
        if after:
            self._allocations[claim] = after
        self._owner_uid.pop(claim, None)
        if new is not None:
            self._owner_uid[claim] = dra.controller_claim_uid(new)
        self._touch(self._nodes_of(before | after))
        # The claim of its name is judged again (its ResourceClaim's next step).
        self._dirty().claims.add(ClaimKey(*key))

    def resource_claim(self, key: ClaimKey) -> MutableObj | None:
        """The ResourceClaim of a claim's name and namespace, as the view holds it."""
        return self._raw(keys.RESOURCE_CLAIM.kind).get((key.namespace, key.name))

    def on_class(self, name: str, obj: Obj | None) -> None:
        source = dra.dra_source(obj) if obj is not None else None
        selector = dict(((obj or {}).get("spec") or {}).get("nodeSelector") or {})
        entry = (source, selector) if source is not None else None
        if self._classes.get(name) == entry:
            return
        if entry is None:
            self._classes.pop(name, None)
        else:
            self._classes[name] = entry
        self._matchers.pop(name, None)
        self._touch(self._device_nodes())

    def on_claim(self, key: Key, obj: Obj | None) -> None:
        claim = dra.ClaimKey(*key)
        before = self._claims.pop(claim, None)
        after = _claim(obj) if obj is not None else None
        if after is not None:
            self._claims[claim] = after
        if before != after and self._classes and (before or after):
            # Its ResourceClaim's devices count for its class only where it is held.
            self._touch(self._nodes_of(self._allocations.get(claim, frozenset())))

    def on_node_labels(self, name: str) -> None:
        """A Node's labels decide which classes select it."""
        if self._classes:
            self._touch({name})

    # --- the model's input ---------------------------------------------------------------

    def node(self, name: str) -> DraNode | None:
        """The node's units of each ``dra`` class selecting it; None when no class is one."""
        if not self._classes:
            return None
        found = self._nodes.get(name)
        if found is None:
            found = self._nodes[name] = self._build(name)
        return found

    def _build(self, name: str) -> DraNode:
        devices = self._all_devices().get(name, ())
        labels = self._labels(name) or {}
        matchers = {
            class_name: self._matcher(class_name)
            for class_name, (_source, selector) in self._classes.items()
            if all(labels.get(k) == v for k, v in selector.items())
        }
        holders: dict[dra.DeviceId, dra.ClaimKey] = {}
        for pool in {(d.id.driver, d.id.pool) for d in devices}:
            holders.update(self._held.get(pool, {}))
        ours = {}
        for holder in set(holders.values()):
            claim = self._claims.get(holder)
            if claim is not None and claim.uid and self._owner_uid.get(holder) == claim.uid:
                ours[holder] = (claim.gpu_class, claim.node)
        units = dra.node_units(name, devices, holders, matchers, ours)
        return DraNode(
            {translate.dra_units_key(c): n for c, n in units.free.items()},
            frozenset(translate.dra_units_key(c) for c in units.shared),
        )

    def _matcher(self, name: str) -> dra.DeviceMatcher:
        matcher = self._matchers.get(name)
        if matcher is None:
            source = self._classes[name][0]
            device_class = self._raw(keys.DEVICE_CLASS.kind).get(("", source.device_class))
            matcher = dra.compile_matcher(device_class, source.selectors, name)
            self._matchers[name] = matcher
        return matcher

    # --- where things are ----------------------------------------------------------------

    def _all_devices(self) -> dict[str, tuple[dra.SliceDevice, ...]]:
        if self._devices is None:
            self._devices = dra.node_devices(self._raw(keys.RESOURCE_SLICE.kind).values())
        return self._devices

    def _device_nodes(self) -> set[str]:
        return {node for _pool, nodes in self._pool_of_slice.values() for node in nodes}

    def _pool_nodes(self, pool: Pool) -> set[str]:
        return {node for p, nodes in self._pool_of_slice.values() if p == pool for node in nodes}

    def _nodes_of(self, devices: Iterable[dra.DeviceId]) -> set[str]:
        return {node for d in devices for node in self._pool_nodes((d.driver, d.pool))}

    def _touch(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            self._nodes.pop(node, None)
            self._dirty().nodes.add(node)


def _pool(resource_slice: Obj) -> Pool:
    spec = resource_slice.get("spec") or {}
    return str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")


def _slice_nodes(resource_slice: Obj) -> frozenset[str]:
    """The nodes a slice's devices are on (its own, or each device's)."""
    spec = resource_slice.get("spec") or {}
    nodes = {str(spec.get("nodeName") or "")}
    nodes |= {str(d.get("nodeName") or "") for d in spec.get("devices") or ()}
    return frozenset(nodes - {""})


def _claim(obj: Obj) -> _Claim:
    status = obj.get("status") or {}
    node = str(status.get("nodeName") or "") if status.get("phase") in _HELD else ""
    meta = translate.meta(obj)
    return _Claim(str((obj.get("spec") or {}).get("class") or ""), node, str(meta.get("uid") or ""))
