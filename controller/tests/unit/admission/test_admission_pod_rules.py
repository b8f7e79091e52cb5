"""The pod webhook's rules: the gate once (a live migration's target pod too), the classes'
tolerations once, the VMI found through the ownerReference."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.admission.pod_rules import (
    PodChanges,
    apply,
    changes,
    class_tolerations,
    owner_vmi,
)
from cozystack_gpu.objects.launcher import migration_of

GATE = {"name": keys.SCHEDULING_GATE_CLAIMS}


def pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "generateName": "virt-launcher-vm-",
            "labels": {keys.LABEL_CLAIMS_REF: "true", "kubevirt.io": "virt-launcher"},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": "vm",
                    "uid": "u",
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "compute"}], **spec},
    }


def gpu_class(name: str, *tolerations: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"tolerations": list(tolerations)}}


def test_the_vmi_is_the_pods_controlling_owner() -> None:
    p = pod()
    p["metadata"]["ownerReferences"].insert(
        0, {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "x"}
    )
    assert owner_vmi(p) == "vm"
    assert owner_vmi({"metadata": {"ownerReferences": [{"kind": "Pod", "name": "p"}]}}) is None
    assert owner_vmi({"metadata": {}}) is None


def test_a_migration_target_is_recognised_by_its_label_and_gated_as_a_launcher() -> None:
    """SPEC §12: the target pod is gated (the leader places and pins it), not left alone."""
    p = pod()
    assert migration_of(p) is None
    p["metadata"]["labels"][keys.LABEL_MIGRATION_JOB_UID] = "m"
    assert migration_of(p) == "m"
    assert changes(p, ()).gate


def test_tolerations_of_several_classes_are_joined_once_in_class_order() -> None:
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    vgpu = {"key": "vgpu", "value": "yes", "effect": "NoSchedule"}
    same_gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    union = class_tolerations([gpu_class("b", vgpu, same_gpu), gpu_class("a", gpu)])
    assert union == [gpu, vgpu]


def test_the_gate_and_missing_tolerations_are_added_once() -> None:
    gpu = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
    body = pod(tolerations=[{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}])
    change = changes(body, [gpu])
    assert change == PodChanges(gate=True, tolerations=(gpu,))
    apply(body, change)
    assert body["spec"]["schedulingGates"] == [GATE]
    assert body["spec"]["tolerations"][-1] == gpu
    # A reinvocation sees its own changes and adds nothing.
    again = changes(body, [gpu])
    assert not again
    assert again == PodChanges(gate=False, tolerations=())


def test_a_toleration_without_operator_equals_one_with_operator_equal() -> None:
    written = {"key": "gpu", "value": "a", "effect": "NoSchedule"}
    present = {"key": "gpu", "operator": "Equal", "value": "a", "effect": "NoSchedule"}
    assert changes(pod(tolerations=[present]), [written]).tolerations == ()


def test_other_gates_stay_and_ours_is_added_after_them() -> None:
    body = pod(schedulingGates=[{"name": "example.com/other"}])
    apply(body, changes(body, []))
    assert body["spec"]["schedulingGates"] == [{"name": "example.com/other"}, GATE]
