# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The Node labels a GPU host's layout earns: what GPUClass nodeSelectors select on.

One rule, used three ways: ``gpu_facts`` reports them for the ``node_labels`` role to write,
``gpu_node_layout`` reports them after applying a layout, and its cluster-aware check mode
predicts them from the planned host, since a class that selects on a profile label gains or
loses a node with them. Pure: an inventory in, labels out.

* ``model.gpu.cozystack.io/<model>``: the GPUs (physical functions) of each model, the model
  named as the device plugin names passthrough resources (``GH100_H100_SXM5_80GB``);
* ``profile.gpu.cozystack.io/<profile>``: the vGPUs of each profile (a VF with a type, an
  mdev), named as the device plugin names them (``NVIDIA_L40S-24C``);
* ``mode.gpu.cozystack.io/<passthrough|vgpu>``: the GPUs in each mode (a GPU on vfio-pci;
  a GPU carrying vGPUs on its VFs or as mdevs).

Values are counts as strings. Names go through ``keys.node_label_name`` (label-safe, at most
63 characters, ``unknown`` when nothing is left).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gpu_keys
    import gpu_sysfs
else:
    from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_keys, gpu_sysfs

__all__ = ["GPU_LABEL_PREFIXES", "gpu_labels", "is_gpu_label"]

GPU_LABEL_PREFIXES = (
    gpu_keys.NODE_MODEL_LABEL_PREFIX,
    gpu_keys.NODE_PROFILE_LABEL_PREFIX,
    gpu_keys.NODE_MODE_LABEL_PREFIX,
)


def is_gpu_label(key: str) -> bool:
    """A label this rule owns: dropped from a Node when the host no longer earns it."""
    return key.startswith(GPU_LABEL_PREFIXES)


def _model(function: gpu_sysfs.GpuFunction) -> str:
    return gpu_keys.node_label_name(gpu_sysfs.passthrough_name(function.model or "unknown"))


def gpu_labels(inventory: gpu_sysfs.Inventory) -> dict[str, str]:
    """The model, profile and mode labels of the host ``inventory`` describes."""
    gpus = [f for f in inventory.functions if not f.is_vf]
    vgpu_vfs = [f for f in inventory.functions if f.is_vf and f.mode == "vgpu"]
    models = Counter(_model(g) for g in gpus)
    profiles: Counter[str] = Counter()
    for vf in vgpu_vfs:
        if vf.vgpu_type_name or not vf.mdevs:
            profiles[gpu_keys.node_label_name(vf.vgpu_type_name or "unknown")] += 1
        for mdev in vf.mdevs:
            profiles[gpu_keys.node_label_name(mdev.type_name or "unknown")] += 1
    for gpu in gpus:
        for mdev in gpu.mdevs:
            profiles[gpu_keys.node_label_name(mdev.type_name or "unknown")] += 1
    vgpu_gpus = {vf.physfn for vf in vgpu_vfs} | {g.address for g in gpus if g.mode == "vgpu"}
    modes = Counter({"passthrough": sum(1 for g in gpus if g.mode == "passthrough")})
    modes["vgpu"] = len(vgpu_gpus)
    labels: dict[str, str] = {}
    for prefix, counts in (
        (gpu_keys.NODE_MODEL_LABEL_PREFIX, models),
        (gpu_keys.NODE_PROFILE_LABEL_PREFIX, profiles),
        (gpu_keys.NODE_MODE_LABEL_PREFIX, modes),
    ):
        for name, count in sorted(counts.items()):
            if count > 0:
                labels[prefix + name] = str(count)
    return labels
