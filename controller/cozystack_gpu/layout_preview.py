"""A node layout change as the binder would judge it: what it does to the claims of a cluster.

``gpu_node_layout``'s action plugin (through ``plugins/module_utils/gpu_layout_cluster.py``)
asks this before it drains a node and changes its GPUs. The answer comes from the binder's
own code, not a copy of its rules: its cluster view (``cluster.listing.view_of_listing``, as
the ``kubectl gpu`` what-if builds it), its placement model (``model``: ``plan``,
``place_set``, ``eligibility``) and its settings' defaults. Pure: listings and the host
part's report in, the module's ``holds`` out; only :func:`read_cluster` talks to the API.

It ships in the collection's ``controller/`` directory and imports with the standard library
alone (the kubernetes client only when :func:`read_cluster` lists), so the Ansible
controller needs nothing but Python 3.11 to judge a change.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cozystack_gpu import config, keys
from cozystack_gpu.cluster.listing import view_of_listing
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.model import (
    Action,
    ClassInfo,
    NodeInfo,
    Placement,
    Plan,
    Snapshot,
    Step,
    plan,
    set_placement,
)
from cozystack_gpu.model.eligibility import why_not_placeable
from cozystack_gpu.objects import MutableObj

if TYPE_CHECKING:
    from kubernetes import client

__all__ = [
    "VFIO_DRIVERS",
    "after_objects",
    "consequences",
    "read_cluster",
]

# Objects per kind name (keys.ApiKind.kind), as listed; a kind left out counts as empty.
Listing = Mapping[str, Sequence[Mapping[str, Any]]]

# The drivers a passthrough function is bound to: kubelet advertises it under the name the
# device plugin gives its device ID.
VFIO_DRIVERS = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci"})


# --- reading -------------------------------------------------------------------------------


def read_cluster(api_client: client.ApiClient) -> dict[str, list[MutableObj]]:
    """Every object the model is built from, by kind, as the API returns them (a kind whose CRD
    is not installed, such as KubeVirt's on a cluster without it, is empty)."""
    # Only here: judging a change needs no client, listing does.
    from cozystack_gpu.cluster import informer

    objects: dict[str, list[MutableObj]] = {}
    for kind in keys.MODEL_KINDS:
        list_fn = informer.list_function(api_client, kind)
        try:
            response = list_fn(_preload_content=False, _request_timeout=60)
        except Exception as exc:  # the client's ApiException, without importing it here
            if getattr(exc, "status", None) == 404 and kind.group:
                objects[kind.kind] = []
                continue
            raise
        objects[kind.kind] = list(json.loads(response.data).get("items") or [])
    return objects


# --- the objects after the change -----------------------------------------------------------


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _with_state(node: Mapping[str, Any], state: str) -> MutableObj:
    changed: MutableObj = copy.deepcopy(dict(node))
    changed.setdefault("metadata", {}).setdefault("labels", {})[keys.LABEL_NODE_LAYOUT_STATE] = (
        state
    )
    return changed


def _passthrough_names(gpunodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Device ID -> the resource name a device plugin advertises for it on vfio-pci, from
    every GPUNode: what kubelet says beats what the host's pci.ids predicts."""
    names: dict[str, str] = {}
    for gpunode in gpunodes:
        for device in (gpunode.get("status") or {}).get("devices") or []:
            if (
                device.get("driver") in VFIO_DRIVERS
                and device.get("deviceID")
                and device.get("resourceName")
            ):
                names.setdefault(str(device["deviceID"]), str(device["resourceName"]))
    return names


def after_objects(
    node: Mapping[str, Any],
    gpunode: Mapping[str, Any] | None,
    functions: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str],
    known_names: Mapping[str, str],
    vfio: frozenset[str] = VFIO_DRIVERS,
) -> tuple[MutableObj, MutableObj]:
    """The Node and GPUNode as kubelet and the node agent will report them after the change.

    Changed functions get the devices the host part predicts (a passthrough name as kubelet
    already advertises that device ID elsewhere, when it does); the Node's allocatable moves
    by the same number of units per resource name; labels are ``labels``.
    """
    node_after: MutableObj = copy.deepcopy(dict(node))
    node_after.setdefault("metadata", {})["labels"] = dict(labels)
    gpunode_after: MutableObj = (
        copy.deepcopy(dict(gpunode)) if gpunode else {"metadata": {"name": _name(node)}}
    )
    status: MutableObj = gpunode_after.setdefault("status", {})
    devices: dict[str, MutableObj] = {
        str(d.get("pciAddress")): d for d in status.get("devices") or []
    }
    delta: dict[str, int] = {}
    for function in functions:
        if not function.get("changed"):
            continue
        address = str(function["address"])
        old = devices.get(address)
        if old is not None and old.get("resourceName"):
            name = str(old["resourceName"])
            delta[name] = delta.get(name, 0) - int(old.get("allocatable") or 0)
        after = function.get("after") or {}
        entry = dict(old or {"pciAddress": address})
        entry.pop("resourceName", None)
        entry["allocatable"] = 0
        entry["driver"] = after.get("driver") or ""
        for resource, units in sorted((after.get("devices") or {}).items()):
            if after.get("driver") in vfio and function.get("device_id") in known_names:
                resource = known_names[str(function["device_id"])]
            entry["resourceName"] = resource
            entry["allocatable"] = int(units)
            delta[resource] = delta.get(resource, 0) + int(units)
        devices[address] = entry
    status["devices"] = [devices[a] for a in sorted(devices)]
    status["resourceNames"] = sorted(
        {str(d["resourceName"]) for d in devices.values() if d.get("resourceName")}
    )
    allocatable = node_after.setdefault("status", {}).setdefault("allocatable", {})
    for resource, change in delta.items():
        try:
            before = int(str(allocatable.get(resource, "0")))
        except ValueError:
            before = 0
        allocatable[resource] = str(max(before + change, 0))
    return node_after, gpunode_after


# --- the binder's judgement -----------------------------------------------------------------


@dataclass
class _World:
    """The objects of one what-if, and the snapshot the binder would build from them."""

    view: ClusterView
    snapshot: Snapshot

    def node_info(self, name: str) -> NodeInfo:
        info = self.view.node_info(name)
        if info is None:  # every world holds the node: it stands in for the listed one
            raise LookupError(f"there is no Node named {name} in the cluster")
        return info


def _world(
    settings: config.Config,
    objects: Listing,
    now: float,
    replace: Mapping[str, MutableObj] | None = None,
) -> _World:
    """The binder's view and snapshot of ``objects``, with objects of ``replace`` (by kind)
    standing in for the ones of the same name."""
    listing: dict[str, list[Mapping[str, Any]]] = {}
    for kind in keys.BINDER_WATCHES:
        items = list(objects.get(kind.kind, ()))
        if replace and kind.kind in replace:
            stand_in = replace[kind.kind]
            items = [o for o in items if _name(o) != _name(stand_in)] + [stand_in]
        listing[kind.kind] = items
    view, snapshot = view_of_listing(listing, settings, now)
    return _World(view, snapshot)


def _claims_on(objects: Listing, node: str) -> list[Mapping[str, Any]]:
    return [
        c
        for c in objects.get("GPUClaim", ())
        if ((c.get("status") or {}).get("nodeName") or None) == node
    ]


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _leaving(world: _World, node: str, now: float, result: Plan | None = None) -> list[Action]:
    """The binder's next pass over ``world`` (or its ``result``): its moves and losses of
    claims on ``node``."""
    steps = (Step.MOVE, Step.LOSE)
    found = []
    for action in (result or plan(world.snapshot, now)).actions:
        if action.step not in steps:
            continue
        on_node = [
            k
            for k in action.claims
            if (c := world.snapshot.claim(k)) is not None and c.node == node
        ]
        if on_node:
            found.append(action)
    return found


def _set_entry(world: _World, action: Action) -> dict[str, Any]:
    claims = [world.snapshot.claim(k) for k in action.claims]
    entry: dict[str, Any] = {
        "claims": sorted(str(k) for k in action.claims),
        "classes": sorted({c.class_name for c in claims if c is not None}),
        "units": sum(c.count for c in claims if c is not None),
    }
    if action.node:
        entry["to"] = action.node
    if action.refusal is not None:
        entry["why"] = action.refusal.message
    elif action.why:
        entry["why"] = action.why
    return entry


def _class_units(info: NodeInfo, classes: Sequence[ClassInfo]) -> dict[str, int]:
    """Units of each class the node offers, pending state aside (as once applied)."""
    capacity = info.capacity()
    units = {}
    for klass in classes:
        if why_not_placeable(info, klass, classes) is None:
            units[klass.name] = capacity.get(klass.resource_name, 0)
        else:
            units[klass.name] = 0
    return units


def consequences(
    objects: Listing,
    node_name: str,
    functions: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str],
    now: float,
    unforeseen: Sequence[str] = (),
) -> dict[str, Any]:
    """What applying the layout does to the claims of the cluster ``objects`` describe.

    ``functions`` is the host part's report (``gpu_node_layout``'s ``functions``), ``labels``
    the Node's labels once the layout is applied. The answer is the module's ``holds``: per
    class on this node its units ``before`` and ``after``; per changed function its devices
    and the classes they feed; ``affected``, the sets the change itself pushes off the node
    (the binder's pass over the cluster with the node as it will be); ``drain``, whether any
    held unit is affected; then, when it is, where the drain moves the node's unattached
    sets (``moves``: the binder's pass with the node pending, which serves nothing) and
    which go ``Lost`` for lack of room (``lost``, with ``fits_after`` when the node itself,
    once changed, could take them back); and ``attached``: claims attached to a running
    VMI, ``affected`` when their class loses units here.

    Raises :class:`LookupError` when ``objects`` hold no Node named ``node_name``.
    """
    settings = config.from_arguments(None)
    nodes = {_name(n): n for n in objects.get("Node", ())}
    node = nodes.get(node_name)
    if node is None:
        raise LookupError(f"there is no Node named {node_name} in the cluster")
    gpunode = next((g for g in objects.get("GPUNode", ()) if _name(g) == node_name), None)
    applied = keys.LayoutState.APPLIED.value
    node_after, gpunode_after = after_objects(
        node, gpunode, functions, labels, _passthrough_names(objects.get("GPUNode", ()))
    )
    before = _world(settings, objects, now, {"Node": _with_state(node, applied)})
    after = _world(settings, objects, now, {"Node": node_after, "GPUNode": gpunode_after})
    classes = sorted(before.snapshot.classes(), key=lambda k: k.name)
    units_before = _class_units(before.node_info(node_name), classes)
    units_after = _class_units(after.node_info(node_name), classes)
    losing = {k.name for k in classes if units_after[k.name] < units_before[k.name]}
    affected = _affected_report(before, after, node_name, now)
    attached = _attached_report(objects, node_name, losing)
    holds: dict[str, Any] = {
        "known": True,
        "node": node_name,
        "classes": _class_report(classes, units_before, units_after),
        "functions": _function_report(functions, classes, units_before, units_after),
        "affected": affected,
        "attached": attached,
        "drain": bool(affected) or any(a["affected"] for a in attached),
        "moves": [],
        "lost": [],
        "unforeseen": list(unforeseen),
    }
    if unforeseen:
        holds["why"] = (
            f"the vGPUs of {', '.join(unforeseen)} depend on VFs not enabled yet: units"
            " they add are not counted"
        )
    if holds["drain"]:
        pending = _world(
            settings,
            objects,
            now,
            {"Node": _with_state(node, keys.LayoutState.PENDING.value)},
        )
        holds["moves"], holds["lost"] = _drain_report(pending, after, node_name, now)
    return holds


