# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A node layout change as the cluster sees it: what it does to claims, and the drain.

The host part (``gpu_layout.py``) knows the GPUs; this part knows the claims. It runs on the
Ansible controller, in the ``gpu_node_layout`` action plugin, where the kubeconfig is (the
``node_labels`` role and the GPUClass modules talk to the API from there too).

**One model.** The consequences come from the controller's own code, not a copy of its
rules: the binder's cluster view (``cozystack_gpu.cluster.view``, which builds model inputs
from API objects with ``objects.translate``), its placement model (``cozystack_gpu.model``:
``Snapshot.build``, ``plan``, ``place_set``) and its settings' defaults. They are pure
Python and ship in this collection's ``controller/`` directory, which :func:`controller`
imports them from; the model needs Python 3.11, as the controller does, which is why it is
not linked into ``module_utils`` for the GPU hosts (whose Python may be older, and which
hold no kubeconfig).

:func:`consequences` takes every object the binder watches, the host part's report of each
function before and after, and the labels the host will earn; it answers which classes lose
or gain units on the node, which holds the change pushes off it, where the drain moves the
node's unattached sets (the binder's own pass over the cluster with the node pending), which
go ``Lost`` for lack of room, and which claims are attached to a running VMI.
:func:`wait_for_drain` and :func:`set_layout_state` are the drain's two API parts.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_node_labels
else:
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_node_labels

__all__ = [
    "CONTROLLER_DIR",
    "DrainTimeout",
    "Unavailable",
    "attached_on",
    "consequences",
    "controller",
    "read_cluster",
    "render",
    "set_layout_state",
    "unattached_on",
    "wait_for_drain",
]

# The collection ships the controller package beside plugins/ (see galaxy.yml).
CONTROLLER_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "controller"
)

Obj = dict[str, Any]


class Unavailable(Exception):
    """The cluster part cannot run here; the message says why and what would fix it."""


class DrainTimeout(Exception):
    """The binder did not move the node's unattached claims away in time."""

    def __init__(self, message: str, left: Sequence[str]) -> None:
        super().__init__(message)
        self.left = list(left)


def controller() -> SimpleNamespace:
    """The controller's pure parts: keys, settings, model, cluster view, API listing.

    This collection's own copy comes first (the version the module was written against);
    a ``cozystack_gpu`` already imported in this process is used as it is.
    """
    if "cozystack_gpu" not in sys.modules and os.path.isdir(
        os.path.join(CONTROLLER_DIR, "cozystack_gpu")
    ):
        sys.path.insert(0, CONTROLLER_DIR)
    names = ("config", "cluster.informer", "keys", "model", "cluster.view", "model.eligibility")
    try:
        # Imported here, by name: the host part of the module never needs them.
        found = {n: importlib.import_module("cozystack_gpu." + n) for n in names}
    except (ImportError, SyntaxError) as exc:
        raise Unavailable(
            f"the controller's placement model cannot be imported ({exc}); it needs Python"
            " 3.11 and the kubernetes client on the Ansible controller, and this"
            f" collection's controller/ directory ({CONTROLLER_DIR})"
        ) from None
    return SimpleNamespace(**{n.rsplit(".", 1)[-1]: m for n, m in found.items()})


# --- reading -------------------------------------------------------------------------------


def read_cluster(api_client: Any) -> dict[str, list[Obj]]:
    """Every object the binder watches, by kind, as the API returns them (a kind whose CRD
    is not installed, such as KubeVirt's on a cluster without it, is empty)."""
    ctl = controller()
    objects: dict[str, list[Obj]] = {}
    for kind in ctl.keys.BINDER_WATCHES:
        list_fn = ctl.informer.list_function(api_client, kind)
        try:
            response = list_fn(_preload_content=False, _request_timeout=60)
        except Exception as exc:  # the client's ApiException, without importing it here
            if getattr(exc, "status", None) == 404 and kind.group:
                objects[kind.kind] = []
                continue
            raise
        objects[kind.kind] = list(json.loads(response.data).get("items") or [])
    return objects


# --- the consequences ----------------------------------------------------------------------


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _with_state(node: Obj, ctl: SimpleNamespace, state: str) -> Obj:
    changed = copy.deepcopy(node)
    changed.setdefault("metadata", {}).setdefault("labels", {})[
        ctl.keys.LABEL_NODE_LAYOUT_STATE
    ] = state
    return changed


