"""The gate's pure rules: the claims annotation, the one pin-and-ungate update, the
scheduler's refusals, and the node limits of bound volumes."""

from __future__ import annotations

import json
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder import gate, translate
from cozystack_gpu.model import VolumeAffinity


def test_the_gate_reads_held_claims_and_templates_and_ignores_a_malformed_annotation() -> None:
    value = {"claims": ["a", "b"], "claimTemplates": [{"name": "x", "class": "h100", "count": 2}]}
    vmi = {"metadata": {"name": "vm", "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(value)}}}
    ref = gate.claims_ref_of(vmi)
    assert ref is not None and ref.claims == ("a", "b")
    assert gate.template_claim_names("vm", ref) == ("vm-x",)
    body = gate.template_claim(
        {**vmi, "metadata": {**vmi["metadata"], "namespace": "t"}}, ref.templates[0]
    )
    assert body["spec"] == {"class": "h100", "count": 2}
    assert body["metadata"]["labels"] == {keys.LABEL_TEMPLATE_CLAIM: "true"}
    broken = {"metadata": {"annotations": {keys.ANNOTATION_CLAIMS: '{"claim": ["a"]}'}}}
    assert gate.claims_ref_of(broken) is None
    assert gate.claims_ref_of({"metadata": {}}) is None


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
    assert gate.pinned_node({"spec": body["spec"]}) == "n1"


def test_a_pod_without_terms_gets_one_and_loses_its_last_gate() -> None:
    body = gate.pin_and_ungate(_pod(schedulingGates=[{"name": keys.SCHEDULING_GATE_CLAIMS}]), "n2")
    assert body["spec"]["schedulingGates"] is None
    assert gate.pinned_node({"spec": body["spec"]}) == "n2"


def test_only_a_refusal_for_the_sets_resource_counts() -> None:
    def refused(message: str, reason: str = "Unschedulable") -> dict[str, Any]:
        cond = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        return {"status": {"conditions": [cond]}}

    insufficient = (
        "0/3 nodes are available: 1 Insufficient nvidia.com/GH100, 2 node(s) didn't match"
    )
    assert gate.refused_for_resources(refused(insufficient), {"nvidia.com/GH100"}) == insufficient
    assert gate.refused_for_resources(refused("1 Insufficient cpu"), {"nvidia.com/GH100"}) is None
    assert (
        gate.refused_for_resources(refused(insufficient, "SchedulerError"), {"nvidia.com/GH100"})
        is None
    )


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
    body = gate.rejection_patch(claim, "n1", "2026-11-30T13:00:00Z", "2026-11-30T10:00:00Z")
    assert body["status"]["rejectedNodes"] == [{"node": "n1", "until": "2026-11-30T13:00:00Z"}]
    dropped = gate.without_rejections(claim, ["n1"])
    assert dropped is not None
    assert [e["node"] for e in dropped["status"]["rejectedNodes"]] == ["old"]
    assert gate.without_rejections(claim, ["n9"]) is None


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
        return [a for pv in pvs if (a := translate.volume_affinity(pv)) is not None]

    assert gate.volume_nodes(limits(), nodes) is None
    assert gate.volume_nodes(limits({"spec": {}}), nodes) is None
    assert gate.volume_nodes(limits(zonal), nodes) == {"n1", "n2"}
    assert gate.volume_nodes(limits(zonal, local), nodes) == {"n2"}
