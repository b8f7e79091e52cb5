"""The fuller control plane: the real kube-scheduler honours pins, gates and capacity; the real
kube-controller-manager collects owned objects, finishes namespace deletions and makes the
service accounts the ServiceAccount admission plugin needs; KubeVirt's real CRDs check VMIs.
No product code runs here: these tests prove the platform the product's tests stand on.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.objects import NOT_READY_TAINT, Kube, wait_for

pytestmark = pytest.mark.apiserver

# The garbage collector and the namespace controller work through queues and discovery; a
# few seconds is usual, this is the bound before a test calls it broken.
CONTROLLER_TIMEOUT_S = 60.0


@pytest.fixture
def kube(full_control_plane: cluster.ControlPlane, api_client: Any) -> Kube:
    return Kube(api_client)


@pytest.fixture
def resource(unique: str) -> str:
    """An extended resource only this test's nodes advertise, so nodes left by other tests
    in the session never fit its pods."""
    return f"test.cozystack.io/gpu-{unique}"


def _nodes(kube: Kube, unique: str, resource: str, *counts: int) -> list[str]:
    names = [f"sched-{unique}-{i}" for i in range(len(counts))]
    for name, count in zip(names, counts, strict=True):
        kube.node(name, allocatable={resource: count})
    return names


def _bound_node(kube: Kube, namespace: str, pod: str) -> str | None:
    node: str | None = kube.core.read_namespaced_pod(pod, namespace).spec.node_name
    return node


# --- kube-scheduler --------------------------------------------------------------------------


def test_a_ready_node_carries_no_not_ready_taint_and_a_not_ready_one_does(
    kube: Kube, unique: str
) -> None:
    own = {"key": "gpu.example/maintenance", "value": "soon", "effect": "NoSchedule"}
    name = f"taint-{unique}"
    kube.node(name, allocatable={}, ready=False, taints=[own])

    def taints() -> list[tuple[str, str]]:
        node = kube.core.read_node(name)
        return sorted((t.key, t.effect) for t in node.spec.taints or [])

    # The admission plugin put it there at creation; nothing lifted it while NotReady.
    assert taints() == [(own["key"], "NoSchedule"), (NOT_READY_TAINT, "NoSchedule")]
    kube.node_status(name, ready=True)
    assert taints() == [(own["key"], "NoSchedule")]
    kube.node_status(name, ready=False)
    assert taints() == [(own["key"], "NoSchedule"), (NOT_READY_TAINT, "NoSchedule")]


def test_a_pinned_ungated_pod_is_bound_to_exactly_its_node(
    kube: Kube, namespace: str, unique: str, resource: str
) -> None:
    nodes = _nodes(kube, unique, resource, 4, 4, 4)
    pinned = nodes[1]
    kube.pod(namespace, "virt-launcher", requests={resource: 1}, pinned_to=pinned)

    assert wait_for(lambda: _bound_node(kube, namespace, "virt-launcher"), what="a binding") == (
        pinned
    )
    scheduled = kube.pod_scheduled(namespace, "virt-launcher")
    assert scheduled is not None and scheduled["status"] == "True"


def test_a_gated_pod_is_never_bound_until_its_gate_is_removed(
    kube: Kube, namespace: str, unique: str, resource: str
) -> None:
    (node,) = _nodes(kube, unique, resource, 2)
    kube.pod(namespace, "gated", requests={resource: 1}, pinned_to=node, gates=["cozystack/x"])
    # A pod created after the gated one is bound: the scheduler has seen both by then.
    kube.pod(namespace, "witness", requests={resource: 1}, pinned_to=node)
    assert wait_for(lambda: _bound_node(kube, namespace, "witness"), what="the witness") == node

    assert _bound_node(kube, namespace, "gated") is None
    held = kube.pod_scheduled(namespace, "gated")
    assert held is not None and (held["status"], held["reason"]) == ("False", "SchedulingGated")

    kube.core.patch_namespaced_pod("gated", namespace, {"spec": {"schedulingGates": None}})
    assert wait_for(lambda: _bound_node(kube, namespace, "gated"), what="the ungated pod") == (node)


def test_a_pinned_pod_that_does_not_fit_is_reported_unschedulable(
    kube: Kube, namespace: str, unique: str, resource: str
) -> None:
    full, _roomy = _nodes(kube, unique, resource, 1, 4)
    kube.pod(namespace, "first", requests={resource: 1}, pinned_to=full)
    assert wait_for(lambda: _bound_node(kube, namespace, "first"), what="the first pod") == full

    kube.pod(namespace, "second", requests={resource: 1}, pinned_to=full)

    def refused() -> dict[str, Any] | None:
        cond = kube.pod_scheduled(namespace, "second")
        return cond if cond and cond["reason"] == "Unschedulable" else None

    cond = wait_for(refused, what="the scheduler to report the pod Unschedulable")
    assert cond["status"] == "False"
    assert f"Insufficient {resource}" in cond["message"], cond["message"]
    # The pin held: the roomy node was not used instead.
    assert _bound_node(kube, namespace, "second") is None


# --- kube-controller-manager -----------------------------------------------------------------


def _gone(read: Any) -> bool:
    try:
        read()
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def test_an_object_owned_by_a_deleted_vmi_is_garbage_collected(kube: Kube, namespace: str) -> None:
    kube.vmi(namespace, "vm", phase="Running")
    vmi = kube.custom.get_namespaced_custom_object(
        keys.KUBEVIRT_GROUP, keys.KUBEVIRT_VERSION, namespace, "virtualmachineinstances", "vm"
    )
    owner = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "name": "vm",
        "uid": vmi["metadata"]["uid"],
    }
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owned", "ownerReferences": [owner]}}
    )
    kube.core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})

    kube.delete_vmi(namespace, "vm")
    wait_for(
        lambda: _gone(lambda: kube.core.read_namespaced_config_map("owned", namespace)),
        timeout=CONTROLLER_TIMEOUT_S,
        what="the garbage collector to delete the VMI's ConfigMap",
    )
    kube.core.read_namespaced_config_map("bystander", namespace)


def test_a_claim_owned_by_a_vmi_that_no_longer_exists_is_garbage_collected(
    kube: Kube, namespace: str, unique: str
) -> None:
    """A custom object owned by a custom object: what template claims of a VMI rely on."""
    gone_uid = str(uuid.uuid4())
    kube.custom.create_namespaced_custom_object(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_CLAIMS,
        {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {
                "name": "template-0",
                "ownerReferences": [
                    {
                        "apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstance",
                        "name": "vm-that-was",
                        "uid": gone_uid,
                    }
                ],
            },
            "spec": {"class": f"class-{unique}", "count": 1},
        },
    )
    wait_for(
        lambda: _gone(
            lambda: kube.custom.get_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "template-0"
            )
        ),
        timeout=CONTROLLER_TIMEOUT_S,
        what="the garbage collector to delete the claim of a VMI that does not exist",
    )


def test_a_deleted_namespace_goes_away_with_its_contents(kube: Kube, unique: str) -> None:
    name = f"doomed-{unique}"
    kube.namespace(name)
    kube.core.create_namespaced_config_map(name, {"metadata": {"name": "cm"}})
    kube.vmi(name, "vm", phase="Running")
    kube.core.delete_namespace(name)
    wait_for(
        lambda: _gone(lambda: kube.core.read_namespace(name)),
        timeout=CONTROLLER_TIMEOUT_S,
        what="the namespace controller to finish the deletion",
    )


def test_pods_are_admitted_by_the_service_account_plugin(kube: Kube, namespace: str) -> None:
    created = kube.pod(namespace, "plain")
    spec = created["spec"]
    assert spec["serviceAccountName"] == "default"
    # The plugin mounts the account's token volume: proof that it ran.
    assert any(v["name"].startswith("kube-api-access-") for v in spec["volumes"]), spec

    body = {
        "metadata": {"name": "stranger"},
        "spec": {
            "serviceAccountName": "nobody",
            "containers": [{"name": "compute", "image": "virt-launcher"}],
        },
    }
    with pytest.raises(ApiException) as refused:
        kube.core.create_namespaced_pod(namespace, body)
    assert refused.value.status == 403
    assert 'serviceaccount "nobody" not found' in json.loads(refused.value.body)["message"]


# --- KubeVirt's real CRDs --------------------------------------------------------------------


def _vmi_body(name: str, devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {"domain": {"devices": devices}},
    }


def _create_vmi(kube: Kube, namespace: str, body: dict[str, Any]) -> Any:
    return kube.custom.create_namespaced_custom_object(
        keys.KUBEVIRT_GROUP, keys.KUBEVIRT_VERSION, namespace, "virtualmachineinstances", body
    )


def test_a_vmi_gpu_entry_without_a_name_is_refused_by_kubevirts_schema(
    kube: Kube, namespace: str
) -> None:
    body = _vmi_body("bad", {"gpus": [{"deviceName": "nvidia.com/GH100_H100_SXM5_80GB"}]})
    with pytest.raises(ApiException) as refused:
        _create_vmi(kube, namespace, body)
    assert refused.value.status == 422
    assert "spec.domain.devices.gpus[0].name: Required value" in str(refused.value.body)


def test_a_vmi_without_devices_is_refused_by_kubevirts_schema(kube: Kube, namespace: str) -> None:
    body = _vmi_body("bad", {})
    del body["spec"]["domain"]["devices"]
    with pytest.raises(ApiException) as refused:
        _create_vmi(kube, namespace, body)
    assert refused.value.status == 422
    assert "spec.domain.devices: Required value" in str(refused.value.body)


def test_a_gpu_entry_without_device_name_passes_the_schema_and_is_left_to_virt_api(
    kube: Kube, namespace: str
) -> None:
    """KubeVirt 1.9's schema requires only ``name`` on a gpus entry (``deviceName`` became
    optional when DRA claims were added); virt-api's webhook, absent here, checks the rest.
    So nothing in this platform refuses such an entry: product webhooks must."""
    body = _vmi_body("dra-style", {"gpus": [{"name": "gpu1"}]})
    created = _create_vmi(kube, namespace, body)
    assert created["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpu1"}]


def test_unknown_vmi_fields_are_pruned_by_kubevirts_schema(kube: Kube, namespace: str) -> None:
    body = _vmi_body("pruned", {"gpus": [{"name": "gpu1", "deviceName": "x/y", "bogus": 1}]})
    created = _create_vmi(kube, namespace, body)
    assert created["spec"]["domain"]["devices"]["gpus"] == [{"name": "gpu1", "deviceName": "x/y"}]


@pytest.mark.parametrize(
    "name",
    [
        "virtualmachineinstances.kubevirt.io",
        "virtualmachines.kubevirt.io",
        "virtualmachineinstancetypes.instancetype.kubevirt.io",
        "virtualmachineclusterinstancetypes.instancetype.kubevirt.io",
    ],
)
def test_the_installed_crds_are_the_ones_virt_operator_generates(
    full_control_plane: cluster.ControlPlane, name: str
) -> None:
    installed = full_control_plane.get_json(
        f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    )
    (generated,) = (
        d for d in cluster.load_manifests(cluster.kubevirt_crds()) if d["metadata"]["name"] == name
    )
    assert installed["metadata"]["labels"] == {"kubevirt.io": ""}
    assert installed["spec"]["versions"] == generated["spec"]["versions"]