def _class_report(
    classes: Sequence[ClassInfo], units_before: Mapping[str, int], units_after: Mapping[str, int]
) -> list[dict[str, Any]]:
    """Per class on the node, its units before and after (classes with none either way
    left out)."""
    return [
        {
            "class": k.name,
            "resource": k.resource_name,
            "before": units_before[k.name],
            "after": units_after[k.name],
        }
        for k in classes
        if units_before[k.name] or units_after[k.name]
    ]


def _function_report(
    functions: Sequence[Mapping[str, Any]],
    classes: Sequence[ClassInfo],
    units_before: Mapping[str, int],
    units_after: Mapping[str, int],
) -> list[dict[str, Any]]:
    """Per changed function, its devices and the classes they feed, before and after."""

    def feeds(devices: Mapping[str, int], units: Mapping[str, int]) -> list[str]:
        return sorted(k.name for k in classes if k.resource_name in devices and units[k.name])

    return [
        {
            "address": f["address"],
            "gpu": f.get("gpu"),
            "before": dict((f.get("before") or {}).get("devices") or {}),
            "after": dict((f.get("after") or {}).get("devices") or {}),
            "classes_before": feeds((f.get("before") or {}).get("devices") or {}, units_before),
            "classes_after": feeds((f.get("after") or {}).get("devices") or {}, units_after),
            "users": list(f.get("users") or []),
        }
        for f in functions
        if f.get("changed")
    ]


