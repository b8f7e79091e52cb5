"""The VMI webhook, called by the real kube-apiserver over HTTPS: a start adds one gpus
entry per unit and writes nothing (the binder attaches the claims once the VMI is stored;
here the test holds the binder's Lease, so none does); every refusal carries its message; a
reinvocation changes nothing. The stored VMIs pass KubeVirt's real CRD
schema, including VMIs written after KubeVirt's own documentation.

The VMIs are created directly, as a tenant may create one without a VirtualMachine and as
virt-controller submits a VM's: the webhook's answer is the same whoever sends it, and
shapes such as a VMI with its own gpus entries or two VMIs racing for one claim are a
tenant's to write. What KubeVirt's VM controller does with a refusal (the VM's Failure
condition, its retries) is test_kubevirt_start.py's."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonpatch
import pytest
from admission_env import (
    Corner,
    Replica,
    bind,
    create_vmi,
    refusal,
    serving,
    vmi_body,
)
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.licensing import rules as licence_rules
from cozystack_gpu.model.budgets import vgpu_not_entitled
from cozystack_gpu.objects.annotation import EXPECTED_FORMAT, TemplateEntry
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

# Names from KubeVirt's user guide (docs/compute/host-devices.md): a passthrough T4 and a
# T4 vGPU profile as the NVIDIA device plugin advertises them.
T4 = "nvidia.com/TU104GL_Tesla_T4"
T4_1Q = "nvidia.com/GRID_T4-1Q"


@pytest.fixture(scope="module")
def replica(
    control_plane: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    # The hoster's extra GPU names: a name no class offers is still no VM's own to use.
    extra = ("--extra-resource-names", T4_1Q)
    with serving(control_plane, kube, tmp_path_factory.mktemp("admission"), args=extra) as running:
        yield running


@pytest.fixture
def corner(kube: Kube, replica: Replica) -> Corner:
    return Corner(kube)


def claim(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return kube.get_claim(namespace, name)


def status(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status") or {}


def refused(kube: Kube, namespace: str, body: dict[str, Any], **kw: Any) -> str:
    with pytest.raises(ApiException) as caught:
        create_vmi(kube, namespace, body, **kw)
    return refusal(caught.value)


def entitle(kube: Kube, namespace: str) -> None:
    kube.core.patch_namespace(
        namespace, {"metadata": {"labels": {keys.LABEL_VGPU_ENTITLEMENT: "true"}}}
    )


def gpus(resource: str, count: int) -> list[dict[str, str]]:
    return [{"name": f"gpu-cozystack-{i}", "deviceName": resource} for i in range(count)]


# --- a start -----------------------------------------------------------------------------


def test_a_start_adds_one_gpus_entry_per_unit_and_writes_nothing(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 4)
    gpu_class = corner.gpu_class("h100")
    before = {
        name: corner.bound(namespace, name, gpu_class, count, node=node)
        for name, count in (("a", 2), ("b", 1))
    }
    request = {
        "claims": ["a", "b"],
        "claimTemplates": [{"name": "extra", "class": gpu_class, "count": 1}],
    }
    created = create_vmi(kube, namespace, vmi_body("vm", request))

    assert created["spec"]["domain"]["devices"]["gpus"] == gpus(corner.resource(), 4)
    for name, was in before.items():
        # The attachment is the binder's to write once it sees the VMI stored (SPEC §7).
        now = claim(kube, namespace, name)
        assert now["metadata"]["resourceVersion"] == was["metadata"]["resourceVersion"]
        assert "attachedTo" not in status(now)
    # The webhook creates no claim: the template's claim is the gate controller's to make.
    assert {c["metadata"]["name"] for c in kube.claims(namespace)} == {"a", "b"}


def test_a_dry_run_answers_with_the_gpus_and_writes_nothing(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 2)
    before = corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    answer = create_vmi(kube, namespace, vmi_body("vm", {"claims": ["a"]}), dry_run="All")
    assert answer["spec"]["domain"]["devices"]["gpus"] == gpus(corner.resource(), 1)
    after = claim(kube, namespace, "a")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert "attachedTo" not in status(after)
    with pytest.raises(ApiException) as missing:
        kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, "vm"
        )
    assert missing.value.status == 404


def test_a_reinvocation_changes_nothing(
    kube: Kube, corner: Corner, namespace: str, replica: Replica
) -> None:
    node = corner.node("n1", 2)
    corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    body = vmi_body("vm", {"claims": ["a"]})
    body["metadata"]["namespace"] = namespace
    request = {
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "resource": {
            "group": "kubevirt.io",
            "version": "v1",
            "resource": "virtualmachineinstances",
        },
        "namespace": namespace,
        "name": "vm",
        "operation": "CREATE",
        "userInfo": {"username": "tenant"},
        "dryRun": False,
    }
    held = claim(kube, namespace, "a")
    first = replica.review("/mutate-vmi", {**request, "object": body})
    assert first["allowed"], first
    ops = json.loads(base64.b64decode(first["patch"]))
    mutated = jsonpatch.apply_patch(body, ops)

    # The API server calls the webhook again after a later webhook changed the VMI.
    second = replica.review("/mutate-vmi", {**request, "object": mutated})
    assert second["allowed"], second
    assert "patch" not in second
    again = claim(kube, namespace, "a")
    assert again["metadata"]["resourceVersion"] == held["metadata"]["resourceVersion"]


def test_a_start_keeps_entries_that_are_not_gpus(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 1)
    corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    spec = {
        "domain": {
            "devices": {"hostDevices": [{"name": "quickaccess1", "deviceName": "intel.com/qat"}]},
            "memory": {"guest": "1Gi"},
        }
    }
    created = create_vmi(kube, namespace, vmi_body("vm", {"claims": ["a"]}, spec=spec))
    devices = created["spec"]["domain"]["devices"]
    assert devices["hostDevices"] == [{"name": "quickaccess1", "deviceName": "intel.com/qat"}]
    assert devices["gpus"] == gpus(corner.resource(), 1)


# --- refusals ----------------------------------------------------------------------------


def test_a_malformed_annotation_is_refused_with_the_expected_format(
    kube: Kube, replica: Replica, namespace: str
) -> None:
    body = vmi_body("vm", annotations={keys.ANNOTATION_CLAIMS: '{"claim": ["a"]}'})
    assert refused(kube, namespace, body) == (
        'admission webhook "vmi.gpu.cozystack.io" denied the request: annotation '
        "gpu.cozystack.io/claims is malformed: unknown member(s) 'claim'; expected JSON like "
        + EXPECTED_FORMAT
    )


def test_the_reference_label_without_the_annotation_is_refused(
    kube: Kube, replica: Replica, namespace: str
) -> None:
    assert refused(kube, namespace, vmi_body("vm")) == (
        'admission webhook "vmi.gpu.cozystack.io" denied the request: VirtualMachineInstance '
        "vm carries the label gpu.cozystack.io/claims=true but no gpu.cozystack.io/claims "
        "annotation naming its GPU claims; add the annotation, or remove the label"
    )


def test_a_missing_claim_is_refused(kube: Kube, replica: Replica, namespace: str) -> None:
    assert refused(kube, namespace, vmi_body("vm", {"claims": ["nope"]})).endswith(
        f"GPUClaim nope named in gpu.cozystack.io/claims does not exist in namespace "
        f"{namespace}; order it first, or remove it from the annotation"
    )


def test_a_claim_attached_to_another_vmi_is_refused(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 1)
    corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    # As the binder leaves it once VMI first is stored.
    kube.custom.patch_namespaced_custom_object_status(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "a",
        {"status": {"phase": "Attached", "attachedTo": "first", "attachedToUID": "uid-first"}},
    )  # fmt: skip
    assert refused(kube, namespace, vmi_body("second", {"claims": ["a"]})).endswith(
        "GPUClaim a is attached to VirtualMachineInstance first; a claim serves one VM at a "
        "time: stop that VM, or order another claim"
    )


def test_a_claim_that_is_not_bound_is_refused(kube: Kube, corner: Corner, namespace: str) -> None:
    node = corner.node("n1", 1)
    corner.order(namespace, "waiting", corner.gpu_class("h100"))
    bind(kube, namespace, "waiting", node, phase="Pending")  # as the binder leaves a wait
    message = refused(kube, namespace, vmi_body("vm", {"claims": ["waiting"]}))
    assert message.startswith(
        'admission webhook "vmi.gpu.cozystack.io" denied the request: GPUClaim waiting is '
        "Pending, not Bound"
    ), message


def test_a_vm_cannot_hold_a_template_claim_by_name(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    """A template claim cut from the VMI it was made for stays Bound with no usage record:
    named in another VM's claims list it would carry its GPUs there unbilled. The tenant
    admin names it. It can leave one over: a VMI it deletes with ``--cascade=orphan`` has
    the garbage collector remove the claim's owner reference, the one change to it the
    protection policy lets pass (row T7); the test writes what the collector would."""
    node = corner.node("n1", 1)
    gpu_class = corner.gpu_class("h100")
    owner = create_vmi(kube, namespace, vmi_body("owner", labelled=False))
    made = gate.template_claim(owner, TemplateEntry("gpu", gpu_class, 1))
    claims = (keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS)
    kube.custom.create_namespaced_custom_object(*claims, made)
    kube.custom.patch_namespaced_custom_object(
        *claims, "owner-gpu", {"metadata": {"ownerReferences": None}}
    )
    bind(kube, namespace, "owner-gpu", node)
    message = refused(tenant_admin, namespace, vmi_body("vm", {"claims": ["owner-gpu"]}))
    assert message.endswith(
        "GPUClaim owner-gpu named in gpu.cozystack.io/claims is a template claim (labelled "
        "gpu.cozystack.io/template-claim), made by the controller for one VMI from its "
        "claimTemplates; a VM cannot hold it by name: list the claim template in "
        "claimTemplates instead, or order a claim of your own"
    ), f"VM vm took template claim owner-gpu: {message!r}"
    assert "attachedTo" not in status(claim(kube, namespace, "owner-gpu"))


def test_claims_on_different_nodes_are_refused(kube: Kube, corner: Corner, namespace: str) -> None:
    first = corner.node("n1", 1)
    second = corner.node("n2", 1)
    gpu_class = corner.gpu_class("h100")
    corner.bound(namespace, "a", gpu_class, node=first)
    corner.bound(namespace, "b", gpu_class, node=second)
    assert refused(kube, namespace, vmi_body("vm", {"claims": ["a", "b"]})).endswith(
        f"the GPUClaims of one VM must be bound to one node, and these are not: a on {first}, "
        f"b on {second}; order claims a VM uses together as one set (a VirtualMachine that "
        "names them keeps them together) or use claimTemplates"
    )
    assert "attachedTo" not in status(claim(kube, namespace, "a"))


def test_two_vgpu_classes_in_one_set_are_refused(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    entitle(kube, namespace)
    first = corner.gpu_class("l40s-24c", corner.resource("L40S_24C"), mode="vgpu")
    second = corner.gpu_class("l40s-48c", corner.resource("L40S_48C"), mode="vgpu")
    request = {
        "claimTemplates": [
            {"name": "x", "class": first, "count": 1},
            {"name": "y", "class": second, "count": 1},
        ]
    }
    assert refused(kube, namespace, vmi_body("vm", request)).endswith(
        f"a VM takes one vGPU class; the set asks for {first}, {second}"
    )


def test_units_above_max_count_are_refused(kube: Kube, corner: Corner, namespace: str) -> None:
    node = corner.node("n1", 4)
    gpu_class = corner.gpu_class("h100", maxCount=2)
    corner.bound(namespace, "a", gpu_class, 2, node=node)
    request = {"claims": ["a"], "claimTemplates": [{"name": "x", "class": gpu_class}]}
    assert refused(kube, namespace, vmi_body("vm", request)).endswith(
        f"class {gpu_class} allows at most 2 units per VM; the set asks for 3"
    )


def test_a_passthrough_class_without_max_count_allows_the_largest_node(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    corner.node("n1", 2)
    corner.node("n2", 3)
    gpu_class = corner.gpu_class("h100")
    request = {"claimTemplates": [{"name": "x", "class": gpu_class, "count": 4}]}
    # The replica's snapshot learns the nodes from its watches.
    wait_for(
        lambda: "allows at most 3 units" in refused(kube, namespace, vmi_body("vm", request)),
        what="the largest node of the class in the replica's snapshot",
    )


def test_a_vgpu_template_needs_the_entitlement(kube: Kube, corner: Corner, namespace: str) -> None:
    gpu_class = corner.gpu_class("l40s-24c", corner.resource("L40S_24C"), mode="vgpu")
    request = {"claimTemplates": [{"name": "x", "class": gpu_class, "count": 1}]}
    assert refused(kube, namespace, vmi_body("vm", request)).endswith(
        vgpu_not_entitled(namespace, gpu_class)
    )


def test_a_template_of_a_missing_class_is_refused(
    kube: Kube, replica: Replica, namespace: str
) -> None:
    request = {"claimTemplates": [{"name": "x", "class": "no-such-class", "count": 1}]}
    assert refused(kube, namespace, vmi_body("vm", request)).endswith(
        "class no-such-class of claim template x does not exist"
    )


# --- real-world VMIs, after KubeVirt's user guide ---------------------------------------


def doc_gpus_spec() -> dict[str, Any]:
    """docs/compute/host-devices.md: a VMI with two GPUs and a QAT host device."""
    return {
        "domain": {
            "devices": {
                "gpus": [
                    {"deviceName": T4, "name": "gpu1"},
                    {"deviceName": T4_1Q, "name": "gpu2"},
                ],
                "hostDevices": [{"deviceName": "intel.com/qat", "name": "quickaccess1"}],
            },
            "memory": {"guest": "1Gi"},
        }
    }


def doc_host_devices_spec(device: str) -> dict[str, Any]:
    """docs/compute/host-devices.md, the PCI passthrough VMI, with a GPU as the device."""
    return {
        "domain": {
            "devices": {
                "disks": [
                    {"disk": {"bus": "virtio"}, "name": "containerdisk"},
                    {"disk": {"bus": "virtio"}, "name": "cloudinitdisk"},
                ],
                "hostDevices": [{"name": "gpu", "deviceName": device}],
            },
            "resources": {"requests": {"memory": "1024M"}},
        },
        "terminationGracePeriodSeconds": 0,
        "volumes": [
            {
                "containerDisk": {"image": "quay.io/containerdisks/fedora:latest"},
                "name": "containerdisk",
            },
            {
                "cloudInitNoCloud": {"userData": "#cloud-config\npassword: fedora\n"},
                "name": "cloudinitdisk",
            },
        ],
    }


@pytest.fixture
def t4_class(corner: Corner) -> str:
    return corner.gpu_class("t4", T4, model="T4")


def test_the_documented_gpus_vmi_with_claims_is_refused_for_its_own_gpus(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    body = vmi_body("vm", {"claims": ["a"]}, spec=doc_gpus_spec())
    assert refused(kube, namespace, body).endswith(
        "VirtualMachineInstance vm holds GPUs through its claims (gpu.cozystack.io/claims) "
        f"and also requests GPU resource names of its own: spec.domain.devices.gpus[0] {T4}; "
        f"spec.domain.devices.gpus[1] {T4_1Q}; a VM with claims gets its GPUs from its "
        "claims only: remove those entries"
    )


def test_the_documented_gpus_vmi_starts_from_claims_instead(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    spec = doc_gpus_spec()
    del spec["domain"]["devices"]["gpus"]
    created = create_vmi(kube, namespace, vmi_body("vm", {"claims": ["a"]}, spec=spec))
    devices = created["spec"]["domain"]["devices"]
    assert devices["gpus"] == gpus(T4, 1)
    assert devices["hostDevices"] == [{"deviceName": "intel.com/qat", "name": "quickaccess1"}]


def test_the_documented_host_devices_vmi_is_refused_for_a_gpu_host_device(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    body = vmi_body("vmi-nvme", {"claims": ["a"]}, spec=doc_host_devices_spec(T4))
    assert f"spec.domain.devices.hostDevices[0] {T4}" in refused(kube, namespace, body)
    # Its NVMe device, as documented, is no GPU: the same VMI with it starts.
    body = vmi_body(
        "vmi-nvme", {"claims": ["a"]}, spec=doc_host_devices_spec("devices.kubevirt.io/nvme")
    )
    created = create_vmi(kube, namespace, body)
    assert created["spec"]["domain"]["devices"]["gpus"] == gpus(T4, 1)


def test_a_vmi_from_an_instance_type_with_gpus_is_refused(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    itype = corner.name("gpu-medium")
    # docs/user_workloads/instancetypes.md: cpu and memory, and the optional gpus.
    kube.custom.create_cluster_custom_object(
        keys.CLUSTER_INSTANCETYPE.group, keys.CLUSTER_INSTANCETYPE.version,
        keys.CLUSTER_INSTANCETYPE.plural,
        {
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineClusterInstancetype",
            "metadata": {"name": itype},
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "128Mi"},
                     "gpus": [{"name": "gpu1", "deviceName": T4}]},
        },
    )  # fmt: skip
    # KubeVirt names the instance type on the VMI it makes from a VM.
    body = vmi_body(
        "vm", {"claims": ["a"]}, annotations={keys.ANNOTATION_CLUSTER_INSTANCETYPE: itype}
    )
    assert refused(kube, namespace, body).endswith(
        f"own: VirtualMachineClusterInstancetype {itype} spec.gpus[0] {T4}; a VM with claims "
        "gets its GPUs from its claims only: remove those entries"
    )


def test_a_vmi_from_an_instance_type_without_gpus_starts(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    kube.custom.create_namespaced_custom_object(
        keys.INSTANCETYPE.group, keys.INSTANCETYPE.version, namespace, keys.INSTANCETYPE.plural,
        {
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineInstancetype",
            "metadata": {"name": "example-instancetype"},
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "128Mi"}},
        },
    )  # fmt: skip
    body = vmi_body(
        "vm",
        {"claims": ["a"]},
        annotations={keys.ANNOTATION_INSTANCETYPE: "example-instancetype"},
    )
    created = create_vmi(kube, namespace, body)
    assert created["spec"]["domain"]["devices"]["gpus"] == gpus(T4, 1)


def test_a_vmi_naming_a_missing_instance_type_is_refused(
    kube: Kube, corner: Corner, namespace: str, t4_class: str
) -> None:
    node = corner.node("n1", 1, T4)
    corner.bound(namespace, "a", t4_class, node=node)
    body = vmi_body("vm", {"claims": ["a"]}, annotations={keys.ANNOTATION_INSTANCETYPE: "nope"})
    assert refused(kube, namespace, body).endswith(
        "VirtualMachineInstancetype nope, named by the VMI's kubevirt.io/instancetype-name "
        "annotation, does not exist, so its GPU entries cannot be checked"
    )


def test_two_vmis_naming_one_claim_are_judged_alike_and_neither_takes_it_at_admission(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    """Admission writes nothing, so it cannot decide a race: both VMIs are admitted and the
    claim is untouched; the binder attaches it to one (test_gate.py's two-VMI test)."""
    node = corner.node("n1", 8)
    gpu_class = corner.gpu_class("h100")
    before = corner.bound(namespace, "c", gpu_class, node=node)
    bodies = [vmi_body(f"vm-{side}", {"claims": ["c"]}) for side in "ab"]
    with ThreadPoolExecutor(2) as pool:
        outcomes = list(pool.map(lambda b: started_or_refused(kube, namespace, b), bodies))
    assert outcomes == [("vm-a", None), ("vm-b", None)]
    after = claim(kube, namespace, "c")
    assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]


