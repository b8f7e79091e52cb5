"""What the binder reports about nodes and names: the settings ConfigMap (the GPU
resource names and the raw-name policy) and the GPUNode conditions. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import NodeReason
from cozystack_gpu.objects import Obj, dra
from cozystack_gpu.objects.conditions import condition, merge_conditions, same_condition
from cozystack_gpu.objects.translate import meta, name_of, rfc3339, timestamp
from cozystack_gpu.objects.translate import node_ready as translate_node_ready

# --- Settings ----------------------------------------------------------------------------


def settings_data(
    names: Iterable[str], raw_policy: keys.RawNamesPolicy, classes: Iterable[Obj] = ()
) -> dict[str, str]:
    """The gpu-settings ConfigMap's data: the effective GPU resource-name set, the
    raw-name policy and the DeviceClasses of ``dra`` classes (a tenant's own ResourceClaim
    of one is raw usage) that the ValidatingAdmissionPolicies take as a parameter."""
    device_classes = {s.device_class for c in classes if (s := dra.dra_source(c)) is not None}
    return {
        keys.SETTINGS_KEY_RESOURCE_NAMES: keys.format_resource_names(list(names)),
        keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: raw_policy.value,
        keys.SETTINGS_KEY_DRA_DEVICE_CLASSES: ",".join(sorted(device_classes)),
    }


# --- GPUNode conditions ------------------------------------------------------------------


def gpunode_conditions(
    node: Obj | None, gpunode: Obj, stale: bool, stale_after: float, now: float
) -> list[dict[str, Any]]:
    """The conditions the binder keeps on a GPUNode: ``Ready`` (does the node serve GPU
    classes now, and if not why, in words a hoster can act on) and
    ``ResourceNamesAdvertised`` (does kubelet advertise every resource name the agent
    reports for the node's devices)."""
    name = name_of(gpunode)
    return [
        _ready_condition(name, node, gpunode, stale, stale_after, now),
        _names_condition(name, node, gpunode, now),
    ]


def _ready_condition(
    name: str, node: Obj | None, gpunode: Obj, stale: bool, stale_after: float, now: float
) -> dict[str, Any]:
    def not_ready(reason: str, message: str) -> dict[str, Any]:
        return condition(keys.CONDITION_READY, False, reason, message, now)

    if node is None:
        return not_ready(
            NodeReason.NODE_GONE, f"Node {name} does not exist; the GPUNode goes with it"
        )
    reported = timestamp((gpunode.get("status") or {}).get("updatedAt"))
    if reported is None:
        return not_ready(
            NodeReason.NO_INVENTORY,
            "the node agent has not reported this node yet; check that the "
            "cozystack-gpu-agent DaemonSet runs a pod on it",
        )
    if stale:
        return not_ready(
            NodeReason.INVENTORY_STALE,
            f"the node agent last reported at {rfc3339(reported)}, more than "
            f"{stale_after:.0f} s ago: its holds stay, but nothing new is placed on the "
            "node until it reports again; check the cozystack-gpu-agent pod on this node "
            "and its logs",
        )
    if not translate_node_ready(node):
        return not_ready(NodeReason.NODE_NOT_READY, f"Node {name} is not Ready")
    if (node.get("spec") or {}).get("unschedulable"):
        return not_ready(
            NodeReason.CORDONED,
            f"Node {name} is cordoned: no new order binds here; unattached holds move where "
            "their class says onCordon: Move and stay where it says Stay (a stopped VM's "
            "hold on its local disk here stays)",
        )
    state = (meta(node).get("labels") or {}).get(keys.LABEL_NODE_LAYOUT_STATE)
    if state == keys.LayoutState.PENDING.value:
        return not_ready(
            NodeReason.LAYOUT_PENDING,
            f"the GPU layout of Node {name} is being changed "
            f"({keys.LABEL_NODE_LAYOUT_STATE}=pending): it serves no class until it is applied",
        )
    if state == keys.LayoutState.FAILED.value:
        return condition(
            keys.CONDITION_READY,
            True,
            NodeReason.LAYOUT_FAILED,
            f"the last GPU layout change of Node {name} failed "
            f"({keys.LABEL_NODE_LAYOUT_STATE}=failed); the node serves what its devices "
            "advertise; rerun the host playbook to finish the layout",
            now,
        )
    return condition(
        keys.CONDITION_READY, True, NodeReason.SERVING, "the node serves GPU classes", now
    )


def _names_condition(name: str, node: Obj | None, gpunode: Obj, now: float) -> dict[str, Any]:
    advertised = set(((node or {}).get("status") or {}).get("allocatable") or {})
    missing: dict[str, list[str]] = {}
    for device in (gpunode.get("status") or {}).get("devices") or []:
        resource = device.get("resourceName")
        if resource and resource not in advertised:
            missing.setdefault(str(resource), []).append(str(device.get("pciAddress", "?")))
    if not missing:
        return condition(
            keys.CONDITION_NAMES_ADVERTISED,
            True,
            NodeReason.ADVERTISED,
            "kubelet advertises every resource name reported for the node's devices",
            now,
        )
    parts = [f"{res} ({', '.join(sorted(addrs))})" for res, addrs in sorted(missing.items())]
    return condition(
        keys.CONDITION_NAMES_ADVERTISED,
        False,
        NodeReason.NOT_ADVERTISED,
        f"kubelet does not advertise {'; '.join(parts)}: these names were predicted from "
        "sysfs and the host's pci.ids, but the device plugin names devices from the pci.ids "
        "in its own image, or it does not run yet. These devices count as 0 units. Compare "
        f"kubectl get node {name} -o jsonpath='{{.status.allocatable}}' and name classes "
        "after what kubelet advertises",
        now,
    )


def gpunode_status_patch(
    gpunode: Obj, conditions: Iterable[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """A status merge patch of the binder's conditions, or None when they already show.

    Only ``conditions`` is sent: the agent owns every other status field and merge-patches
    only those, so neither writer overwrites the other.
    """
    current = (gpunode.get("status") or {}).get("conditions") or []
    merged: list[dict[str, Any]] = [dict(c) for c in current]
    changed = False
    for cond in conditions:
        if not same_condition(merged, cond):
            merged = merge_conditions(merged, cond)
            changed = True
    return {"status": {"conditions": merged}} if changed else None
