"""Orders of a ``dra`` class are bound by the devices of the nodes' ResourceSlices (SPEC §13),
on a real API server serving resource.k8s.io/v1, by a binder with the dra setting on: a
node gives the class the devices its DeviceClass and selectors match, less those another
ResourceClaim holds; an order that does not fit waits, and is bound once the devices are
let go."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import GRACE_S, Corner, Env
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit.dra_objects import (
    H100,
    L40S,
    VFIO_DEVICE_CLASS,
    allocated,
    gpu_device,
    resource_slice,
    vfio_device,
)
from cozystack_gpu_testkit.objects import Kube, binder_config, unless, wait_for

pytestmark = pytest.mark.apiserver

RESOURCE = "resource.k8s.io"
PRODUCT = "device.attributes['gpu.nvidia.com'].productName == '{}'"


@pytest.fixture
def dra_env(api_client: Any, kube: Kube) -> Iterator[Env]:
    """A corner with a binder of its own that reads the DRA objects (dra: true)."""
    made = Corner.make(kube)
    binder = Binder(
        api_client, binder_config(made.controller_ns, attachment_grace=GRACE_S, dra="true")
    )
    binder.start()
    assert binder.synced.wait(30), "the binder did not finish its first listing"
    env = Env(kube, made.id, made.tenant, made.controller_ns, binder)
    custom = client.CustomObjectsApi(kube.api)
    try:
        yield env
    finally:
        env.binder.stop()
        for plural, label in (("resourceslices", env.id), ("deviceclasses", env.id)):
            for item in custom.list_cluster_custom_object(RESOURCE, "v1", plural)["items"]:
                if label in item["metadata"]["name"]:
                    name = item["metadata"]["name"]
                    unless(
                        404,
                        lambda p=plural, n=name: custom.delete_cluster_custom_object(
                            RESOURCE, "v1", p, n
                        ),
                    )
        env.clean_up()
    assert env.binder.failure is None, f"the binder loop failed: {env.binder.failure}"


def _device_class(env: Env) -> str:
    """This test's copy of NVIDIA's VFIO DeviceClass (DeviceClasses are cluster-wide)."""
    body = copy.deepcopy(VFIO_DEVICE_CLASS)
    name = f"vfio-{env.id}.gpu.nvidia.com"
    body["metadata"] = {"name": name}
    client.CustomObjectsApi(env.kube.api).create_cluster_custom_object(
        RESOURCE, "v1", "deviceclasses", body
    )
    return name


def _gpu_host(env: Env, base: str, products: list[str]) -> str:
    """A Ready node of this corner whose DRA driver publishes ``products``, both forms each."""
    name = env.name(base)
    env.kube.node(name, labels={**env.selector, "kubernetes.io/hostname": name}, allocatable={})
    devices = [d for i, p in enumerate(products) for d in (gpu_device(i, p), vfio_device(i, p))]
    body = resource_slice(name, devices, name=f"{name}-slice")
    client.CustomObjectsApi(env.kube.api).create_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", body
    )
    return name


def _dra_class(env: Env, device_class: str, product: str | None = None) -> str:
    source: dict[str, Any] = {"deviceClassName": device_class}
    if product is not None:
        source["selectors"] = [{"cel": {"expression": PRODUCT.format(product)}}]
    return env.gpu_class("h100", source={"dra": source})


def test_orders_of_a_dra_class_are_bound_where_its_devices_are_until_none_is_left(
    dra_env: Env,
) -> None:
    env = dra_env
    device_class = _device_class(env)
    h100_host = _gpu_host(env, "h100s", [H100, H100])
    _gpu_host(env, "l40s", [L40S, L40S, L40S])
    gpu_class = _dra_class(env, device_class, H100)
    env.kube.claim(env.tenant, "a", gpu_class, 1)
    env.kube.claim(env.tenant, "b", gpu_class, 1)
    for name in ("a", "b"):
        assert env.wait_phase(name, "Bound")["status"]["nodeName"] == h100_host
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    env.wait_phase("c", "Pending")
    assert env.phase("c") == "Pending", "no H100 is left: the L40S host does not serve it"


def test_a_device_another_resource_claim_holds_is_not_ordered_until_it_is_let_go(
    dra_env: Env,
) -> None:
    env = dra_env
    device_class = _device_class(env)
    host = _gpu_host(env, "h100s", [H100, H100])
    gpu_class = _dra_class(env, device_class)
    custom = client.CustomObjectsApi(env.kube.api)
    # Someone else's ResourceClaim, allocated one of the two VFIO devices (as kube-scheduler
    # writes an allocation: the status subresource).
    theirs = allocated("theirs", host, ["gpu-vfio-0"], namespace=env.tenant)
    status = theirs.pop("status")
    theirs["spec"]["devices"]["requests"][0]["exactly"] = {"deviceClassName": device_class}
    custom.create_namespaced_custom_object(RESOURCE, "v1", env.tenant, "resourceclaims", theirs)
    for result in status["allocation"]["devices"]["results"]:
        result["driver"], result["pool"] = "gpu.nvidia.com", host
    status["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [host]}]}
        ]
    }
    custom.patch_namespaced_custom_object_status(
        RESOURCE, "v1", env.tenant, "resourceclaims", "theirs", {"status": status}
    )
    env.kube.claim(env.tenant, "a", gpu_class, 1)
    env.wait_phase("a", "Bound")
    env.kube.claim(env.tenant, "b", gpu_class, 1)
    env.wait_phase("b", "Pending")
    custom.delete_namespaced_custom_object(RESOURCE, "v1", env.tenant, "resourceclaims", "theirs")
    assert env.wait_phase("b", "Bound")["status"]["nodeName"] == host


TAINT = {"key": "test.cozystack.io/dra", "value": "fake-node", "effect": "NoSchedule"}


def _launcher(env: Env, name: str, node: str, claim: str) -> None:
    """A pod pinned to ``node`` that uses claim ``claim``'s ResourceClaim, as the launcher
    pod of its VM does once the gate pins it (it tolerates the test node's taint)."""
    env.kube.core.create_namespaced_pod(
        env.tenant,
        {
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "tolerations": [{**TAINT, "operator": "Equal"}],
                "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
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


def test_a_claims_resource_claim_is_made_at_bind_kept_for_it_once_allocated_and_goes_with_it(
    dra_env: Env,
) -> None:
    """Bound: its ResourceClaim made, owned by it, one request per unit. The VM's first
    start (a pod pinned there) makes kube-scheduler allocate it on the claim's node, and the
    controller reserves it for the claim, so the allocation outlives the pod. Deleting the
    claim takes its entry out and the ResourceClaim goes with it."""
    env = dra_env
    device_class = _device_class(env)
    # A fake node (no kubelet) tainted so no other test's pod lands on it.
    host = env.name("h100s")
    env.kube.node(
        host,
        labels={**env.selector, "kubernetes.io/hostname": host},
        allocatable={},
        taints=[TAINT],
    )
    devices = [d for i in range(2) for d in (gpu_device(i), vfio_device(i))]
    custom = client.CustomObjectsApi(env.kube.api)
    custom.create_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", resource_slice(host, devices, name=f"{host}-slice")
    )
    gpu_class = env.gpu_class(
        "h100",
        source={"dra": {"deviceClassName": device_class}},
        tolerations=[{**TAINT, "operator": "Equal"}],
    )
    claim = env.kube.claim(env.tenant, "c", gpu_class, 2)
    env.wait_phase("c", "Bound")
    made = wait_for(lambda: env.kube.resource_claim(env.tenant, "c"), 15, "ResourceClaim c made")
    owners = [(o["kind"], o["uid"]) for o in made["metadata"]["ownerReferences"]]
    assert owners == [("GPUClaim", claim["metadata"]["uid"])]
    assert [r["name"] for r in made["spec"]["devices"]["requests"]] == ["gpu-0", "gpu-1"]
    _launcher(env, "virt-launcher-vm", host, "c")

    def reserved() -> dict[str, Any] | None:
        rc = env.kube.resource_claim(env.tenant, "c") or {}
        consumers = (rc.get("status") or {}).get("reservedFor") or []
        return rc if any(e.get("resource") == "gpuclaims" for e in consumers) else None

    allocated_rc = wait_for(reserved, 30, "ResourceClaim c allocated and reserved for claim c")
    results = allocated_rc["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == ["gpu-vfio-0", "gpu-vfio-1"]
    env.kube.core.delete_namespaced_pod("virt-launcher-vm", env.tenant, grace_period_seconds=0)
    env.kube.custom.delete_namespaced_custom_object(
        "gpu.cozystack.io", "v1alpha1", env.tenant, "gpuclaims", "c"
    )
    wait_for(
        lambda: env.kube.resource_claim(env.tenant, "c") is None,
        30,
        "ResourceClaim c deleted with claim c",
    )


def test_an_order_of_a_dra_class_beyond_its_devices_is_refused_at_create(
    control_plane: Any, kube: Kube, tmp_path: Any
) -> None:
    """The claim webhook of a replica whose dra setting is auto (the API serves
    resource.k8s.io/v1, so it reads the DRA objects) judges an order of a dra class against
    the devices of the nodes' ResourceSlices, as the binder does."""
    from admission_env import serving

    corner = Corner.make(kube)
    env = Env(kube, corner.id, corner.tenant, corner.controller_ns, None)  # type: ignore[arg-type]
    try:
        with serving(control_plane, kube, tmp_path, only=["gpuclaim.gpu.cozystack.io"]):
            device_class = _device_class(env)
            host = _gpu_host(env, "h100s", [H100, H100])
            source = {"dra": {"deviceClassName": device_class}}
            gpu_class = env.gpu_class("h100", source=source, maxCount=8)

            def refusal_of(count: int) -> str:
                body = {
                    "apiVersion": "gpu.cozystack.io/v1alpha1",
                    "kind": "GPUClaim",
                    "metadata": {"name": f"o{count}"},
                    "spec": {"class": gpu_class, "count": count},
                }
                try:
                    env.kube.custom.create_namespaced_custom_object(
                        "gpu.cozystack.io", "v1alpha1", env.tenant, "gpuclaims", body,
                        dry_run="All",
                    )  # fmt: skip
                except ApiException as exc:
                    return str(exc.body)
                return ""

            said = wait_for(
                lambda: refusal_of(3) or None, 30, "an order of 3 refused by the claim webhook"
            )
            assert f"no node serving class {gpu_class} has 3 free units; the largest has 2" in said
            assert refusal_of(2) == "", f"two fit on {host}"
    finally:
        corner.clean_up()
        custom = client.CustomObjectsApi(kube.api)
        for plural in ("resourceslices", "deviceclasses"):
            for item in custom.list_cluster_custom_object(RESOURCE, "v1", plural)["items"]:
                if corner.id in item["metadata"]["name"]:
                    name = item["metadata"]["name"]
                    unless(
                        404,
                        lambda p=plural, n=name: custom.delete_cluster_custom_object(
                            RESOURCE, "v1", p, n
                        ),
                    )


def _tainted_host(env: Env, base: str, gpus: int) -> str:
    """A fake node (no kubelet), tainted so no other test's pod lands on it, whose DRA
    driver publishes ``gpus`` H100s in both forms."""
    host = env.name(base)
    labels = {**env.selector, "kubernetes.io/hostname": host}
    env.kube.node(host, labels=labels, allocatable={}, taints=[TAINT])
    devices = [d for i in range(gpus) for d in (gpu_device(i), vfio_device(i))]
    client.CustomObjectsApi(env.kube.api).create_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", resource_slice(host, devices, name=f"{host}-slice")
    )
    return host


def _allocated_on(env: Env, name: str, node: str) -> dict[str, Any] | None:
    rc = env.kube.resource_claim(env.tenant, name) or {}
    terms = (((rc.get("status") or {}).get("allocation") or {}).get("nodeSelector") or {}).get(
        "nodeSelectorTerms"
    ) or []
    values = [v for t in terms for f in t.get("matchFields") or [] for v in f.get("values") or []]
    return rc if values == [node] else None


def test_a_claim_whose_node_is_lost_is_bound_again_and_its_devices_follow_it(
    dra_env: Env,
) -> None:
    """The claim's node goes while its VM is stopped: the claim goes Lost and is bound on
    the other node; the allocation left on the lost node is let go (the claim's entry out,
    the ResourceClaim deleted and made again), and the VM's next start allocates on the
    claim's new node."""
    env = dra_env
    device_class = _device_class(env)
    first, second = _tainted_host(env, "a", 2), _tainted_host(env, "b", 2)
    toleration = [{**TAINT, "operator": "Equal"}]
    source = {"dra": {"deviceClassName": device_class}}
    gpu_class = env.gpu_class("h100", source=source, tolerations=toleration)
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    held = env.wait_phase("c", "Bound")["status"]["nodeName"]
    other = second if held == first else first
    _launcher(env, "virt-launcher-vm", held, "c")
    wait_for(lambda: _allocated_on(env, "c", held), 30, f"ResourceClaim c allocated on {held}")
    env.kube.core.delete_namespaced_pod("virt-launcher-vm", env.tenant, grace_period_seconds=0)
    # The node goes, and its driver's slice with it.
    env.kube.core.delete_node(held)
    client.CustomObjectsApi(env.kube.api).delete_cluster_custom_object(
        RESOURCE, "v1", "resourceslices", f"{held}-slice"
    )

    # Bound on the other node: until the binder sees the node gone, the claim still reads
    # Bound on the lost one.
    def rebound() -> dict[str, Any] | None:
        status = env.kube.get_claim(env.tenant, "c").get("status") or {}
        return status if (status.get("phase"), status.get("nodeName")) == ("Bound", other) else None

    wait_for(rebound, 60, f"claim c Bound again on {other}")

    def made_again() -> dict[str, Any] | None:
        rc = env.kube.resource_claim(env.tenant, "c") or {}
        return rc if rc and not (rc.get("status") or {}).get("allocation") else None

    wait_for(made_again, 60, "the allocation on the lost node let go, ResourceClaim c made again")
    _launcher(env, "virt-launcher-vm-2", other, "c")
    wait_for(lambda: _allocated_on(env, "c", other), 30, f"ResourceClaim c allocated on {other}")