def started_or_refused(kube: Kube, namespace: str, body: dict[str, Any]) -> tuple[str, str | None]:
    try:
        create_vmi(kube, namespace, body)
    except ApiException as exc:
        return body["metadata"]["name"], refusal(exc)
    return body["metadata"]["name"], None


def test_a_nic_vf_the_agent_found_to_be_no_gpu_goes_next_to_the_claims(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    """Seed 004's GPUDirect RDMA answer: a ConnectX VF advertised under nvidia.com/ on a GPU
    node is a VM's own to request next to its GPU claims once the node agent reports it as
    another device's name; until then it counts as a GPU name and is refused."""
    nic = f"nvidia.com/MT2910_ConnectX-7_VF_{corner.id}"
    node = corner.node("n1", 1)
    kube.node_status(node, allocatable={corner.resource(): 1, nic: 4})
    gpu_class = corner.gpu_class("h100")
    corner.bound(namespace, "a", gpu_class, node=node)
    nic_entry = {"hostDevices": [{"name": "rdma0", "deviceName": nic}]}
    body = vmi_body("vm", {"claims": ["a"]}, spec={"domain": {"devices": nic_entry}})
    wait_for(
        lambda: f"hostDevices[0] {nic}" in refused(kube, namespace, body),
        30,
        "the NIC name refused while nobody judged it",
    )
    gpunode = kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node
    )
    kube.custom.patch_cluster_custom_object_status(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node,
        {"status": {**gpunode["status"], "otherResourceNames": [nic]}},
    )  # fmt: skip

    def admitted() -> dict[str, Any] | None:
        try:
            return create_vmi(kube, namespace, body)
        except ApiException:
            return None

    created = wait_for(admitted, 30, "the VMI with its NIC VF admitted")
    devices = created["spec"]["domain"]["devices"]
    assert devices["hostDevices"] == nic_entry["hostDevices"]
    assert devices["gpus"] == gpus(corner.resource(), 1)


