"""The pod webhook, called by the real kube-apiserver over HTTPS: the virt-launcher pod and
KubeVirt's temporary WaitForFirstConsumer pod get the scheduling gate (once) and the
tolerations of the claims' classes, and so does a live migration's target pod (SPEC §12);
unlabelled pods are untouched.

The pods are written by hand, after virt-controller's: each test needs a shape this
platform's virt-controller does not make (a migration target needs virt-handler, the
temporary pod CDI's DataVolumes; a pod gated already, one no VMI owns, a dry run), and the
answer is the webhook's alone. The launcher pod virt-controller itself renders, gated with
the classes' tolerations after KubeVirt's own, is test_kubevirt_start.py's."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Corner, Replica, create_vmi, refusal, serving, vmi_body
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import Kube

pytestmark = pytest.mark.apiserver

GATE = {"name": keys.SCHEDULING_GATE_CLAIMS}
GPU_TAINT = {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
VGPU_TAINT = {"key": "gpu.example.com/vgpu", "value": "yes", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def replica(
    control_plane: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    with serving(control_plane, kube, tmp_path_factory.mktemp("admission")) as running:
        yield running


@pytest.fixture
def started(kube: Kube, replica: Replica, namespace: str) -> dict[str, Any]:
    """A VMI started with a held claim of one class and a template of another, each class
    with its own toleration (and one shared)."""
    corner = Corner(kube)
    node = corner.node("n1", 2)
    held = corner.gpu_class("h100", tolerations=[GPU_TAINT])
    other = corner.gpu_class("a100", corner.resource("A100"), tolerations=[VGPU_TAINT, GPU_TAINT])
    corner.bound(namespace, "a", held, node=node)
    request = {"claims": ["a"], "claimTemplates": [{"name": "more", "class": other}]}
    return create_vmi(kube, namespace, vmi_body("vm", request))


def launcher(
    vmi: dict[str, Any],
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owned: bool = True,
    gates: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A pod as virt-controller renders it for a VMI: every VMI label, the VMI as the
    controlling owner, the gpus entries as requests of the compute container."""
    requests: dict[str, str] = {}
    for gpu in vmi["spec"]["domain"]["devices"].get("gpus") or []:
        name = gpu["deviceName"]
        requests[name] = str(int(requests.get(name, "0")) + 1)
    metadata: dict[str, Any] = {
        "generateName": f"virt-launcher-{vmi['metadata']['name']}-",
        "labels": {
            **vmi["metadata"].get("labels", {}),
            "kubevirt.io": "virt-launcher",
            "kubevirt.io/created-by": vmi["metadata"]["uid"],
            **(labels or {}),
        },
        "annotations": dict(annotations or {}),
    }
    if owned:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": vmi["metadata"]["name"],
                "uid": vmi["metadata"]["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "compute",
                    "image": "quay.io/kubevirt/virt-launcher:v1.9.0",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
            "schedulingGates": list(gates or []),
            "tolerations": [
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists",
                 "effect": "NoExecute", "tolerationSeconds": 300},
            ],
        },
    }  # fmt: skip


def create_pod(kube: Kube, namespace: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    created = kube.core.create_namespaced_pod(namespace, body, **kw)
    result: dict[str, Any] = kube.api.sanitize_for_serialization(created)
    return result


def ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The tolerations the webhook added (after the ones the pod came with)."""
    return [t for t in pod["spec"]["tolerations"] if t["key"].startswith("gpu.example.com/")]


def test_the_launcher_pod_is_gated_with_the_tolerations_of_every_class(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    pod = create_pod(kube, namespace, launcher(started))
    assert pod["spec"]["schedulingGates"] == [GATE]
    # Union in class-name order (a100-… before h100-…), the shared one once.
    assert ours(pod) == [VGPU_TAINT, GPU_TAINT]
    # The tolerations the pod came with stay.
    assert pod["spec"]["tolerations"][0]["key"] == "node.kubernetes.io/unreachable"
    # Still gated: the scheduler leaves it alone until the controller pins and ungates it.
    status = kube.core.read_namespaced_pod(pod["metadata"]["name"], namespace).status
    assert not any(c.type == "PodScheduled" and c.status == "True" for c in status.conditions or [])


def test_the_temporary_wait_for_first_consumer_pod_is_gated_too(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    body = launcher(started, annotations={keys.ANNOTATION_EPHEMERAL_PROVISIONING: "true"})
    pod = create_pod(kube, namespace, body)
    assert pod["spec"]["schedulingGates"] == [GATE]
    assert len(ours(pod)) == 2


def test_a_migration_target_is_gated_as_a_launcher_pod(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    """Ungated, the target pod's GPU request would reach the scheduler on units no claim
    holds for it (another tenant's, SPEC §12): the leader places and pins it."""
    body = launcher(started, labels={keys.LABEL_MIGRATION_JOB_UID: "0b8e5c56"})
    pod = create_pod(kube, namespace, body)
    assert pod["spec"]["schedulingGates"] == [GATE]
    assert len(ours(pod)) == 2


def test_a_pod_without_the_reference_label_is_not_sent_to_the_webhook(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    body = launcher(started)
    del body["metadata"]["labels"][keys.LABEL_CLAIMS_REF]
    pod = create_pod(kube, namespace, body)
    assert not pod["spec"].get("schedulingGates")
    assert ours(pod) == []


def test_the_gate_is_added_only_when_absent(
    kube: Kube, namespace: str, started: dict[str, Any], replica: Replica
) -> None:
    body = launcher(started, gates=[GATE, {"name": "example.com/other"}])
    pod = create_pod(kube, namespace, body)
    assert pod["spec"]["schedulingGates"] == [GATE, {"name": "example.com/other"}]
    # A reinvocation with the pod as the webhook left it changes nothing.
    answer = replica.review(
        "/mutate-pod",
        {
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:kubevirt:kubevirt-controller"},
            "object": pod,
        },
    )
    assert answer["allowed"] and "patch" not in answer, answer


def test_a_labelled_pod_that_no_vmi_owns_is_refused(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    with pytest.raises(ApiException) as caught:
        create_pod(kube, namespace, launcher(started, owned=False))
    assert refusal(caught.value) == (
        'admission webhook "pod.gpu.cozystack.io" denied the request: pod virt-launcher-vm- '
        "carries the label gpu.cozystack.io/claims=true, which only KubeVirt's virt-launcher "
        "pods of VMIs with GPU claims may carry (the controller does not count their GPU "
        "requests as raw usage); remove the label"
    )


def test_a_dry_run_pod_gets_the_same_answer(
    kube: Kube, namespace: str, started: dict[str, Any]
) -> None:
    pod = create_pod(kube, namespace, launcher(started), dry_run="All")
    assert pod["spec"]["schedulingGates"] == [GATE]
    assert kube.core.list_namespaced_pod(namespace).items == []
