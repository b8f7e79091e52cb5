"""The invariant checker's start-path rules (issue 18) on hand-made cluster states: each
rule flags the state that breaks it and leaves alone the one that keeps it, before and after
claims record the attached VMI's uid."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit.invariants import (
    ATTACHED_MOVED,
    FOREIGN_TEMPLATE,
    NOT_ATTACHED,
    SERVES_TWO,
    UNPINNED,
    UNPROTECTED,
    Invariants,
    State,
)

NS = "tenant"
NODE = "n1"
OLD = "2026-01-01T00:00:00Z"  # long before any grace


def _stamp(seconds_ago: float) -> str:
    at = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def node(ready: bool = True, since: str = OLD) -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "metadata": {"name": NODE},
        "status": {
            "conditions": [{"type": "Ready", "status": status, "lastTransitionTime": since}]
        },
    }


def vmi(
    name: str = "vm", uid: str = "u1", claims: list[str] | None = None,
    templates: list[dict[str, Any]] | None = None, since: str = OLD,
) -> dict[str, Any]:  # fmt: skip
    request: dict[str, Any] = {}
    if claims:
        request["claims"] = claims
    if templates:
        request["claimTemplates"] = templates
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": uid,
            "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(request)},
        },
        "status": {
            "phase": "Running",
            "nodeName": NODE,
            "phaseTransitionTimestamps": [{"phase": "Running", "phaseTransitionTimestamp": since}],
        },
    }


def pod(vmi_obj: dict[str, Any], *, pin: str | None = NODE, gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": None if gated else NODE}
    if gated:
        spec["schedulingGates"] = [{"name": keys.SCHEDULING_GATE_CLAIMS}]
    term: dict[str, Any] = {"matchExpressions": [{"key": "k", "operator": "Exists"}]}
    if pin is not None:
        term["matchFields"] = [{"key": "metadata.name", "operator": "In", "values": [pin]}]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
        }
    }
    meta = vmi_obj["metadata"]
    return {
        "metadata": {
            "name": f"virt-launcher-{meta['name']}",
            "namespace": NS,
            "labels": {"kubevirt.io": "virt-launcher", keys.LABEL_CLAIMS_REF: "true"},
            "ownerReferences": [
                {"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1",
                 "name": meta["name"], "uid": meta["uid"], "controller": True}
            ],
        },
        "spec": spec,
        "status": {"phase": "Running"},
    }  # fmt: skip


def claim(
    name: str, *, phase: str = "Attached", attached: str | None = "vm",
    uid: str | None = None, protected: bool = True, template_of: str | None = None,
    count: int = 1,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"c-{name}"}
    if protected:
        meta["finalizers"] = [keys.FINALIZER_CLAIM]
    if template_of is not None:
        meta["labels"] = {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE}
        meta["ownerReferences"] = [
            {"kind": "VirtualMachineInstance", "name": "vm", "uid": template_of, "controller": True}
        ]
    status: dict[str, Any] = {"phase": phase, "nodeName": NODE}
    if attached is not None:
        status["attachedTo"] = attached
    if uid is not None:
        status["attachedToUID"] = uid
    return {"metadata": meta, "spec": {"class": "a", "count": count}, "status": status}


def rules(state: State) -> set[tuple[str, str]]:
    checker = Invariants(client.ApiClient())
    return {(v.rule, v.subject) for v in checker.check(state)}


def state(vmis: list[dict[str, Any]], claims: list[dict[str, Any]], **kw: Any) -> State:
    return State(
        nodes=kw.get("nodes", [node()]),
        gpunodes=[],
        classes=[],
        claims=claims,
        namespaces=[],
        quotas=[],
        pods=kw.get("pods", [pod(v) for v in vmis]),
        workloads=[],
        vmis=vmis,
    )


TEMPLATE = [{"name": "gpu", "class": "a", "count": 1}]


def test_a_running_vmis_attached_protected_claims_break_no_rule() -> None:
    running = vmi(claims=["held"], templates=TEMPLATE)
    claims = [claim("held"), claim("vm-gpu", template_of="u1")]
    assert rules(state([running], claims)) == set()


def test_a_running_vmis_template_claim_left_bound_and_unprotected_is_flagged() -> None:
    running = vmi(templates=TEMPLATE)
    bound = claim("vm-gpu", phase="Bound", attached=None, protected=False, template_of="u1")
    found = rules(state([running], [bound]))
    assert (NOT_ATTACHED, f"{NS}/vm-gpu") in found
    assert (UNPROTECTED, f"{NS}/vm-gpu") in found


def test_a_just_started_vm_gets_a_grace_for_its_template_claim() -> None:
    running = vmi(templates=TEMPLATE, since=_stamp(1))
    bound = claim("vm-gpu", phase="Bound", attached=None, protected=False, template_of="u1")
    assert rules(state([running], [bound])) == set()


def test_a_claim_gone_while_its_vmi_runs_is_flagged() -> None:
    assert (NOT_ATTACHED, f"{NS}/held") in rules(state([vmi(claims=["held"])], []))


def test_an_attachment_recorded_for_another_uid_is_flagged_and_no_uid_is_unknown() -> None:
    running = vmi(claims=["held"])
    assert rules(state([running], [claim("held")])) == set()
    assert rules(state([running], [claim("held", uid="u1")])) == set()
    stale = rules(state([running], [claim("held", uid="u0")]))
    assert (NOT_ATTACHED, f"{NS}/held") in stale


def test_a_lost_claim_on_a_not_ready_node_is_allowed_and_a_bound_one_is_not() -> None:
    running = vmi(claims=["held"])
    down = [node(ready=False)]
    assert rules(state([running], [claim("held", phase="Lost")], nodes=down)) == set()
    unattached = claim("held", phase="Bound", attached=None)
    assert (NOT_ATTACHED, f"{NS}/held") in rules(state([running], [unattached], nodes=down))


def test_a_template_claim_of_another_incarnation_or_count_is_flagged() -> None:
    running = vmi(templates=TEMPLATE)
    leftover = rules(state([running], [claim("vm-gpu", template_of="u0")]))
    assert (FOREIGN_TEMPLATE, f"{NS}/vm-gpu") in leftover
    bigger = rules(state([running], [claim("vm-gpu", template_of="u1", count=2)]))
    assert (FOREIGN_TEMPLATE, f"{NS}/vm-gpu") in bigger


def test_one_claim_used_by_two_running_vmis_is_flagged() -> None:
    first, second = vmi("vm", "u1", claims=["held"]), vmi("vm2", "u2", claims=["held"])
    found = rules(state([first, second], [claim("held")]))
    assert (SERVES_TWO, f"{NS}/held") in found


def test_an_ungated_launcher_pod_without_its_pin_is_flagged() -> None:
    running = vmi(claims=["held"])
    unpinned = rules(state([running], [claim("held")], pods=[pod(running, pin=None)]))
    assert (UNPINNED, f"{NS}/virt-launcher-vm") in unpinned
    elsewhere = rules(state([running], [claim("held")], pods=[pod(running, pin="n2")]))
    assert (UNPINNED, f"{NS}/virt-launcher-vm") in elsewhere
    gated = pod(running, pin=None, gated=True)
    assert (UNPINNED, f"{NS}/virt-launcher-vm") not in rules(
        state([running], [claim("held")], pods=[gated])
    )


def test_a_running_vms_template_claim_moved_to_another_node_is_flagged_at_once() -> None:
    running = vmi(templates=TEMPLATE, since=_stamp(1))
    moved = claim("vm-gpu", phase="Bound", attached=None, template_of="u1")
    moved["status"]["nodeName"] = "n2"
    assert (NOT_ATTACHED, f"{NS}/vm-gpu") in rules(state([running], [moved]))


def test_an_attached_claim_moves_only_before_its_vmi_was_placed_on_its_node() -> None:
    """A starting VM's template claim is Attached in the write that binds it, before the
    pin: a cordon between the two lets the gate place the set again elsewhere, and nothing
    ran on the first node. Once the VMI's launcher pod was bound there, a move is the
    broken promise."""
    starting = vmi(uid="u1")
    starting["status"] = {"phase": "Scheduling"}
    gated = pod(starting, pin=None, gated=True)
    checker = Invariants(client.ApiClient())

    def look(obj: dict[str, Any], pods: list[dict[str, Any]]) -> set[str]:
        found = checker.check(state([starting], [obj], pods=pods))
        return {v.rule for v in found}

    first = claim("vm-gpu", uid="u1", template_of="u1")
    assert ATTACHED_MOVED not in look(first, [gated])
    elsewhere = copy.deepcopy(first)
    elsewhere["status"]["nodeName"] = "n3"
    assert ATTACHED_MOVED not in look(elsewhere, [gated]), "a set placed again before its start"

    # Now its pod is bound on n3, where the claim is: moving it again breaks the rule.
    bound = pod(starting)
    bound["spec"]["nodeName"] = "n3"
    assert ATTACHED_MOVED not in look(elsewhere, [bound])
    back = copy.deepcopy(elsewhere)
    back["status"]["nodeName"] = NODE
    assert ATTACHED_MOVED in look(back, [bound])


def test_an_attached_claim_follows_its_vm_only_to_the_migration_target_it_recorded() -> None:
    """SPEC §12: once a running VM's claim records a live migration's target, the claim
    may move there (its VM landed); to any other node it is still the broken promise."""
    running = vmi(uid="u1")
    bound = pod(running)
    checker = Invariants(client.ApiClient())

    def look(obj: dict[str, Any]) -> set[str]:
        return {v.rule for v in checker.check(state([running], [obj], pods=[bound]))}

    held = claim("vm-gpu", uid="u1", template_of="u1")
    assert ATTACHED_MOVED not in look(held)
    recorded = copy.deepcopy(held)
    recorded["status"]["migration"] = {"node": "n3", "migrationUID": "m", "since": _stamp(1)}
    assert ATTACHED_MOVED not in look(recorded)
    landed = copy.deepcopy(held)
    landed["status"]["nodeName"] = "n3"
    assert ATTACHED_MOVED not in look(landed), "the hold followed the VM to its target"
    elsewhere = copy.deepcopy(landed)
    elsewhere["status"]["nodeName"] = "n4"
    assert ATTACHED_MOVED in look(elsewhere)


def test_an_ended_vmis_pod_may_stay_pinned_where_its_claims_have_left() -> None:
    """At a VMI's end its claims go back to Bound and may move (packing, SPEC §5) while its
    launcher pod still stands until it is deleted: its old pin is no broken pin. A pod
    whose pin is missing is still flagged, ended or not."""
    ended = vmi(claims=["held"])
    ended["status"]["phase"] = "Succeeded"
    moved = claim("held", phase="Bound", attached=None)
    moved["status"]["nodeName"] = "n2"
    checker = Invariants(client.ApiClient())
    found = {(v.rule, v.subject) for v in checker.check(state([ended], [moved], pods=[pod(ended)]))}
    assert (UNPINNED, f"{NS}/virt-launcher-vm") not in found
    assert checker.pins_left_after_the_end == {f"{NS}/virt-launcher-vm"}
    unpinned = rules(state([ended], [moved], pods=[pod(ended, pin=None)]))
    assert (UNPINNED, f"{NS}/virt-launcher-vm") in unpinned


def test_a_landed_vm_runs_where_its_vmi_says_while_its_source_pod_is_still_bound() -> None:
    """After a live migration lands, the VMI's source and target launcher pods are both
    bound until the source pod goes; the VM runs on the node its VMI names (virt-handler
    moved ``nodeName``), and its claim, moved there, breaks no rule, whichever pod is
    listed last. (The fuzz flagged it when the source pod's name sorted after the
    target's.)"""
    landed = vmi(uid="u1", templates=TEMPLATE)
    landed["status"]["nodeName"] = "n3"
    source = pod(landed)  # still bound on NODE, its launcher not yet gone
    target = pod(landed)
    target["metadata"]["name"] = "virt-launcher-vm-a0000"
    target["spec"]["nodeName"] = "n3"
    moved = claim("vm-gpu", uid="u1", template_of="u1")
    moved["status"]["nodeName"] = "n3"
    for pods in ([source, target], [target, source]):
        found = rules(state([landed], [moved], pods=pods))
        assert (NOT_ATTACHED, f"{NS}/vm-gpu") not in found, pods[-1]["spec"]["nodeName"]
    # Before it lands, the VMI names the source: a claim already on the target is flagged.
    before = copy.deepcopy(landed)
    before["status"]["nodeName"] = NODE
    found = rules(state([before], [moved], pods=[target, source]))
    assert (NOT_ATTACHED, f"{NS}/vm-gpu") in found