def test_a_vmi_with_claims_and_a_network_naming_a_gpu_resource_is_refused(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    """KubeVirt adds a launcher pod request for the resource a multus network's
    NetworkAttachmentDefinition names: one naming the class's GPU name would be a GPU
    beyond the claims. One whose definition does not exist (yet) is the gate's to judge.

    The tenant admin may not write such a definition itself (the built-in ``admin`` role
    grants none, nor does the chart): it names one the hoster made, or one it was let to
    write, in its VMI."""
    node = corner.node("n1", 3)
    gpu_class = corner.gpu_class("h100")
    for held in ("a", "b", "c"):
        corner.bound(namespace, held, gpu_class, node=node)
    with pytest.raises(ApiException) as denied:
        tenant_admin.nad(namespace, "own-net", corner.resource())
    assert denied.value.status == 403 and "cannot create resource" in refusal(denied.value), (
        f"RBAC let the tenant admin write a NetworkAttachmentDefinition: {denied.value}"
    )
    kube.nad(namespace, "gpu-net", corner.resource())
    kube.nad(namespace, "plain-net")
    spec = {
        "domain": {
            "devices": {"interfaces": [{"name": "default", "masquerade": {}},
                                       {"name": "n1", "bridge": {}}]},
            "memory": {"guest": "1Gi"},
        },
        "networks": [{"name": "default", "pod": {}},
                     {"name": "n1", "multus": {"networkName": "gpu-net"}}],
    }  # fmt: skip
    message = refused(tenant_admin, namespace, vmi_body("vm", {"claims": ["a"]}, spec=spec))
    assert (
        f"spec.networks[1] uses NetworkAttachmentDefinition {namespace}/gpu-net, whose "
        f"{keys.ANNOTATION_NAD_RESOURCE} is {corner.resource()}"
    ) in message, f"a network adding a GPU beyond the claims was admitted: {message}"
    for held, nad in (("b", "plain-net"), ("c", "absent-net")):
        spec["networks"][1]["multus"]["networkName"] = nad
        create_vmi(tenant_admin, namespace, vmi_body(f"vm-{nad}", {"claims": [held]}, spec=spec))


# --- the vGPU guest licence --------------------------------------------------------------


def licensed_class(kube: Kube, corner: Corner, replica: Replica, base: str = "l40s") -> str:
    """A licensed vGPU class and the hoster's token Secret it names, marked, in the
    replica's (the controller's) namespace."""
    secret = corner.name("nls")
    kube.core.create_namespaced_secret(
        replica.namespace,
        {
            "metadata": {
                "name": secret,
                "labels": {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK},
            },
            "data": {keys.LICENSE_TOKEN_KEY: "dA=="},
        },
    )
    ref = {"name": secret, "key": keys.LICENSE_TOKEN_KEY}
    return corner.gpu_class(base, mode="vgpu", license={"secretRef": ref})


def place_copy(kube: Kube, namespace: str, gpu_class: str, replica: Replica) -> None:
    """The copy as the leader's copier writes it (no leader runs here)."""
    klass = kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
    )
    ref = klass["spec"]["license"]["secretRef"]["name"]
    source = kube.api.sanitize_for_serialization(
        kube.core.read_namespaced_secret(ref, replica.namespace)
    )
    copy = licence_rules.wanted_copy(klass, namespace, source)
    assert isinstance(copy, licence_rules.Copy), copy
    kube.core.create_namespaced_secret(namespace, licence_rules.copy_body(copy))


