# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The host as it will read once a node layout's plan has run: for diffs, reports and the
cluster's judgement of a change before it is made.

Pure: an inventory and a ``gpu_layout_plan.Plan`` come in, the summaries the module diffs
(``host_summary`` now, ``predict_summary`` after) and the predicted inventory the cluster
part judges claims by (``predict_inventory``) go out. Check mode reports these, so what they
foresee must be what the host reads once the same plan is applied.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import gpu_layout_plan as layout_plan
    import gpu_layout_resolve as layout_resolve
    import gpu_sysfs
else:
    try:
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_plan as layout_plan,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import (
            gpu_layout_resolve as layout_resolve,
        )
        from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_sysfs
    except ImportError:  # run as a script (python3 -I too), next to its sibling files
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gpu_layout_plan as layout_plan
        import gpu_layout_resolve as layout_resolve
        import gpu_sysfs

__all__ = [
    "host_summary",
    "predict_inventory",
    "predict_summary",
]


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
            entry["vgpu_type"] = layout_resolve.current_type(gpu)
        if gpu.sriov is not None:
            entry["num_vfs"] = gpu.sriov.num_vfs or 0
            entry["vfs"] = {
                vf.address: layout_resolve.current_type(vf)
                for vf in layout_resolve.vfs_of(functions, gpu)
            }
        if gpu.mdev_types:
            entry["mdevs"] = {m.uuid: m.type_id for m in gpu.mdevs}
        summary[address] = entry
    return summary


def predict_summary(
    summary: Mapping[str, Mapping[str, Any]], plan: layout_plan.Plan
) -> dict[str, Any]:
    """``summary`` as it will read once the executable steps of ``plan`` have run."""
    after: dict[str, dict[str, Any]] = json.loads(json.dumps(summary))
    for step in plan.steps:
        entry = after.setdefault(step.gpu, {})
        if step.action == layout_plan.BIND_VFIO:
            entry["driver"] = layout_plan.VFIO_DRIVER
        elif step.action == layout_plan.BIND_NVIDIA:
            entry["driver"] = layout_plan.NVIDIA_DRIVER
        elif step.action == layout_plan.ENABLE_VFS:
            entry["num_vfs"] = "enabled by sriov-manage"
        elif step.action in (layout_plan.SET_VGPU_TYPE, layout_plan.CLEAR_VGPU_TYPE):
            if step.target == step.gpu or step.gpu not in after:
                entry["vgpu_type"] = step.type_id
            else:
                entry.setdefault("vfs", {})[step.target] = step.type_id
            if step.target in after:
                after[step.target]["vgpu_type"] = step.type_id
        elif step.action == layout_plan.CREATE_MDEV and step.mdev_uuid:
            entry.setdefault("mdevs", {})[step.mdev_uuid] = step.mdev_type
        elif step.action == layout_plan.REMOVE_MDEV and step.mdev_uuid:
            entry.setdefault("mdevs", {}).pop(step.mdev_uuid, None)
        elif step.action == layout_plan.PENDING:
            entry["pending"] = step.reason
    return after


def _passthrough_resource(function: gpu_sysfs.GpuFunction) -> str | None:
    """What the device plugin would advertise ``function`` as on vfio-pci (see gpu_sysfs)."""
    if function.device_id is None:
        return None
    listed = function.model if function.model != function.device_id else None
    name = gpu_sysfs.passthrough_name(listed) if listed else ""
    return gpu_sysfs.resource_name(name or function.device_id)


def predict_inventory(
    inventory: gpu_sysfs.Inventory, plan: layout_plan.Plan
) -> tuple[gpu_sysfs.Inventory, list[str]]:
    """``inventory`` as it will read once ``plan`` has run, and the GPUs it cannot foresee.

    Drivers, vGPU types (named from the steps' profiles), mdevs and the resource names the
    device plugin derives from them follow the executable steps. A GPU with a ``pending``
    step (VFs still to enable, a card to refill once replaced) is listed as unforeseen: how
    many vGPUs it ends with depends on what the card offers then.
    """
    after = copy.deepcopy(inventory)
    functions = after.by_address()
    unsure: list[str] = []
    for step in plan.steps:
        function = functions.get(step.target)
        if step.action == layout_plan.PENDING:
            if step.gpu not in unsure:
                unsure.append(step.gpu)
            continue
        if function is None:
            continue
        if step.action == layout_plan.BIND_VFIO:
            function.driver = layout_plan.VFIO_DRIVER
            function.resource_name = _passthrough_resource(function)
        elif step.action == layout_plan.BIND_NVIDIA:
            function.driver = layout_plan.NVIDIA_DRIVER
            function.resource_name = None
        elif step.action in (layout_plan.SET_VGPU_TYPE, layout_plan.CLEAR_VGPU_TYPE):
            if function.vgpu is None:
                function.vgpu = gpu_sysfs.VendorVgpu()
            function.vgpu.current_type_id = step.type_id or 0
            name = step.profile if step.type_id else None
            function.vgpu_type_name = name
            function.resource_name = (
                gpu_sysfs.resource_name(gpu_sysfs.vgpu_type_name(name)) if name else None
            )
        elif step.action == layout_plan.REMOVE_MDEV:
            function.mdevs = [m for m in function.mdevs if m.uuid != step.mdev_uuid]
            after.mdevs = [m for m in after.mdevs if m.uuid != step.mdev_uuid]
        elif step.action == layout_plan.CREATE_MDEV and step.mdev_uuid:
            name = step.profile or ""
            mdev = gpu_sysfs.MdevDevice(
                uuid=step.mdev_uuid,
                parent=function.address,
                type_id=step.mdev_type,
                type_name=name or None,
                resource_name=(
                    gpu_sysfs.resource_name(gpu_sysfs.vgpu_type_name(name)) if name else None
                ),
            )
            function.mdevs.append(mdev)
            after.mdevs.append(mdev)
        if (
            step.action in (layout_plan.REMOVE_MDEV, layout_plan.CREATE_MDEV)
            and function.driver != layout_plan.VFIO_DRIVER
        ):
            served = {m.resource_name for m in function.mdevs if m.resource_name}
            function.resource_name = served.pop() if len(served) == 1 else None
    return after, unsure
