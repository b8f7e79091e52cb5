"""The VMI webhook's rules: each refusal with its message, and what an accepted start writes."""

from __future__ import annotations

from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.admission.vmi_rules import (
    InstanceType,
    Refusal,
    Start,
    VMIFacts,
    gpus_with,
    judge,
    own_gpu_entries,
    set_gpus,
)
from cozystack_gpu.licensing import rules as licence_rules
from cozystack_gpu.model.budgets import vgpu_not_entitled
from cozystack_gpu.objects.annotation import ClaimsRequest, TemplateEntry

H100 = "nvidia.com/GH100_H100"
L40S_24C = "nvidia.com/NVIDIA_L40S-24C"
L40S_48C = "nvidia.com/NVIDIA_L40S-48C"


def vmi(name: str = "vm", spec: dict[str, Any] | None = None, **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "tenant-a", "annotations": annotations},
        "spec": spec or {"domain": {"devices": {}}},
    }


def claim(
    name: str,
    gpu_class: str = "h100",
    count: int = 1,
    *,
    phase: str | None = "Bound",
    node: str | None = "node-1",
    attached_to: str | None = None,
    deleting: bool = False,
    conditions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if node:
        status["nodeName"] = node
    if attached_to:
        status["attachedTo"] = attached_to
    if conditions:
        status["conditions"] = conditions
    metadata: dict[str, Any] = {"name": name, "namespace": "tenant-a", "resourceVersion": "5"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    return {"metadata": metadata, "spec": {"class": gpu_class, "count": count}, "status": status}


def gpu_class(
    name: str,
    res: str = H100,
    mode: str = "passthrough",
    max_count: int | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"mode": mode, "source": {"devicePlugin": {"resourceName": res}}}
    if max_count is not None:
        spec["maxCount"] = max_count
    metadata: dict[str, Any] = {"name": name}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-30T10:00:00Z"
    return {"metadata": metadata, "spec": spec}


CLASSES = {
    "h100": gpu_class("h100"),
    "l40s-24c": gpu_class("l40s-24c", L40S_24C, "vgpu"),
    "l40s-48c": gpu_class("l40s-48c", L40S_48C, "vgpu"),
    "h100-2": gpu_class("h100-2", H100, max_count=2),
}
ENTITLED = {keys.LABEL_VGPU_ENTITLEMENT: "true"}


def facts(*claims: dict[str, Any], **overrides: Any) -> VMIFacts:
    values: dict[str, Any] = {
        "claims": {c["metadata"]["name"]: c for c in claims},
        "classes": CLASSES,
        "namespace_labels": ENTITLED,
        "largest_node": lambda _name: 8,
    }
    values.update(overrides)
    return VMIFacts(**values)


def refusal(result: Refusal | Start) -> str:
    assert isinstance(result, Refusal), result
    return result.message


def test_held_and_template_units_each_get_one_gpus_entry_in_annotation_order() -> None:
    request = ClaimsRequest(("b", "a"), (TemplateEntry("extra", "h100", 2),))
    result = judge(vmi(), request, facts(claim("a"), claim("b", count=2)))
    assert result == Start(
        gpus=tuple({"name": f"gpu-cozystack-{i}", "deviceName": H100} for i in range(5)),
    )


def test_a_claim_still_attached_to_an_earlier_vmi_of_the_name_is_no_refusal() -> None:
    """The VM's previous VMI ended (no VMI of the name is stored): its attachment on the
    claim is the binder's to replace once the new VMI is stored, not a reason to refuse."""
    earlier = claim("b", phase="Attached", attached_to="vm")
    earlier["status"].update(attachedToUID="uid-0")
    result = judge(vmi("vm"), ClaimsRequest(("a", "b")), facts(claim("a"), earlier))
    assert isinstance(result, Start)
    assert len(result.gpus) == 2


def test_a_missing_claim_is_refused_with_where_it_was_looked_for() -> None:
    result = judge(vmi(), ClaimsRequest(("gone",)), facts(claims={"gone": None}))
    assert refusal(result) == (
        "GPUClaim gone named in gpu.cozystack.io/claims does not exist in namespace "
        "tenant-a; order it first, or remove it from the annotation"
    )


@pytest.mark.parametrize(
    ("phase", "words"),
    [
        ("Booked", "made when its window opens at 2027-01-04T09:00:00Z (it ends at "
         "2027-01-04T18:00:00Z); start the VM then"),
        ("Ended", "whose window ended at 2027-01-04T18:00:00Z; book another window"),
        ("Pending", "which is Pending, not booked: no node has 8 free"),
    ],
)  # fmt: skip
def test_a_window_claim_named_before_its_start_is_refused_with_when_it_opens(
    phase: str, words: str
) -> None:
    """SPEC §11: before ``start`` the VMI webhook refuses the window's claim with the
    window's start (the claim does not exist yet; its reservation does)."""
    booked = {
        "metadata": {"name": "train", "namespace": "tenant-a"},
        "spec": {"start": "2027-01-04T09:00:00Z", "end": "2027-01-04T18:00:00Z"},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Booked", "status": "False", "message": "no node has 8 free"}],
        },
    }
    result = judge(
        vmi(),
        ClaimsRequest(("train",)),
        facts(claims={"train": None}, reservations={"train": booked}),
    )
    assert isinstance(result, Refusal) and result.reason is keys.AdmissionReason.WINDOW_NOT_OPEN
    assert result.message.startswith(
        "GPUClaim train named in gpu.cozystack.io/claims is GPUReservation train's"
    )
    assert words in result.message


def test_a_claim_attached_to_another_vmi_is_refused() -> None:
    result = judge(vmi("vm"), ClaimsRequest(("a",)), facts(claim("a", attached_to="other")))
    assert refusal(result) == (
        "GPUClaim a is attached to VirtualMachineInstance other; a claim serves one VM at a "
        "time: stop that VM, or order another claim"
    )


@pytest.mark.parametrize("phase", ["Pending", "Lost", None])
def test_a_claim_that_is_not_bound_is_refused_with_why_it_waits(phase: str | None) -> None:
    waits = [{"type": "Bound", "status": "False", "message": "no node serves class h100"}]
    result = judge(
        vmi(), ClaimsRequest(("a",)), facts(claim("a", phase=phase, node=None, conditions=waits))
    )
    assert refusal(result) == (
        f"GPUClaim a is {phase or 'Pending'}, not Bound: no node serves class h100"
    )


def test_a_claim_attached_to_another_vmi_is_refused_even_when_attached() -> None:
    result = judge(
        vmi("vm"), ClaimsRequest(("a",)), facts(claim("a", phase="Attached", attached_to="x"))
    )
    assert "attached to VirtualMachineInstance x" in refusal(result)


def test_a_claim_being_deleted_is_refused() -> None:
    result = judge(vmi(), ClaimsRequest(("a",)), facts(claim("a", deleting=True)))
    assert refusal(result) == (
        "GPUClaim a is being deleted; remove it from the VM's gpu.cozystack.io/claims "
        "annotation, or order another claim"
    )


def test_claims_on_different_nodes_are_refused_naming_each_node() -> None:
    result = judge(vmi(), ClaimsRequest(("a", "b")), facts(claim("a"), claim("b", node="node-2")))
    assert refusal(result) == (
        "the GPUClaims of one VM must be bound to one node, and these are not: a on node-1, "
        "b on node-2; order claims a VM uses together as one set (a VirtualMachine that "
        "names them keeps them together) or use claimTemplates"
    )


def test_a_template_of_a_missing_class_is_refused() -> None:
    request = ClaimsRequest((), (TemplateEntry("x", "a100", 1),))
    assert refusal(judge(vmi(), request, facts())) == (
        "class a100 of claim template x does not exist"
    )


def test_a_template_of_a_class_being_deleted_is_refused() -> None:
    classes = {**CLASSES, "old": gpu_class("old", deleting=True)}
    request = ClaimsRequest((), (TemplateEntry("x", "old", 1),))
    assert refusal(judge(vmi(), request, facts(classes=classes))) == (
        "class old is being deleted and takes no new orders (claim template x)"
    )


def test_two_vgpu_classes_in_one_set_are_refused() -> None:
    request = ClaimsRequest(("a",), (TemplateEntry("x", "l40s-48c", 1),))
    result = judge(vmi(), request, facts(claim("a", "l40s-24c")))
    assert refusal(result) == "a VM takes one vGPU class; the set asks for l40s-24c, l40s-48c"


def test_held_and_template_units_above_max_count_are_refused() -> None:
    request = ClaimsRequest(("a",), (TemplateEntry("x", "h100-2", 2),))
    result = judge(vmi(), request, facts(claim("a", "h100-2")))
    assert refusal(result) == "class h100-2 allows at most 2 units per VM; the set asks for 3"


def test_a_vgpu_class_without_max_count_allows_one_unit() -> None:
    request = ClaimsRequest((), (TemplateEntry("x", "l40s-24c", 2),))
    assert refusal(judge(vmi(), request, facts())) == (
        "class l40s-24c allows at most 1 unit per VM; the set asks for 2"
    )


def test_a_passthrough_class_without_max_count_allows_the_largest_node() -> None:
    request = ClaimsRequest((), (TemplateEntry("x", "h100", 5),))
    result = judge(vmi(), request, facts(largest_node=lambda _name: 4))
    assert refusal(result) == "class h100 allows at most 4 units per VM; the set asks for 5"
    # Unknown (a replica that has not read the cluster yet): the controller judges it later.
    assert isinstance(judge(vmi(), request, facts(largest_node=lambda _name: None)), Start)


def test_a_vgpu_template_needs_the_namespace_entitlement() -> None:
    request = ClaimsRequest((), (TemplateEntry("x", "l40s-24c", 1),))
    # The same words as the model's, which judge an order of the class outside a VMI.
    assert refusal(judge(vmi(), request, facts(namespace_labels={}))) == vgpu_not_entitled(
        "tenant-a", "l40s-24c"
    )


def test_a_vmi_with_claims_and_gpu_entries_of_its_own_is_refused_naming_each() -> None:
    spec = {
        "domain": {
            "devices": {
                "gpus": [
                    {"name": "mine", "deviceName": H100},
                    {"name": "gpu-cozystack-0", "deviceName": H100},  # ours, from before
                    {"name": "other", "deviceName": "example.com/not-a-gpu"},
                ],
                "hostDevices": [{"name": "hd", "deviceName": "nvidia.com/GA100_AUDIO"}],
            },
            "resources": {"requests": {L40S_24C: "1"}, "limits": {L40S_24C: "1"}},
        }
    }
    itype = InstanceType("VirtualMachineClusterInstancetype", "gpu-large", {"gpus": [
        {"name": "g", "deviceName": L40S_48C}
    ]})  # fmt: skip
    result = judge(
        vmi("vm", spec),
        ClaimsRequest(("a",)),
        facts(
            claim("a"),
            settings_names=frozenset({"nvidia.com/GA100_AUDIO"}),
            instancetype=itype,
        ),
    )
    assert refusal(result) == (
        "VirtualMachineInstance vm holds GPUs through its claims (gpu.cozystack.io/claims) "
        "and also requests GPU resource names of its own: spec.domain.devices.gpus[0] "
        f"{H100}; spec.domain.devices.hostDevices[0] nvidia.com/GA100_AUDIO; "
        f"spec.domain.resources.requests {L40S_24C}; spec.domain.resources.limits {L40S_24C}; "
        f"VirtualMachineClusterInstancetype gpu-large spec.gpus[0] {L40S_48C}; a VM with "
        "claims gets its GPUs from its claims only: remove those entries"
    )


def _networked(*names: str) -> dict[str, Any]:
    networks = [{"name": "default", "pod": {}}] + [
        {"name": f"net{i}", "multus": {"networkName": n}} for i, n in enumerate(names)
    ]
    return {"domain": {"devices": {}}, "networks": networks}


def test_a_vmi_with_claims_and_a_network_naming_a_gpu_resource_is_refused() -> None:
    """KubeVirt adds to the launcher pod a request for the resource a network's
    NetworkAttachmentDefinition names: one naming a GPU name is a GPU beyond the claims."""
    result = judge(
        vmi("vm", _networked("gpu-net", "infra/sriov")),
        ClaimsRequest(("a",)),
        facts(
            claim("a"),
            network_resources={
                ("tenant-a", "gpu-net"): H100,
                ("infra", "sriov"): "nvidia.com/MT2910_CONNECTX7_VF",
            },
        ),
    )
    assert isinstance(result, Refusal)
    assert result.reason == keys.AdmissionReason.NETWORK_GPU_RESOURCE
    assert (
        "spec.networks[1] uses NetworkAttachmentDefinition tenant-a/gpu-net, whose "
        f"k8s.v1.cni.cncf.io/resourceName is {H100}" in result.message
    )
    assert "infra/sriov" not in result.message, "a NIC's resource name is not a GPU name"


def test_a_network_whose_definition_cannot_be_read_is_left_to_the_gate() -> None:
    result = judge(
        vmi("vm", _networked("gpu-net")),
        ClaimsRequest(("a",)),
        facts(claim("a"), network_resources={("tenant-a", "gpu-net"): None}),
    )
    assert isinstance(result, Start)


def test_entries_of_names_no_class_or_setting_knows_are_not_gpu_entries() -> None:
    spec = {"domain": {"devices": {"gpus": [{"name": "x", "deviceName": "example.com/fpga"}]}}}
    assert own_gpu_entries(vmi("vm", spec), None, frozenset({H100})) == []


def test_setting_gpus_twice_gives_the_same_list_and_keeps_foreign_entries() -> None:
    body = vmi(spec={"domain": {"devices": {"gpus": [{"name": "x", "deviceName": "e.com/f"}]}}})
    ours = [{"name": "gpu-cozystack-0", "deviceName": H100}]
    set_gpus(body, ours)
    once = [dict(g) for g in body["spec"]["domain"]["devices"]["gpus"]]
    set_gpus(body, ours)
    assert (
        body["spec"]["domain"]["devices"]["gpus"]
        == once
        == [
            {"name": "x", "deviceName": "e.com/f"},
            {"name": "gpu-cozystack-0", "deviceName": H100},
        ]
    )


def test_entries_with_the_reserved_prefix_are_replaced_not_kept() -> None:
    forged = [{"name": "gpu-cozystack-7", "deviceName": H100}]
    assert gpus_with(forged, []) == []


def test_set_gpus_creates_the_devices_path_on_a_bare_vmi() -> None:
    body: dict[str, Any] = {"metadata": {"name": "vm"}}
    set_gpus(body, [{"name": "gpu-cozystack-0", "deviceName": H100}])
    assert body["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "gpu-cozystack-0", "deviceName": H100}
    ]


# --- the licence copy a start trusts ------------------------------------------------------


def _licensed() -> dict[str, Any]:
    klass = gpu_class("l40s-lic", L40S_24C, "vgpu")
    klass["spec"]["license"] = {
        "secretRef": {"name": "nls", "key": keys.LICENSE_TOKEN_KEY},
        "featureType": 1,
    }
    return klass


def _token_secret(token: str = "cmVhbA==", **labels: str) -> dict[str, Any]:
    marked = {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK, **labels}
    return {
        "metadata": {"labels": marked},
        "type": "Opaque",
        "data": {keys.LICENSE_TOKEN_KEY: token},
    }


def _copy_of(source: dict[str, Any]) -> dict[str, Any]:
    wanted = licence_rules.wanted_copy(_licensed(), "tenant-a", source)
    assert isinstance(wanted, licence_rules.Copy)
    return licence_rules.copy_body(wanted)


def _licensed_start(copy: dict[str, Any] | None, source: dict[str, Any] | None) -> Refusal | Start:
    classes = {**CLASSES, "l40s-lic": _licensed()}
    return judge(
        vmi(),
        ClaimsRequest(("a",)),
        facts(
            claim("a", "l40s-lic"),
            classes=classes,
            license_copies={"l40s-lic": copy},
            license_sources={"l40s-lic": source},
        ),
    )


def test_a_licensed_start_with_the_controllers_copy_gets_it() -> None:
    source = _token_secret()
    result = _licensed_start(_copy_of(source), source)
    assert isinstance(result, Start) and result.license_copy == "gpu-license-l40s-lic"


def test_a_tenants_secret_of_the_copys_name_is_not_trusted_whatever_it_carries() -> None:
    forged = _copy_of(_token_secret("bWluZQ=="))  # the copier's labels and a matching hash
    result = _licensed_start(forged, _token_secret())
    assert isinstance(result, Refusal), "a forged licence copy was trusted"
    assert result.reason == keys.AdmissionReason.LICENSE_COPY_UNTRUSTED
    assert "is not the controller's copy" in result.message
    assert "its data is not the hoster's current token" in result.message


def test_a_licensed_start_whose_hosters_secret_is_refused_says_so() -> None:
    source = _token_secret()
    unmarked = {**source, "metadata": {"labels": {}}}
    result = _licensed_start(_copy_of(source), unmarked)
    assert isinstance(result, Refusal)
    assert result.reason == keys.AdmissionReason.LICENSE_SECRET_REFUSED
    assert "is not marked as a licence token" in result.message
    missing = _licensed_start(None, None)
    assert isinstance(missing, Refusal) and "does not exist" in missing.message
    not_yet = _licensed_start(None, source)
    assert isinstance(not_yet, Refusal) and "has not been copied" in not_yet.message


@pytest.mark.parametrize(
    "mark",
    [
        {"labels": {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE}},
        {"annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: "uid-of-the-old-vmi"}},
    ],
)
def test_a_vm_cannot_hold_a_template_claim_by_name(mark: dict[str, Any]) -> None:
    """A template claim left over from an earlier VMI (its owner cut) is Bound: held by name
    it would carry its GPUs into this VM with no usage record."""
    left_over = claim("old-vm-gpu")
    left_over["metadata"].update(mark)
    request = ClaimsRequest(claims=("old-vm-gpu",), templates=())
    result = judge(vmi(), request, facts(left_over))
    assert isinstance(result, Refusal), f"a VM took template claim old-vm-gpu: {result}"
    assert result.reason == keys.AdmissionReason.CLAIM_IS_TEMPLATE
    assert refusal(result) == (
        f"GPUClaim old-vm-gpu named in {keys.ANNOTATION_CLAIMS} is a template claim "
        f"(labelled {keys.LABEL_TEMPLATE_CLAIM}), made by the controller for one VMI from "
        "its claimTemplates; a VM cannot hold it by name: list the claim template in "
        "claimTemplates instead, or order a claim of your own"
    )