def licence_volume(gpu_class: str) -> dict[str, Any]:
    return {
        "name": keys.LICENSE_VOLUME_NAME,
        "secret": {"secretName": keys.license_copy_name(gpu_class)},
    }


LICENCE_DISK = {
    "name": keys.LICENSE_VOLUME_NAME,
    "serial": keys.LICENSE_DISK_SERIAL,
    "disk": {"bus": "virtio"},
}


def test_a_licensed_vgpu_start_gets_its_namespace_copy_as_a_disk_with_the_licence_serial(
    kube: Kube, corner: Corner, namespace: str, replica: Replica
) -> None:
    entitle(kube, namespace)
    node = corner.node("n1", 2)
    gpu_class = licensed_class(kube, corner, replica)
    corner.bound(namespace, "a", gpu_class, node=node)
    place_copy(kube, namespace, gpu_class, replica)
    body = vmi_body("vm", {"claims": ["a"]})
    dry = create_vmi(kube, namespace, body, dry_run="All")
    assert dry["spec"]["volumes"] == [licence_volume(gpu_class)]
    assert "attachedTo" not in status(claim(kube, namespace, "a"))
    created = create_vmi(kube, namespace, body)
    assert created["spec"]["volumes"] == [licence_volume(gpu_class)]
    assert created["spec"]["domain"]["devices"]["disks"] == [LICENCE_DISK]


