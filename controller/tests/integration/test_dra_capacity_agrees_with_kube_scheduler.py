"""The ``dra`` source's count of free devices (``objects.dra.dra_capacity``) is what
kube-scheduler's DynamicResources plugin can still allocate, on the real scheduler.

SPEC §13 makes the binder count a ``dra`` class's capacity from the ResourceSlices and the
ResourceClaims, and leave every allocation to kube-scheduler: a count above the
scheduler's binds a claim whose VM cannot start; one below refuses orders that fit. Here
the test kit publishes ResourceSlices as NVIDIA's DRA driver does for VFIO passthrough
(``dra_objects``: each GPU as ``gpu-N`` and ``gpu-vfio-N``, the DeviceClass
``vfio.gpu.nvidia.com``), the controller's ResourceClaims (``resource_claim_for``) are
created for GPUClaims, and pods pinned to a node by nodeSelector (as the launcher pod is)
make kube-scheduler allocate them. After each allocation the pure count is taken from the
objects as the API server returns them, and checked against what the scheduler then does
with an order of exactly that many devices (allocated) and of one more (refused).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu.objects import dra
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.dra_objects import (
    H100,
    L40S,
    VFIO_DEVICE_CLASS,
    dra_class,
    gpu_device,
    pci_address,
    resource_slice,
    vfio_device,
)
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for

pytestmark = pytest.mark.apiserver

NAMESPACE = "tenant-dra"
# The class: the driver's VFIO DeviceClass narrowed to H100s by the class's own selector.
SELECTOR = "device.attributes['gpu.nvidia.com'].productName.startsWith('GH100')"
GPU_CLASS = dra_class("h100", [SELECTOR])
SOURCE = dra.dra_source(GPU_CLASS)
RESOURCE = "resource.k8s.io"


@pytest.fixture(scope="module")
def plane() -> Iterator[cluster.ControlPlane]:
    """A plane of this module's own with kube-scheduler: its nodes are fake (no kubelet), so
    no other test's pods must land on them."""
    started = cluster.start(
        bin_dir=cluster.binary_dir(), scheduler=True, crds=sorted(cluster.CRD_DIR.glob("*.yaml"))
    )
    try:
        install_extra_crds(started.api_client())
        yield started
    finally:
        started.stop()


def _tenant(kube: Kube) -> None:
    """The tenant namespace and its default ServiceAccount (no controller makes one here)."""
    for make in (
        lambda: kube.namespace(NAMESPACE),
        lambda: kube.core.create_namespaced_service_account(
            NAMESPACE, {"metadata": {"name": "default"}}
        ),
    ):
        try:
            make()
        except ApiException as exc:
            if exc.status != 409:
                raise


def _node(kube: Kube, name: str, gpus: list[str]) -> None:
    """A Ready node whose driver publishes ``gpus`` (products), each in both forms."""
    kube.node(name, labels={"kubernetes.io/hostname": name}, allocatable={})
    devices = [
        d
        for i, product in enumerate(gpus)
        for d in (gpu_device(i, product), vfio_device(i, product))
    ]
    client.CustomObjectsApi(kube.api).create_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", resource_slice(name, devices)
    )


def _order(kube: Kube, name: str, count: int, node: str) -> None:
    """A GPUClaim, the ResourceClaim the controller makes for it, and a pod pinned to
    ``node`` using it, as the launcher pod is: kube-scheduler allocates it there or not."""
    claim = kube.claim(NAMESPACE, name, "h100", count)
    assert SOURCE is not None
    body = dra.resource_claim_for(claim, SOURCE)
    custom = client.CustomObjectsApi(kube.api)
    custom.create_namespaced_custom_object(RESOURCE, "v1", NAMESPACE, "resourceclaims", body)
    kube.core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                "containers": [
                    {
                        "name": "compute",
                        "image": "pause",
                        "resources": {"claims": [{"name": "gpus"}]},
                    }
                ],
            },
        },
    )


def _bound(kube: Kube, name: str) -> bool:
    return bool(kube.core.read_namespaced_pod(name, NAMESPACE).spec.node_name)


def _refused(kube: Kube, name: str) -> str:
    """kube-scheduler's word on pod ``name`` once it could not place it, "" before."""
    pod = kube.core.read_namespaced_pod(name, NAMESPACE)
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
            return str(condition.message)
    return ""


def _free(kube: Kube) -> dra.DraCapacity:
    """The pure count from the objects the API server holds now."""
    custom = client.CustomObjectsApi(kube.api)
    slices = custom.list_cluster_custom_object(RESOURCE, "v1", "resourceslices")["items"]
    claims = custom.list_cluster_custom_object(RESOURCE, "v1", "resourceclaims")["items"]
    matcher = dra.compile_matcher(VFIO_DEVICE_CLASS, SOURCE.selectors if SOURCE else ())
    return dra.dra_capacity(slices, claims, matcher, {})


