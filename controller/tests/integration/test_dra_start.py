"""A VM on a claim of a ``dra`` class, started, stopped and started again by KubeVirt's own
virt-controller with its ``GPUsWithDRA`` gate on, on the real kube-apiserver, kube-scheduler
(DynamicResources) and kube-controller-manager's resourceclaim controller (SPEC §13).

The VMI webhook gives the VMI KubeVirt's DRA form (``resourceClaims`` naming the claim's
ResourceClaim, ``gpus`` entries with ``claimName`` and ``requestName``); virt-controller
renders the launcher pod with that ResourceClaim; the pod webhook gates it, the binder pins
it to the claim's node and kube-scheduler allocates the devices there. Stopped, the VM's
pod goes and the allocation stays (the claim is among its consumers); started again, the
new pod gets the same devices. The test kit publishes the node's ResourceSlice as NVIDIA's
DRA driver does for VFIO passthrough and plays kubelet and virt-handler.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Replica, order
from binder_env import Env
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.dra_objects import (
    VFIO_DEVICE_CLASS,
    gpu_device,
    resource_slice,
    vfio_device,
)
from cozystack_gpu_testkit.kubevirt.install import DRA_GATE, KUBEVIRT_NAME, NAMESPACE
from cozystack_gpu_testkit.objects import unless, wait_for

pytestmark = pytest.mark.apiserver

RESOURCE = "resource.k8s.io"
START_TIMEOUT_S = kubevirt_kit.START_TIMEOUT_S


@pytest.fixture
def dra_vms(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> Iterator[Env]:
    """This test's corner on virt-controller (GPUsWithDRA on, as the kit installs it), and
    its binder reading the DRA objects (dra: true); its DRA objects go after it."""
    custom = client.CustomObjectsApi(vms.kube.api)
    args = ("kubevirt.io", "v1", NAMESPACE, "kubevirts", KUBEVIRT_NAME)
    gates = custom.get_namespaced_custom_object(*args)["spec"]["configuration"]
    assert DRA_GATE in gates["developerConfiguration"]["featureGates"]
    vms.restart_binder(dra="true")
    try:
        yield vms
    finally:
        kubevirt_kit.removes_vms(vms.kube, vms.tenant)
        for plural in ("resourceslices", "deviceclasses"):
            for item in custom.list_cluster_custom_object(RESOURCE, "v1", plural)["items"]:
                name = item["metadata"]["name"]
                if vms.id in name:
                    unless(
                        404,
                        lambda p=plural, n=name: custom.delete_cluster_custom_object(
                            RESOURCE, "v1", p, n
                        ),
                    )


def _devices(rc: dict[str, Any] | None) -> list[str]:
    results = (((rc or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}
    return sorted(r["device"] for r in results.get("results") or [])


def _consumers(rc: dict[str, Any] | None) -> list[str]:
    return sorted(e["resource"] for e in ((rc or {}).get("status") or {}).get("reservedFor") or [])


def test_a_vm_on_a_dra_claim_starts_on_its_node_and_keeps_its_devices_while_stopped(
    kubevirt: kubevirt_kit.VirtController, dra_vms: Env
) -> None:
    env = dra_vms
    kube, custom = env.kube, client.CustomObjectsApi(env.kube.api)
    device_class = copy.deepcopy(VFIO_DEVICE_CLASS)
    device_class["metadata"] = {"name": f"vfio-{env.id}.gpu.nvidia.com"}
    custom.create_cluster_custom_object(RESOURCE, "v1", "deviceclasses", device_class)
    node = env.node("n1", 1)
    kubevirt_kit.as_virt_handler(kube.api, node)
    devices = [d for i in range(4) for d in (gpu_device(i), vfio_device(i))]
    custom.create_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", resource_slice(node, devices, name=f"{node}-slice")
    )
    gpu_class = env.gpu_class(
        "h100", source={"dra": {"deviceClassName": device_class["metadata"]["name"]}}, maxCount=4
    )
    order(kube, env.tenant, "a", gpu_class, 2)
    assert env.wait_phase("a", "Bound", timeout=START_TIMEOUT_S)["status"]["nodeName"] == node
    wait_for(
        lambda: env.kube.resource_claim(env.tenant, "a"),
        START_TIMEOUT_S,
        "ResourceClaim a made at bind",
    )

    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    try:
        vmi = kubevirt_kit.wait_vmi(kube, env.tenant, "vm")
    except AssertionError:
        vm = kubevirt_kit.get_vm(kube, env.tenant, "vm")
        status = vm.get("status")
        raise AssertionError(
            f"VM status: {status}\nvirt-controller:\n{kubevirt.log_tail()}"
        ) from None
    spec = vmi["spec"]
    assert spec["resourceClaims"] == [{"name": "gpu-cozystack-a", "resourceClaimName": "a"}]
    assert spec["domain"]["devices"]["gpus"] == [
        {
            "name": f"{keys.VMI_GPU_NAME_PREFIX}{i}",
            "claimName": "gpu-cozystack-a",
            "requestName": f"gpu-{i}",
        }
        for i in range(2)
    ]
    pod = kubevirt_kit.wait_launcher(kube, env.tenant, vmi, bound=True)
    assert vmi_pods.pinned_node(pod) == node and pod["spec"]["nodeName"] == node
    assert [c.get("resourceClaimName") for c in pod["spec"]["resourceClaims"]] == ["a"]
    reserved = wait_for(
        lambda: (
            (rc := env.kube.resource_claim(env.tenant, "a"))
            and "gpuclaims" in _consumers(rc)
            and rc
        ),
        START_TIMEOUT_S,
        "ResourceClaim a allocated on the claim's node and reserved for the claim",
    )
    first = _devices(reserved)
    assert len(first) == 2 and all(d.startswith("gpu-vfio-") for d in first)
    kubevirt_kit.runs(kube, env.tenant, vmi)
    env.wait_phase("a", "Attached")

    kubevirt_kit.stops(kube, env.tenant, "vm")
    kept = wait_for(
        lambda: (
            (rc := env.kube.resource_claim(env.tenant, "a"))
            and _consumers(rc) == ["gpuclaims"]
            and rc
        ),
        START_TIMEOUT_S,
        "the stopped VM's pod out of the ResourceClaim's consumers, the claim still in",
    )
    assert _devices(kept) == first, "the allocation stays while the VM is stopped"
    assert env.wait_phase("a", "Bound")["status"]["nodeName"] == node

    kubevirt_kit.set_run_strategy(kube, env.tenant, "vm", "Always")
    again = kubevirt_kit.wait_vmi(kube, env.tenant, "vm", after=vmi)
    pod = kubevirt_kit.wait_launcher(kube, env.tenant, again, bound=True)
    assert pod["spec"]["nodeName"] == node
    assert _devices(env.kube.resource_claim(env.tenant, "a")) == first, (
        "started again on the same devices"
    )