def after_labels(
    current: Mapping[str, str], gpu_labels: Mapping[str, str], layout_name: str | None, ctl: Any
) -> dict[str, str]:
    """The Node's labels once the layout is applied: the GPU labels the host then earns,
    its layout name and state ``applied``; other labels as they are."""
    labels = {k: v for k, v in current.items() if not gpu_node_labels.is_gpu_label(k)}
    labels.update(gpu_labels)
    labels[ctl.keys.LABEL_NODE_LAYOUT_STATE] = ctl.keys.LayoutState.APPLIED.value
    if layout_name:
        labels[ctl.keys.LABEL_NODE_LAYOUT] = ctl.keys.node_label_name(layout_name)
    return labels


def _passthrough_names(gpunodes: Iterable[Obj], vfio: frozenset[str]) -> dict[str, str]:
    """Device ID -> the resource name a device plugin advertises for it on vfio-pci, from
    every GPUNode: what kubelet says beats what the host's pci.ids predicts."""
    names: dict[str, str] = {}
    for gpunode in gpunodes:
        for device in (gpunode.get("status") or {}).get("devices") or []:
            if (
                device.get("driver") in vfio
                and device.get("deviceID")
                and device.get("resourceName")
            ):
                names.setdefault(str(device["deviceID"]), str(device["resourceName"]))
    return names


def after_objects(
    node: Obj,
    gpunode: Obj | None,
    functions: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str],
    known_names: Mapping[str, str],
    vfio: frozenset[str],
) -> tuple[Obj, Obj]:
    """The Node and GPUNode as kubelet and the node agent will report them after the change.

    Changed functions get the devices the host part predicts (a passthrough name as kubelet
    already advertises that device ID elsewhere, when it does); the Node's allocatable moves
    by the same number of units per resource name; labels are ``labels``.
    """
    node_after = copy.deepcopy(node)
    node_after.setdefault("metadata", {})["labels"] = dict(labels)
    gpunode_after: Obj = copy.deepcopy(gpunode) if gpunode else {"metadata": {"name": _name(node)}}
    status: Obj = gpunode_after.setdefault("status", {})
    devices: dict[str, Obj] = {str(d.get("pciAddress")): d for d in status.get("devices") or []}
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


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@dataclass
class _World:
    """The objects of one what-if, and the snapshot the binder would build from them."""

    view: Any
    snapshot: Any


def _world(
    ctl: SimpleNamespace,
    settings: Any,
    objects: Mapping[str, Sequence[Obj]],
    now: float,
    replace: Mapping[str, Obj] | None = None,
) -> _World:
    """The binder's view and snapshot of ``objects``, with objects of ``replace`` (by kind)
    standing in for the ones of the same name."""
    view = ctl.view.ClusterView(settings, ctl.keys.BINDER_WATCHES)
    for kind in ctl.keys.BINDER_WATCHES:
        items = list(objects.get(kind.kind, ()))
        if replace and kind.kind in replace:
            stand_in = replace[kind.kind]
            items = [o for o in items if _name(o) != _name(stand_in)] + [stand_in]
        view.relist(kind.kind, items)
    view.refresh_staleness(now)
    return _World(view, view.build_snapshot(now))


def _claims_on(objects: Mapping[str, Sequence[Obj]], node: str) -> list[Obj]:
    return [
        c
        for c in objects.get("GPUClaim", ())
        if ((c.get("status") or {}).get("nodeName") or None) == node
    ]