def test_a_licensed_start_reinvoked_adds_no_second_disk(
    kube: Kube, corner: Corner, namespace: str, replica: Replica
) -> None:
    entitle(kube, namespace)
    node = corner.node("n1", 1)
    gpu_class = licensed_class(kube, corner, replica)
    corner.bound(namespace, "a", gpu_class, node=node)
    place_copy(kube, namespace, gpu_class, replica)
    body = vmi_body("vm", {"claims": ["a"]})
    body["metadata"]["namespace"] = namespace
    request = {
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "resource": {
            "group": "kubevirt.io",
            "version": "v1",
            "resource": "virtualmachineinstances",
        },
        "namespace": namespace,
        "name": "vm",
        "operation": "CREATE",
        "userInfo": {"username": "tenant"},
        "dryRun": False,
    }
    first = replica.review("/mutate-vmi", {**request, "object": body})
    assert first["allowed"], first
    mutated = jsonpatch.apply_patch(body, json.loads(base64.b64decode(first["patch"])))
    assert mutated["spec"]["domain"]["devices"]["disks"] == [LICENCE_DISK]
    second = replica.review("/mutate-vmi", {**request, "object": mutated})
    assert second["allowed"], second
    assert "patch" not in second


def test_unlicensed_and_passthrough_starts_get_no_licence_disk(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    entitle(kube, namespace)
    node = corner.node("n1", 2)
    plain = corner.gpu_class("l40s", mode="vgpu")
    corner.bound(namespace, "v", plain, node=node)
    created = create_vmi(kube, namespace, vmi_body("vm-v", {"claims": ["v"]}))
    assert not created["spec"].get("volumes")
    assert not created["spec"]["domain"]["devices"].get("disks")
    other = corner.node("n2", 1, resource=corner.resource("PT"))
    passthrough = corner.gpu_class("h100", resource=corner.resource("PT"))
    corner.bound(namespace, "p", passthrough, node=other)
    created = create_vmi(kube, namespace, vmi_body("vm-p", {"claims": ["p"]}))
    assert not created["spec"].get("volumes")


def test_a_licensed_start_without_its_copy_is_refused_saying_why(
    kube: Kube, corner: Corner, namespace: str, replica: Replica
) -> None:
    entitle(kube, namespace)
    node = corner.node("n1", 2)
    gpu_class = licensed_class(kube, corner, replica)
    corner.bound(namespace, "a", gpu_class, node=node)
    copy = keys.license_copy_name(gpu_class)
    message = refused(kube, namespace, vmi_body("vm", {"claims": ["a"]}))
    assert f"the licence of vGPU class {gpu_class} has not been copied" in message
    assert f"Secret {copy}" in message and "try again" in message
    # Entitlement cleared after the order: the start says the namespace is not entitled.
    kube.core.patch_namespace(
        namespace, {"metadata": {"labels": {keys.LABEL_VGPU_ENTITLEMENT: None}}}
    )
    message = refused(kube, namespace, vmi_body("vm", {"claims": ["a"]}))
    assert f"namespace {namespace} is not entitled to vGPU" in message
    assert "attachedTo" not in status(claim(kube, namespace, "a"))


def test_a_tenant_admins_own_licence_secret_does_not_license_a_start(
    kube: Kube, corner: Corner, namespace: str, replica: Replica, tenant_admin: Kube
) -> None:
    """A tenant admin may write Secrets in its namespace: one of the copy's name, carrying
    the copier's labels and a hash right for its own data, is no licence copy (SPEC §10)."""
    entitle(kube, namespace)
    node = corner.node("n1", 1)
    gpu_class = licensed_class(kube, corner, replica)
    corner.bound(namespace, "a", gpu_class, node=node)
    fake = ((keys.LICENSE_FEATURE_TYPE_KEY, "MQ=="), (keys.LICENSE_TOKEN_KEY, "bWluZQ=="))
    forged = licence_rules.Copy(namespace, keys.license_copy_name(gpu_class), gpu_class, fake)
    tenant_admin.core.create_namespaced_secret(namespace, licence_rules.copy_body(forged))
    message = ""
    try:
        started = create_vmi(tenant_admin, namespace, vmi_body("vm", {"claims": ["a"]}))
    except ApiException as exc:
        assert exc.status == 403, f"the tenant's VMI was not refused by the webhook: {exc}"
        message = refusal(exc)
    else:
        raise AssertionError(
            f"the tenant's own Secret {forged.name} licensed a start: VMI admitted with "
            f"volumes {started['spec'].get('volumes')}"
        )
    assert f"Secret {forged.name} in namespace {namespace} is not the controller's copy" in (
        message
    ), f"a VMI started licensed by the tenant's own Secret: {message}"
    assert "its data is not the hoster's current token" in message
    assert "attachedTo" not in status(claim(kube, namespace, "a"))
    # The same Secret without the copier's labels is refused the same way.
    tenant_admin.core.replace_namespaced_secret(
        forged.name, namespace, {"metadata": {"name": forged.name}, "data": dict(fake)}
    )
    assert "is not the controller's copy" in refused(
        kube, namespace, vmi_body("vm", {"claims": ["a"]})
    )