def _affected_report(
    before: _World, after: _World, node_name: str, now: float
) -> list[dict[str, Any]]:
    """The sets the change itself pushes off the node: those the binder's pass moves off it
    as it will be, less those it moves off already."""
    already = {tuple(a.claims) for a in _leaving(before, node_name, now)}
    return [
        _set_entry(after, a)
        for a in _leaving(after, node_name, now)
        if tuple(a.claims) not in already
    ]


def _attached_report(
    objects: Listing, node_name: str, losing: Collection[str]
) -> list[dict[str, Any]]:
    """Claims on the node attached to a VMI, ``affected`` when their class loses units."""
    attached = []
    for claim in _claims_on(objects, node_name):
        status = claim.get("status") or {}
        vmi = status.get("attachedTo")
        if not vmi or status.get("phase") not in ("Attached", "Bound"):
            continue
        klass = str((claim.get("spec") or {}).get("class", ""))
        namespace = (claim.get("metadata") or {}).get("namespace", "")
        attached.append(
            {
                "claim": _key(claim),
                "class": klass,
                "vmi": f"{namespace}/{vmi}",
                "phase": status.get("phase"),
                "affected": klass in losing,
            }
        )
    return attached


def _drain_report(
    pending: _World, after: _World, node_name: str, now: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Where the drain (the binder's pass with the node pending) moves the node's sets, and
    which go Lost, each with ``fits_after``: whether the node once changed takes it back.
    Records the drain's updates in ``after``."""
    moves: list[dict[str, Any]] = []
    lost_sets: list[dict[str, Any]] = []
    drain = plan(pending.snapshot, now)
    # The node once applied, after the drain: can it take a Lost set back?
    for updated in drain.updates.values():
        after.snapshot.upsert_claim(updated)
    for action in _leaving(pending, node_name, now, drain):
        entry = _set_entry(pending, action)
        if action.step == Step.MOVE:
            moves.append(entry)
            continue
        lost = [c for k in action.claims if (c := after.snapshot.claim(k)) is not None]
        back = (
            set_placement.place_set(after.snapshot, lost, now, nodes=(node_name,)) if lost else None
        )
        entry["fits_after"] = isinstance(back, Placement)
        lost_sets.append(entry)
    return moves, lost_sets