def _key(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _leaving(
    ctl: SimpleNamespace, world: _World, node: str, now: float, result: Any = None
) -> list[Any]:
    """The binder's next pass over ``world`` (or its ``result``): its moves and losses of
    claims on ``node``."""
    steps = (ctl.model.Step.MOVE, ctl.model.Step.LOSE)
    found = []
    for action in (result or ctl.model.plan(world.snapshot, now)).actions:
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


def _set_entry(world: _World, action: Any) -> dict[str, Any]:
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


def _class_units(ctl: SimpleNamespace, info: Any, classes: Sequence[Any]) -> dict[str, int]:
    """Units of each class the node offers, pending state aside (as once applied)."""
    capacity = info.capacity()
    units = {}
    for klass in classes:
        if ctl.eligibility.why_not_placeable(info, klass, classes) is None:
            units[klass.name] = capacity.get(klass.resource_name, 0)
        else:
            units[klass.name] = 0
    return units


def consequences(
    objects: Mapping[str, Sequence[Obj]],
    node_name: str,
    functions: Sequence[Mapping[str, Any]],
    gpu_labels: Mapping[str, str],
    layout_name: str | None,
    now: float,
    unforeseen: Sequence[str] = (),
) -> dict[str, Any]:
    """What applying the layout does to the claims of the cluster ``objects`` describe.

    ``functions`` and ``gpu_labels`` are the host part's report (``gpu_node_layout``'s
    ``functions`` and ``node_labels``). The answer is the module's ``holds``: per class on
    this node its units ``before`` and ``after``; per changed function its devices and the
    classes they feed; ``affected``, the sets the change itself pushes off the node (the
    binder's pass over the cluster with the node as it will be); ``drain``, whether any
    held unit is affected; then, when it is, where the drain moves the node's unattached
    sets (``moves``: the binder's pass with the node pending, which serves nothing) and
    which go ``Lost`` for lack of room (``lost``, with ``fits_after`` when the node itself,
    once changed, could take them back); and ``attached``: claims attached to a running
    VMI, ``affected`` when their class loses units here.
    """
    ctl = controller()
    settings = ctl.config.from_arguments(None)
    nodes = {_name(n): n for n in objects.get("Node", ())}
    node = nodes.get(node_name)
    if node is None:
        raise Unavailable(
            f"there is no Node named {node_name} in the cluster; set node_name to the name"
            " kubelet registered for this host"
        )
    gpunode = next((g for g in objects.get("GPUNode", ()) if _name(g) == node_name), None)
    applied = ctl.keys.LayoutState.APPLIED.value
    vfio = frozenset({"vfio-pci", "nvgrace_gpu_vfio_pci"})
    labels = after_labels(_labels(node), gpu_labels, layout_name, ctl)
    node_after, gpunode_after = after_objects(
        node,
        gpunode,
        functions,
        labels,
        _passthrough_names(objects.get("GPUNode", ()), vfio),
        vfio,
    )
    before = _world(ctl, settings, objects, now, {"Node": _with_state(node, ctl, applied)})
    after = _world(ctl, settings, objects, now, {"Node": node_after, "GPUNode": gpunode_after})
    classes = sorted(before.snapshot.classes(), key=lambda k: k.name)
    units_before = _class_units(ctl, before.view.node_info(node_name), classes)
    units_after = _class_units(ctl, after.view.node_info(node_name), classes)
    class_report = [
        {
            "class": k.name,
            "resource": k.resource_name,
            "before": units_before[k.name],
            "after": units_after[k.name],
        }
        for k in classes
        if units_before[k.name] or units_after[k.name]
    ]
    losing = {k.name for k in classes if units_after[k.name] < units_before[k.name]}

    def feeds(devices: Mapping[str, int], units: Mapping[str, int]) -> list[str]:
        return sorted(k.name for k in classes if k.resource_name in devices and units[k.name])

    function_report = [
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

    already = {tuple(a.claims) for a in _leaving(ctl, before, node_name, now)}
    affected = [
        _set_entry(after, a)
        for a in _leaving(ctl, after, node_name, now)
        if tuple(a.claims) not in already
    ]
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
    holds: dict[str, Any] = {
        "known": True,
        "node": node_name,
        "classes": class_report,
        "functions": function_report,
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
            ctl,
            settings,
            objects,
            now,
            {"Node": _with_state(node, ctl, ctl.keys.LayoutState.PENDING.value)},
        )
        drain = ctl.model.plan(pending.snapshot, now)
        # The node once applied, after the drain: can it take a Lost set back?
        for updated in drain.updates.values():
            after.snapshot.upsert_claim(updated)
        for action in _leaving(ctl, pending, node_name, now, drain):
            entry = _set_entry(pending, action)
            if action.step == ctl.model.Step.MOVE:
                holds["moves"].append(entry)
                continue
            lost = [c for k in action.claims if (c := after.snapshot.claim(k)) is not None]
            back = after.snapshot.place_set(lost, now, nodes=(node_name,)) if lost else None
            entry["fits_after"] = isinstance(back, ctl.model.Placement)
            holds["lost"].append(entry)
    return holds


# --- rendering -----------------------------------------------------------------------------


def _devices_text(devices: Mapping[str, int]) -> str:
    if not devices:
        return "nothing"
    return ", ".join(f"{n} x{u}" if u != 1 else n for n, u in sorted(devices.items()))


def render(holds: Mapping[str, Any]) -> str:
    """``holds`` as lines a person reads in a diff."""
    if not holds.get("known"):
        return f"claims: consequences unknown ({holds.get('why', 'no cluster access')})\n"
    lines = [f"node {holds['node']}:"]
    for f in holds.get("functions") or []:
        lines.append(
            f"  {f['address']}: {_devices_text(f['before'])} -> {_devices_text(f['after'])}"
            + (f" (in use by {', '.join(f['users'])})" if f.get("users") else "")
        )
    for c in holds.get("classes") or []:
        if c["before"] != c["after"]:
            change = c["after"] - c["before"]
            lines.append(f"  class {c['class']}: {c['before']} -> {c['after']} units ({change:+d})")
    if not holds.get("drain"):
        lines.append("  no held unit is affected: applied without draining the node")
    else:
        lines.append("  drains: the node is marked pending while its unattached claims move")
    for entry in holds.get("affected") or []:
        lines.append(f"  loses its units: {', '.join(entry['claims'])}")
    for entry in holds.get("moves") or []:
        lines.append(f"  move {', '.join(entry['claims'])} -> {entry['to']}")
    for entry in holds.get("lost") or []:
        back = "; fits here again after the change" if entry.get("fits_after") else ""
        lines.append(f"  Lost {', '.join(entry['claims'])}: {entry.get('why', 'no room')}{back}")
    for entry in holds.get("attached") or []:
        effect = "its units go: refused without force" if entry["affected"] else "unaffected"
        lines.append(f"  attached {entry['claim']} -> VMI {entry['vmi']} ({effect})")
    for vmi in holds.get("breaks") or []:
        lines.append(f"  breaks VMI {vmi} (force)")
    return "\n".join(lines) + "\n"


# --- the drain's API parts -----------------------------------------------------------------


def set_layout_state(
    api_client: Any,
    node: str,
    state: str,
    labels: Mapping[str, str] | None = None,
    dry_run: bool = False,
) -> bool:
    """Merge-patch the Node's layout state (and ``labels``, GPU labels no longer earned
    removed when they are given); False when the Node already reads so."""
    from kubernetes import client

    ctl = controller()
    core = client.CoreV1Api(api_client)
    current = _labels(api_client.sanitize_for_serialization(core.read_node(node)))
    wanted: dict[str, str | None] = {ctl.keys.LABEL_NODE_LAYOUT_STATE: state}
    if labels is not None:
        wanted.update(labels)
        for key in current:
            if gpu_node_labels.is_gpu_label(key) and key not in labels:
                wanted[key] = None
    patch = {k: v for k, v in wanted.items() if current.get(k) != v}
    if not patch:
        return False
    core.patch_node(node, {"metadata": {"labels": patch}}, dry_run="All" if dry_run else None)
    return True


def _claims_of_node(api_client: Any, node: str) -> list[Obj]:
    from kubernetes import client

    ctl = controller()
    custom = client.CustomObjectsApi(api_client)
    response = custom.list_cluster_custom_object(
        ctl.keys.GROUP,
        ctl.keys.VERSION,
        ctl.keys.PLURAL_CLAIMS,
        field_selector=f"status.nodeName={node}",
        _preload_content=False,
        _request_timeout=60,
    )
    return list(json.loads(response.data).get("items") or [])


def unattached_on(api_client: Any, node: str) -> list[str]:
    """Claims bound to ``node`` that no VMI holds: what the drain waits for to leave."""
    return sorted(
        _key(c)
        for c in _claims_of_node(api_client, node)
        if (c.get("status") or {}).get("phase") == "Bound"
        and not (c.get("status") or {}).get("attachedTo")
    )


def attached_on(api_client: Any, node: str, classes: Iterable[str]) -> list[dict[str, str]]:
    """Claims of ``classes`` on ``node`` attached to a VMI (running or starting)."""
    wanted = set(classes)
    found = []
    for claim in _claims_of_node(api_client, node):
        status = claim.get("status") or {}
        klass = str((claim.get("spec") or {}).get("class", ""))
        if (
            klass in wanted
            and status.get("attachedTo")
            and status.get("phase")
            in (
                "Attached",
                "Bound",
            )
        ):
            namespace = (claim.get("metadata") or {}).get("namespace", "")
            found.append({"claim": _key(claim), "vmi": f"{namespace}/{status['attachedTo']}"})
    return found


def wait_for_drain(
    api_client: Any,
    node: str,
    timeout: float,
    poll: float,
    progress: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Wait until no unattached claim is bound to ``node``; the claims that left.

    ``progress`` hears each change of what is left (and at least every 30 s). Raises
    :class:`DrainTimeout` naming what is still there after ``timeout`` seconds.
    """
    deadline = clock() + timeout
    first = unattached_on(api_client, node)
    left = list(first)
    told: tuple[list[str], float] | None = None
    while left:
        now = clock()
        if told is None or told[0] != left or now - told[1] >= 30:
            progress(
                f"node {node}: waiting for the binder to move {len(left)} unattached"
                f" claim(s) away ({', '.join(left)}); {max(deadline - now, 0):.0f} s left"
            )
            told = (left, now)
        if now >= deadline:
            raise DrainTimeout(
                f"the binder did not move {', '.join(left)} off node {node} within"
                f" {timeout:g} s; the Node stays {node} layout-state=pending (it serves no"
                " class). Check that the cozystack-gpu controller runs and what the claims'"
                " Bound condition says, then run again",
                left,
            )
        sleep(poll)
        left = unattached_on(api_client, node)
    progress(f"node {node}: drained ({len(first)} claim(s) moved away or Lost)")
    return first