def _free_on(kube: Kube, node: str, expected: int) -> bool:
    return _free(kube).of(node) == expected


def _allocated(kube: Kube, name: str) -> list[dict[str, Any]]:
    rc = client.CustomObjectsApi(kube.api).get_namespaced_custom_object(
        RESOURCE, "v1", NAMESPACE, "resourceclaims", name
    )
    return list(
        (((rc.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        or []
    )


def test_the_free_count_of_a_dra_class_is_what_kube_scheduler_allocates(
    plane: cluster.ControlPlane,
) -> None:
    kube = Kube(plane.api_client())
    _tenant(kube)
    client.CustomObjectsApi(kube.api).create_cluster_custom_object(
        RESOURCE, "v1", "deviceclasses", VFIO_DEVICE_CLASS
    )
    # Four H100s on one node; two H100s and two L40S (which the class's selector leaves
    # out) on the other.
    _node(kube, "dra-a", [H100] * 4)
    _node(kube, "dra-b", [H100, L40S, H100, L40S])
    wait_for(lambda: _free(kube).free == {"dra-a": 4, "dra-b": 2}, 30, "the slices counted")
    assert _free(kube).matching == {"dra-a": 4, "dra-b": 2}

    orders = (("dra-a", 1), ("dra-a", 2), ("dra-b", 2), ("dra-a", 1))
    for step, (node, count) in enumerate(orders):
        before = _free(kube).of(node)
        # One device more than the count says is free: kube-scheduler cannot allocate it.
        over = f"over-{step}"
        _order(kube, over, before + 1, node)
        message = wait_for(functools.partial(_refused, kube, over), 60, f"{over} refused")
        assert not _bound(kube, over), message
        kube.core.delete_namespaced_pod(over, NAMESPACE, grace_period_seconds=0)
        # The order that fits (count ≤ free) is allocated on that node, and the count goes
        # down by exactly its devices, all of them VFIO H100s of that node's pool.
        name = f"fits-{step}"
        _order(kube, name, count, node)
        wait_for(functools.partial(_bound, kube, name), 60, f"{name} allocated on {node}")
        results = _allocated(kube, name)
        assert len(results) == count and {r["pool"] for r in results} == {node}
        assert all(r["device"].startswith("gpu-vfio-") for r in results), results
        wait_for(
            functools.partial(_free_on, kube, node, before - count),
            30,
            f"{node}'s count down by {count}",
        )
    assert _free(kube).free == {"dra-a": 0, "dra-b": 0}


def test_a_gpu_allocated_in_its_container_form_is_not_counted_free_for_passthrough(
    plane: cluster.ControlPlane,
) -> None:
    """NVIDIA's driver offers each GPU twice (``gpu-N`` and ``gpu-vfio-N``) and withdraws the
    sibling only when one is prepared. kube-scheduler sees two devices and would allocate
    the sibling too (the node's prepare then fails); the count takes the PCI function as
    one device, so it never counts a GPU a container already holds."""
    kube = Kube(plane.api_client())
    _tenant(kube)
    _node(kube, "dra-c", [H100, H100])
    container_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [
                {"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                       "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
            ]
        },
    }  # fmt: skip
    custom = client.CustomObjectsApi(kube.api)
    pci_bus_id = "device.attributes['resource.kubernetes.io'].pciBusID"
    first_gpu = f"{pci_bus_id} == '{pci_address(0)}'"
    try:
        custom.create_cluster_custom_object(RESOURCE, "v1", "deviceclasses", container_class)
    except ApiException as exc:
        if exc.status != 409:
            raise
    wait_for(lambda: _free(kube).of("dra-c") == 2, 30, "dra-c counted")
    # A tenant's container pod takes gpu-0 through the container class.
    custom.create_namespaced_custom_object(
        RESOURCE, "v1", NAMESPACE, "resourceclaims",
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "cuda"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
                "selectors": [{"cel": {"expression": first_gpu}}],
            }}]}},
        },
    )  # fmt: skip
    kube.core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "cuda"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": "dra-c"},
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "cuda"}],
                "containers": [
                    {"name": "c", "image": "pause", "resources": {"claims": [{"name": "gpu"}]}}
                ],
            },
        },
    )
    wait_for(lambda: _bound(kube, "cuda"), 60, "the container pod allocated gpu-0")
    assert [r["device"] for r in _allocated(kube, "cuda")] == ["gpu-0"]
    # The count: one H100 free for passthrough (gpu-vfio-1), not two.
    wait_for(lambda: _free(kube).of("dra-c") == 1, 30, "gpu-0's function taken")
    assert _free(kube).matching["dra-c"] == 2
