"""Every claim carries claim-protection from its creation (SPEC.md §5), as every PVC carries
pvc-protection, on the real kube-apiserver: the chart's MutatingAdmissionPolicy (with
``webhook.mutatingAdmissionPolicy``), rendered as ``helm install`` renders it against a
server that serves MutatingAdmissionPolicy (this plane's does), puts it on whoever creates
the claim. Where a server has no such policy the
claim webhook's mutating half does the same (``test_admission_catalog``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import helm_template
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

SERVED = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
ADMISSION = ("admissionregistration.k8s.io", "v1")
PLURALS = {
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
}


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    """A tenant namespace with the chart's policy in force; its claims are released after."""
    suffix = uuid.uuid4().hex[:8]
    name = f"protect-{suffix}"
    kube.namespace(name)
    objects = helm_template(
        "claim-protection-at-create.yaml",
        "cozy-gpu",
        {"webhook": {"mutatingAdmissionPolicy": True}},
        api_versions=[SERVED],
    )
    assert [o["kind"] for o in objects] == list(PLURALS), "the policy was not rendered"
    for obj in objects:
        obj["metadata"]["name"] += f"-{suffix}"
        if obj["kind"] == "MutatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += f"-{suffix}"
        kube.custom.create_cluster_custom_object(*ADMISSION, PLURALS[obj["kind"]], obj)
    try:
        yield name
    finally:
        for obj in reversed(objects):
            kube.custom.delete_cluster_custom_object(
                *ADMISSION, PLURALS[obj["kind"]], obj["metadata"]["name"]
            )
        for claim in kube.claims(name):
            kube.custom.patch_namespaced_custom_object(
                keys.GROUP, keys.VERSION, name, keys.PLURAL_CLAIMS, claim["metadata"]["name"],
                {"metadata": {"finalizers": None}},
            )  # fmt: skip
        kube.core.delete_namespace(name)


def create(kube: Kube, namespace: str, name: str, finalizers: list[str] | None, **kw: Any) -> Any:
    metadata: dict[str, Any] = {"name": name}
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": metadata,
        "spec": {"class": "h100", "count": 1},
    }
    return kube.custom.create_namespaced_custom_object(
        keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, body, **kw
    )


def test_a_new_claim_carries_claim_protection_beside_its_own_finalizers(
    kube: Kube, namespace: str
) -> None:
    def in_force() -> bool:
        try:
            made = create(kube, namespace, "probe", None, dry_run="All")
        except ApiException:
            return False
        return bool(made["metadata"].get("finalizers"))

    # A new policy takes a moment to reach the API server's admission chain.
    wait_for(in_force, 30, "the claim-protection policy in force")
    plain = create(kube, namespace, "plain", None)
    assert plain["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]
    own = create(kube, namespace, "own", ["example.com/mine"])
    assert own["metadata"]["finalizers"] == ["example.com/mine", keys.FINALIZER_CLAIM]
    already = create(kube, namespace, "already", [keys.FINALIZER_CLAIM])
    assert already["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]
