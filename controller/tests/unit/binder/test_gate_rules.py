"""The gate's pure rules: the claims annotation, the one pin-and-ungate update, the
scheduler's refusals, and the node limits of bound volumes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.model import VolumeAffinity
from cozystack_gpu.objects import annotation, vmi_pods, volumes
from cozystack_gpu.objects.annotation import TemplateEntry


def test_the_gate_reads_held_claims_and_templates_and_ignores_a_malformed_annotation() -> None:
    value = {"claims": ["a", "b"], "claimTemplates": [{"name": "x", "class": "h100", "count": 2}]}
    vmi = {"metadata": {"name": "vm", "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(value)}}}
    ref = annotation.claims_ref_of(vmi)
    assert ref is not None and ref.claims == ("a", "b")
    assert annotation.template_claim_names("vm", ref) == ("vm-x",)
    body = gate.template_claim(
        {**vmi, "metadata": {**vmi["metadata"], "namespace": "t"}}, ref.templates[0]
    )
    assert body["spec"] == {"class": "h100", "count": 2}
    assert body["metadata"]["labels"] == {keys.LABEL_TEMPLATE_CLAIM: "true"}
    broken = {"metadata": {"annotations": {keys.ANNOTATION_CLAIMS: '{"claim": ["a"]}'}}}
    assert annotation.claims_ref_of(broken) is None
    assert annotation.claims_ref_of({"metadata": {}}) is None


def _pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "resourceVersion": "5"}, "spec": spec}


def test_pinning_adds_the_node_to_every_required_term_and_removes_only_our_gate() -> None:
    pod = _pod(
        schedulingGates=[{"name": keys.SCHEDULING_GATE_CLAIMS}, {"name": "other.io/gate"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    ]
                }
            }
        },
    )
    body = gate.pin_and_ungate(pod, "n1")
    assert body["metadata"]["resourceVersion"] == "5"
    assert body["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
    terms = body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2
    for term in terms:
        assert term["matchExpressions"]  # kept
        assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]
    assert vmi_pods.pinned_node({"spec": body["spec"]}) == "n1"


def test_a_pod_without_terms_gets_one_and_loses_its_last_gate() -> None:
    body = gate.pin_and_ungate(_pod(schedulingGates=[{"name": keys.SCHEDULING_GATE_CLAIMS}]), "n2")
    assert body["spec"]["schedulingGates"] is None
    assert vmi_pods.pinned_node({"spec": body["spec"]}) == "n2"


def launcher(message: str, reason: str = "Unschedulable") -> dict[str, Any]:
    """A pinned launcher pod as KubeVirt renders it, refused by the scheduler."""
    cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
    limits = {"nvidia.com/GH100": "1", "devices.kubevirt.io/kvm": "1", "memory": "17Gi"}
    requests = {**limits, "cpu": "2", "ephemeral-storage": "50M"}
    return {
        "spec": {
            "containers": [
                {"name": "compute", "resources": {"requests": requests, "limits": limits}}
            ],
            "initContainers": [{"name": "guest-console-log", "resources": {}}],
        },
        "status": {"conditions": [cond]},
    }


@pytest.mark.parametrize(
    "lacking",
    ["nvidia.com/GH100", "memory", "cpu", "devices.kubevirt.io/kvm", "ephemeral-storage"],
)
def test_a_pinned_pod_refused_for_any_resource_it_requests_rejects_the_node(lacking: str) -> None:
    message = f"0/3 nodes are available: 1 Insufficient {lacking}, 2 node(s) didn't match"
    refusal = gate.refused_for_resources(launcher(message))
    assert refusal is not None
    assert refusal.resources == (lacking,) and refusal.message == message


def test_only_a_lack_of_what_the_pod_requests_is_a_refusal_for_resources() -> None:
    assert gate.refused_for_resources(launcher("1 Insufficient nvidia.com/AD102")) is None
    insufficient = "0/3 nodes are available: 1 Insufficient memory"
    assert gate.refused_for_resources(launcher(insufficient, "SchedulerError")) is None
    too_many = gate.refused_for_resources(launcher("0/1 nodes are available: 1 Too many pods."))
    assert too_many is not None and too_many.resources == ("pods",)


def test_a_rejection_keeps_the_node_state_it_was_made_in() -> None:
    node = {
        "spec": {"taints": []},
        "status": {
            "allocatable": {"nvidia.com/GH100": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    state = gate.node_state(node)
    relabelled = {**node, "metadata": {"labels": {"x": "y"}}}
    assert gate.node_state(relabelled) == state  # labels are not what a rejection waits for
    drained = {**node, "status": {**node["status"], "allocatable": {"nvidia.com/GH100": "7"}}}
    assert gate.node_state(drained) != state
    claim = {"status": {"rejectedNodes": [{"node": "n1", "until": "x", "nodeState": state}]}}
    assert gate.stale_rejections(claim, {"n1": state}) == []
    assert gate.stale_rejections(claim, {"n1": gate.node_state(drained)}) == ["n1"]
    assert gate.stale_rejections(claim, {"n1": None}) == ["n1"]  # the node is gone
    assert gate.stale_rejections(claim, {"n2": None}) == []


def test_a_cordoned_or_not_ready_node_or_a_stay_pin_is_waited_for_not_rejected() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}, "spec": {}}
    assert gate.node_may_reject(ready, stay_pinned=False)
    assert not gate.node_may_reject(ready, stay_pinned=True)
    assert not gate.node_may_reject({**ready, "spec": {"unschedulable": True}}, stay_pinned=False)
    assert not gate.node_may_reject({"status": {}, "spec": {}}, stay_pinned=False)
    assert not gate.node_may_reject(None, stay_pinned=False)


def test_a_rejection_is_recorded_renewed_and_dropped_when_the_node_changes() -> None:
    claim = {
        "metadata": {"resourceVersion": "9"},
        "status": {
            "rejectedNodes": [
                {"node": "n1", "until": "2026-11-30T12:00:00Z"},
                {"node": "old", "until": "2026-11-30T09:00:00Z"},
            ]
        },
    }
    body = gate.rejection_patch(
        claim, "n1", "2026-11-30T13:00:00Z", "2026-11-30T10:00:00Z", "digest"
    )
    assert body["status"]["rejectedNodes"] == [
        {"node": "n1", "until": "2026-11-30T13:00:00Z", "nodeState": "digest"}
    ]
    dropped = gate.without_rejections(claim, ["n1"])
    assert dropped is not None
    assert [e["node"] for e in dropped["status"]["rejectedNodes"]] == ["old"]
    assert gate.without_rejections(claim, ["n9"]) is None


def test_a_claim_still_saying_pinned_to_the_refusing_node_is_told_the_refusal_again() -> None:
    """The pin's Placed note can win the race against the refusal's write (which then
    answers 409): the rejection written again over it must carry the refusal too."""

    def told(reason: str, message: str) -> dict[str, Any]:
        cond = {"type": keys.CONDITION_PLACED, "reason": reason, "message": message}
        return {"status": {"conditions": [cond]}}

    pinned = told(keys.ClaimReason.PINNED.value, gate.pinned_message("virt-launcher-vm-x", "n1"))
    assert gate.says_pinned_to(pinned, "n1")
    assert not gate.says_pinned_to(pinned, "n11") and not gate.says_pinned_to(pinned, "n")
    refused = told(keys.ClaimReason.NODE_REFUSED.value, "node n1 refused … pinned to node n1")
    assert not gate.says_pinned_to(refused, "n1")
    assert not gate.says_pinned_to({"status": {}}, "n1")


def test_bound_volumes_limit_the_nodes_a_set_may_start_on() -> None:
    nodes = [
        {"metadata": {"name": "n1", "labels": {"zone": "a"}}},
        {"metadata": {"name": "n2", "labels": {"zone": "b"}}},
        {"metadata": {"name": "n3", "labels": {}}},
    ]
    local = {
        "spec": {
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n2"]}
                            ]
                        }
                    ]
                }
            }
        }
    }
    zonal = {
        "spec": {
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}
                    ]
                }
            }
        }
    }

    def limits(*pvs: dict[str, Any]) -> list[VolumeAffinity]:
        return [a for pv in pvs if (a := volumes.volume_affinity(pv)) is not None]

    assert gate.volume_nodes(limits(), nodes) is None
    assert gate.volume_nodes(limits({"spec": {}}), nodes) is None
    assert gate.volume_nodes(limits(zonal), nodes) == {"n1", "n2"}
    assert gate.volume_nodes(limits(zonal, local), nodes) == {"n2"}


def _template_claim(**meta: Any) -> dict[str, Any]:
    vmi = {"metadata": {"name": "vm", "namespace": "t", "uid": "uid-2"}}
    entry = TemplateEntry("gpu", "h100", 1)
    body = gate.template_claim(vmi, entry)
    body["metadata"].update(meta)
    return body


def test_only_the_template_claim_made_for_this_vmi_is_adopted() -> None:
    entry = TemplateEntry("gpu", "h100", 1)
    ours = _template_claim()
    assert gate.template_claim_conflict(ours, "vm", "uid-2", entry) is None
    assert ours["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]


def test_a_forged_or_leftover_claim_of_a_template_name_is_not_adopted() -> None:
    entry = TemplateEntry("gpu", "h100", 1)
    forged = _template_claim(labels={})  # an ordered claim a tenant named like the template
    problem = gate.template_claim_conflict(forged, "vm", "uid-2", entry)
    assert problem is not None and "ordered claim" in problem and "delete that claim" in problem
    bigger = _template_claim()
    bigger["spec"]["count"] = 2
    problem = gate.template_claim_conflict(bigger, "vm", "uid-2", entry)
    assert problem is not None and "orders 2 of class h100" in problem
    leftover = _template_claim()  # made for the VM's previous start
    problem = gate.template_claim_conflict(leftover, "vm", "uid-3", entry)
    assert problem is not None and "earlier start of this VM" in problem
    assert "the VM starts once it is gone" in problem
    foreign = _template_claim()
    foreign["metadata"]["ownerReferences"][0]["name"] = "other-vm"
    problem = gate.template_claim_conflict(foreign, "vm", "uid-2", entry)
    assert problem is not None and "not controlled by this VirtualMachineInstance" in problem


def _held(attached_to: str, uid: str | None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Attached", "attachedTo": attached_to, "nodeName": "n1"}
    if uid is not None:
        status["attachedToUID"] = uid
    return {"metadata": {"name": "c", "finalizers": [keys.FINALIZER_CLAIM]}, "status": status}


def _vmi(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "vm", "namespace": "t", "uid": uid}, "status": {}}


def test_a_held_claim_attached_to_an_earlier_vmi_of_the_name_is_not_ready_for_this_start() -> None:
    """KubeVirt names every VMI of a VM after it: after a quick restart the claim may still
    be attached, by uid, to the VMI before. The new VMI's pod is pinned only once the
    claim is attached to this very VMI (the lifecycle fuzz saw a pod pinned so, its
    claims covering nothing)."""
    assert gate.held_for_start(_held("vm", "uid-now"), _vmi("uid-now"))
    assert not gate.held_for_start(_held("vm", "uid-before"), _vmi("uid-now"))
    assert not gate.held_for_start(_held("other", "uid-now"), _vmi("uid-now"))
    # An attachment written without a uid (by 0.2.0's webhook) is judged by the name.
    assert gate.held_for_start(_held("vm", None), _vmi("uid-now"))
