"""resource.k8s.io/v1 objects as NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes them for
VFIO passthrough, and the GPUClaims and ResourceClaims around them.

With its PassthroughSupport feature the driver offers each GPU twice in the node's pool:
as ``gpu-N`` (``type: gpu``, for containers) and as ``gpu-vfio-N`` (``type: vfio``, bound
to vfio-pci at prepare time), and withdraws the sibling once one of them is prepared. The
DeviceClass ``vfio.gpu.nvidia.com`` selects the second kind. Attribute names are bare (the
driver's domain ``gpu.nvidia.com``) except Kubernetes' standard PCI attributes.
"""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys

DRIVER = "gpu.nvidia.com"
VFIO_CLASS = "vfio.gpu.nvidia.com"
H100 = "GH100 [H100 SXM5 80GB]"
L40S = "AD102GL [L40S]"

VFIO_DEVICE_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": VFIO_CLASS},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": "device.driver == 'gpu.nvidia.com' && "
                    "device.attributes['gpu.nvidia.com'].type == 'vfio'"
                }
            }
        ]
    },
}


def pci_address(index: int) -> str:
    return f"0000:{0x17 + 0x10 * index:02x}:00.0"


def vfio_device(index: int, product: str = H100, **extra: Any) -> dict[str, Any]:
    """``gpu-vfio-<index>``: what the driver publishes for a GPU it can bind to vfio-pci.
    ``addressableMemory`` is the sum of the function's 64-bit BARs, not the GPU's memory."""
    return {
        "name": f"gpu-vfio-{index}",
        "attributes": {
            "type": {"string": "vfio"},
            "uuid": {"string": f"5b0c3d1e-0000-5000-8000-{index:012d}"},
            "deviceID": {"string": "0x2330" if product == H100 else "0x26b9"},
            "vendorID": {"string": "0x10de"},
            "numa": {"int": index // 4},
            "productName": {"string": product},
            "iommuFDEnabled": {"bool": False},
            "resource.kubernetes.io/pciBusID": {"string": pci_address(index)},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x15 + 0x10 * index:02x}"},
        },
        "capacity": {"addressableMemory": {"value": "128Gi" if product == H100 else "64Gi"}},
        **extra,
    }


def gpu_device(index: int, product: str = H100) -> dict[str, Any]:
    """``gpu-<index>``: the same GPU offered to containers (the vfio device's sibling)."""
    return {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-7f3a1c52-{index:04d}-4b1e-9a3e-0123456789ab"},
            "productName": {
                "string": "NVIDIA H100 80GB HBM3" if product == H100 else "NVIDIA L40S"
            },
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "580.65.6"},
            "cudaDriverVersion": {"version": "13.0.0"},
            "resource.kubernetes.io/pciBusID": {"string": pci_address(index)},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }


def resource_slice(
    node: str,
    devices: list[dict[str, Any]],
    generation: int = 1,
    count: int = 1,
    driver: str = DRIVER,
    pool: str | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """One of the pool's ``count`` slices; NVIDIA's driver names the pool after the node."""
    pool = pool or node
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{driver}-{generation}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def passthrough_node(node: str, gpus: int, product: str = H100, generation: int = 1) -> list[Any]:
    """A node's slice with both forms of each of its GPUs, as PassthroughSupport offers."""
    devices = [d for i in range(gpus) for d in (gpu_device(i, product), vfio_device(i, product))]
    return [resource_slice(node, devices, generation)]


def allocated(
    name: str, node: str, devices: list[str], namespace: str = "tenant", **result: Any
) -> dict[str, Any]:
    """A ResourceClaim kube-scheduler allocated ``devices`` of ``node``'s pool to."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": f"rc-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpu", "driver": DRIVER, "pool": node, "device": d, **result}
                        for d in devices
                    ]
                }
            }
        },
    }


def gpu_claim(
    name: str, count: int = 1, namespace: str = "tenant", gpu_class: str = "h100"
) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"class": gpu_class, "count": count},
    }


def dra_class(name: str = "h100", selectors: list[Any] | None = None) -> dict[str, Any]:
    dra: dict[str, Any] = {"deviceClassName": VFIO_CLASS}
    if selectors is not None:
        dra["selectors"] = selectors
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLASS,
        "metadata": {"name": name},
        "spec": {"mode": "passthrough", "model": "H100", "source": {"dra": dra}},
    }
