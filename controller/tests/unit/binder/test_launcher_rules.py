"""The rule of SPEC §7 as pure functions: a pod is covered by claims only as the one
launcher pod of a live VMI; every other pod requesting a GPU name is raw usage. And the
gate's check (SPEC §6) that a launcher pod's GPU requests are exactly what its claims
cover."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.objects import launcher
from cozystack_gpu.objects.launcher import PodRole
from cozystack_gpu.objects.translate import VMIState

GPU = "nvidia.com/X"


def _pod(
    name: str,
    uid: str | None = "u1",
    created: str = "2026-12-01T10:00:01Z",
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    init: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    refs = (
        []
        if uid is None
        else [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": "vm",
                "uid": uid,
            }
        ]
    )
    spec: dict[str, Any] = {
        "nodeName": "n1",
        "containers": containers
        if containers is not None
        else [{"name": "compute", "resources": {"limits": {GPU: "1"}}}],
    }
    if init:
        spec["initContainers"] = init
    return {
        "metadata": {
            "name": name,
            "namespace": "t",
            "creationTimestamp": created,
            "labels": {keys.LABEL_CLAIMS_REF: "true", **(labels or {})},
            "ownerReferences": refs,
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def _vmi(uid: str = "u1", phase: str = "Running", uses_claims: bool = True) -> VMIState:
    return VMIState("t", "vm", phase, "n1", ("c",), uses_claims=uses_claims, uid=uid)


def test_only_the_oldest_live_pod_of_a_live_claims_vmi_is_covered() -> None:
    real = _pod("virt-launcher-vm-abcde")
    forged = _pod("aaa-forged", created="2026-12-01T10:00:05Z")
    pods = [forged, real]
    assert launcher.pod_role(real, _vmi(), pods) is PodRole.COVERED
    assert launcher.pod_role(forged, _vmi(), pods) is PodRole.RAW, "a second pod of the VMI"
    target = _pod(
        "target", created="2026-12-01T09:00:00Z", labels={keys.LABEL_MIGRATION_JOB_UID: "m"}
    )
    assert launcher.launcher_of([target, real], "u1") is real, "a migration target is not it"
    ended = _pod("old", created="2026-12-01T09:00:00Z", phase="Succeeded")
    assert launcher.launcher_of([ended, real], "u1") is real, "a final pod is not it"


def test_a_pod_is_raw_unless_its_vmi_is_live_has_its_uid_and_uses_claims() -> None:
    pod = _pod("p")
    assert launcher.pod_role(pod, None, [pod]) is PodRole.RAW, "no such VMI"
    assert launcher.pod_role(pod, _vmi(uid="u2"), [pod]) is PodRole.RAW, "another uid"
    assert launcher.pod_role(pod, _vmi(phase="Failed"), [pod]) is PodRole.RAW, "a final VMI"
    assert launcher.pod_role(pod, _vmi(uses_claims=False), [pod]) is PodRole.RAW
    unowned = _pod("p", uid=None)
    assert launcher.pod_role(unowned, _vmi(), [unowned]) is PodRole.RAW, "the label alone"
    assert launcher.pod_role(pod, _vmi(phase="Failed"), [pod], "p") is PodRole.FINISHING
    assert launcher.pod_role(pod, _vmi(phase="Failed"), [pod], "other") is PodRole.RAW


_pods = st.lists(
    st.builds(
        _pod,
        name=st.sampled_from(["a", "b", "c", "d", "e"]),
        uid=st.sampled_from(["u1", "u2", None]),
        created=st.sampled_from(["2026-12-01T10:00:01Z", "2026-12-01T10:00:02Z"]),
        phase=st.sampled_from(["Pending", "Running", "Succeeded"]),
        labels=st.sampled_from([{}, {keys.LABEL_MIGRATION_JOB_UID: "m"}]),
    ),
    max_size=6,
    unique_by=lambda p: p["metadata"]["name"],
)


@given(pods=_pods, vmi=st.builds(_vmi, uid=st.sampled_from(["u1", "u2"])), seed=st.randoms())
def test_at_most_one_launcher_and_one_target_pod_of_a_vmi_are_covered_whatever_the_order(
    pods: list[dict[str, Any]], vmi: VMIState, seed: Any
) -> None:
    """One launcher pod, and for a live migration one target pod (SPEC §12), never more."""
    covered = [
        p["metadata"]["name"] for p in pods if launcher.pod_role(p, vmi, pods) is PodRole.COVERED
    ]
    by_role = {launcher.migration_of(p) for p in pods if p["metadata"]["name"] in covered}
    assert len(by_role) == len(covered), "two covered pods of one role"
    shuffled = list(pods)
    seed.shuffle(shuffled)
    again = [
        p["metadata"]["name"]
        for p in pods
        if launcher.pod_role(p, vmi, shuffled) is PodRole.COVERED
    ]
    assert len(covered) <= 2
    assert covered == again, "the choice does not depend on the order pods are seen in"


def test_requests_that_match_the_claims_pass_the_gate() -> None:
    pod = _pod(
        "p", containers=[{"name": "compute", "resources": {"limits": {GPU: "2", "cpu": "1"}}}]
    )
    assert launcher.request_mismatch(pod, frozenset({GPU}), {GPU: 2}) is None


def test_a_network_request_beyond_the_claims_is_named_with_its_container() -> None:
    pod = _pod(
        "p",
        containers=[
            {"name": "compute", "resources": {"limits": {GPU: "2"}, "requests": {GPU: "2"}}},
            {"name": "hook", "resources": {"limits": {"nvidia.com/Y": "1"}}},
        ],
        init=[{"name": "setup", "resources": {"requests": {GPU: "1"}}}],
    )
    why = launcher.request_mismatch(pod, frozenset({GPU, "nvidia.com/Y"}), {GPU: 1})
    assert why is not None
    assert f"2 unit(s) of {GPU} beyond its claims, which cover 1" in why
    assert "init container setup: 1" in why and "container compute: 2" in why
    assert "1 unit(s) of nvidia.com/Y beyond its claims, which cover 0 (container hook: 1)" in why
    assert keys.ANNOTATION_NAD_RESOURCE in why
    # A name that is no GPU name (a NIC VF next to the GPU) is none of the gate's business.
    assert launcher.request_mismatch(pod, frozenset({"nvidia.com/Z"}), {}) is None


def test_requests_short_of_the_claims_keep_the_pod_gated_too() -> None:
    pod = _pod("p")
    why = launcher.request_mismatch(pod, frozenset({GPU}), {GPU: 2})
    assert why is not None and f"1 unit(s) of {GPU} fewer than its claims cover (2" in why


def test_a_migration_target_pod_is_covered_by_the_target_its_claims_record_and_only_one() -> None:
    """SPEC §12: the target pod's GPU request is its migration's, counted on the target node
    by the claims' recorded target, never raw usage; a second pod of the same migration (or
    one forged with its label) is raw; the launcher pod stays covered on its own node."""
    from cozystack_gpu.objects import pod_usage

    mig = {keys.LABEL_MIGRATION_JOB_UID: "m1"}
    launcher_pod = _pod("virt-launcher-vm-abcde")
    target = _pod("virt-launcher-vm-xyz", created="2026-12-01T10:05:00Z", labels=mig)
    target["spec"]["nodeName"] = "n2"
    second = _pod("virt-launcher-vm-zzz", created="2026-12-01T10:06:00Z", labels=mig)
    pods = [launcher_pod, target, second]
    assert launcher.pod_role(launcher_pod, _vmi(), pods) is PodRole.COVERED
    assert launcher.pod_role(target, _vmi(), pods) is PodRole.COVERED
    assert launcher.pod_role(second, _vmi(), pods) is PodRole.RAW
    claim = {
        "spec": {"class": "h100", "count": 1},
        "status": {
            "phase": "Attached", "nodeName": "n1", "attachedTo": "vm",
            "migration": {"node": "n2", "migrationUID": "m1", "since": "2026-12-01T10:05:00Z"},
        },
    }  # fmt: skip
    resource_of = {"h100": GPU}.get
    assert pod_usage.claims_cover([claim], resource_of, "n2", "m1") == {GPU: 1}
    assert pod_usage.claims_cover([claim], resource_of, "n2", "other") == {}
    assert pod_usage.claims_cover([claim], resource_of, "n1") == {GPU: 1}
    assert pod_usage.claims_cover([claim], resource_of, "n2") == {}
    # Landed: the claim moved to n2 with its VM, and the target pod (its label for life)
    # is the VM's pod there, covered by the claim as any launcher pod.
    landed = {**claim, "status": {"phase": "Attached", "nodeName": "n2", "attachedTo": "vm"}}
    assert pod_usage.claims_cover([landed], resource_of, "n2", "m1") == {GPU: 1}


def test_a_pod_forged_as_a_pinned_target_in_the_same_second_does_not_displace_it() -> None:
    """creationTimestamp has whole seconds: a tenant admin's pod with the migration's label,
    made in the second its real target was made and pinned, and named to sort first, was
    taken for the target and ungated (seen in CI, test_live_migration). The pod the
    controller has pinned and ungated stays the target; a gated one never displaces it."""
    mig = {keys.LABEL_MIGRATION_JOB_UID: "m1"}
    second = "2026-12-01T10:05:00Z"
    real = _pod("virt-launcher-vm-xyz", created=second, labels=mig)
    forged = _pod("forged-target", created=second, labels=mig)
    forged["spec"] = {**forged["spec"], "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}]}
    forged["spec"].pop("nodeName")
    for pods in ([real, forged], [forged, real]):
        assert launcher.migration_target_of(pods, "u1", "m1") is real
        assert launcher.pod_role(forged, _vmi(), pods) is PodRole.RAW
    # Both still gated (neither let go yet): the older, then the name, as before.
    real["spec"]["schedulingGates"] = [{"name": keys.SCHEDULING_GATE_CLAIMS}]
    assert launcher.migration_target_of([real, forged], "u1", "m1") is forged
