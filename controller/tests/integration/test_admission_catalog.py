"""The GPUClaim and GPUClass webhooks, called by the real kube-apiserver over HTTPS: an order
that does not fit is refused at create time with the model's message (dry runs alike), the
spec never changes, template claims are the controller's, and two classes share a resource
name only on disjoint nodes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Corner, Replica, bind, create_vmi, refusal, serving, vmi_body
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

CLAIM_HOOK = 'admission webhook "gpuclaim.gpu.cozystack.io" denied the request: '
CLASS_HOOK = 'admission webhook "gpuclass.gpu.cozystack.io" denied the request: '


@pytest.fixture(scope="module")
def replica(
    control_plane: Any, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    with serving(control_plane, kube, tmp_path_factory.mktemp("admission")) as running:
        yield running


@pytest.fixture
def corner(kube: Kube, replica: Replica) -> Corner:
    return Corner(kube)


def order(kube: Kube, namespace: str, name: str, gpu_class: str, count: int = 1, **kw: Any) -> Any:
    return kube.custom.create_namespaced_custom_object(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_CLAIMS,
        {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": name, **kw.pop("metadata", {})},
            "spec": {"class": gpu_class, "count": count},
        },
        **kw,
    )


def refused_order(kube: Kube, namespace: str, name: str, gpu_class: str, count: int = 1) -> str:
    """The refusal of an order, once the replica's watches show what the test wrote (each
    try is a dry run, so an order admitted by a lagging replica leaves nothing behind)."""
    found: list[str] = []

    def refused() -> bool:
        try:
            order(kube, namespace, name, gpu_class, count, dry_run="All")
        except ApiException as exc:
            found[:] = [refusal(exc)]
            return True
        return False

    wait_for(refused, 15, f"order {name} to be refused")
    with pytest.raises(ApiException) as real:
        order(kube, namespace, name, gpu_class, count)
    assert refusal(real.value) == found[0]
    return found[0]


def absent(kube: Kube, namespace: str, name: str) -> bool:
    try:
        kube.get_claim(namespace, name)
    except ApiException as exc:
        return exc.status == 404
    return False


# --- orders ------------------------------------------------------------------------------


def test_an_order_over_budget_is_refused_at_create_with_the_models_message(
    kube: Kube, corner: Corner, namespace: str, tenant_admin: Kube
) -> None:
    node = corner.node("n1", 4)
    gpu_class = corner.gpu_class("l40s")
    kube.quota(namespace, {keys.quota_key(gpu_class): 2})
    corner.bound(namespace, "a", gpu_class, node=node)
    corner.bound(namespace, "b", gpu_class, node=node)
    # The tenant admin's role lets it create claims: the webhook, not RBAC, refuses this.
    assert refused_order(tenant_admin, namespace, "c", gpu_class) == (
        f"{CLAIM_HOOK}budget gpu.cozystack.io/{gpu_class} of {namespace} (this namespace's own "
        "quota) allows 2: 2 in use, the order asks 1 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)"
    )
    assert absent(kube, namespace, "c")


def test_an_order_above_capacity_is_refused_and_a_dry_run_that_fits_writes_nothing(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 2)
    gpu_class = corner.gpu_class("h100")
    corner.bound(namespace, "a", gpu_class, node=node)
    assert refused_order(kube, namespace, "big", gpu_class, 2) == (
        f"{CLAIM_HOOK}no node serving class {gpu_class} has 2 free units; the largest has 1"
    )
    answer = order(kube, namespace, "small", gpu_class, 1, dry_run="All")
    assert answer["metadata"]["name"] == "small"
    assert absent(kube, namespace, "small")


def test_an_order_no_node_serves_is_refused(kube: Kube, corner: Corner, namespace: str) -> None:
    gpu_class = corner.gpu_class("h100")
    # Every node of the shared cluster is counted by the rule that leaves it out.
    refused = refused_order(kube, namespace, "a", gpu_class)
    assert refused.startswith(f"{CLAIM_HOOK}no node serves class {gpu_class}: of "), refused
    assert "do not match its nodeSelector" in refused or "does not match" in refused


def test_an_order_of_a_missing_class_is_refused(
    kube: Kube, replica: Replica, namespace: str
) -> None:
    with pytest.raises(ApiException) as caught:
        order(kube, namespace, "a", "no-such-class")
    assert refusal(caught.value) == f"{CLAIM_HOOK}class no-such-class does not exist"


def test_the_spec_cannot_change_and_the_webhook_says_what_the_crd_says(
    kube: Kube, corner: Corner, namespace: str, replica: Replica
) -> None:
    node = corner.node("n1", 2)
    gpu_class = corner.gpu_class("h100")
    before = corner.bound(namespace, "a", gpu_class, node=node)
    with pytest.raises(ApiException) as caught:
        kube.custom.patch_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, "a", {"spec": {"count": 2}}
        )
    assert "spec is immutable; delete the claim and order a new one" in refusal(caught.value)
    # The CRD's rule answers first; the webhook's own answer to the same update agrees.
    after = {**before, "spec": {**before["spec"], "count": 2}}
    answer = replica.review(
        "/validate-gpuclaim",
        {
            "kind": {"group": keys.GROUP, "version": keys.VERSION, "kind": keys.KIND_CLAIM},
            "resource": {
                "group": keys.GROUP,
                "version": keys.VERSION,
                "resource": keys.PLURAL_CLAIMS,
            },
            "namespace": namespace,
            "name": "a",
            "operation": "UPDATE",
            "userInfo": {"username": "tenant"},
            "object": after,
            "oldObject": before,
        },
    )
    assert not answer["allowed"]
    assert answer["status"]["message"] == "spec is immutable; delete the claim and order a new one"


def test_metadata_updates_of_a_claim_pass(kube: Kube, corner: Corner, namespace: str) -> None:
    node = corner.node("n1", 1)
    corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    kube.custom.patch_namespaced_custom_object(
        keys.GROUP,
        keys.VERSION,
        namespace,
        keys.PLURAL_CLAIMS,
        "a",
        {"metadata": {"finalizers": [keys.FINALIZER_CLAIM], "labels": {"team": "ml"}}},
    )
    assert kube.get_claim(namespace, "a")["metadata"]["labels"] == {"team": "ml"}


# --- template claims ---------------------------------------------------------------------


def test_a_template_claim_owned_by_a_vmi_skips_the_capacity_check(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    gpu_class = corner.gpu_class("h100")  # no node serves it: an order would be refused
    owner = create_vmi(kube, namespace, vmi_body("vm", labelled=False))
    metadata = {
        "labels": {keys.LABEL_TEMPLATE_CLAIM: "true"},
        "ownerReferences": [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": "vm",
                "uid": owner["metadata"]["uid"],
            }
        ],
    }
    created = order(kube, namespace, "vm-gpu", gpu_class, metadata=metadata)
    assert created["metadata"]["labels"] == {keys.LABEL_TEMPLATE_CLAIM: "true"}


def test_a_template_claim_without_its_vmi_is_refused(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    gpu_class = corner.gpu_class("h100")
    metadata = {"labels": {keys.LABEL_TEMPLATE_CLAIM: "true"}}
    with pytest.raises(ApiException) as caught:
        order(kube, namespace, "sneaky", gpu_class, metadata=metadata)
    assert refusal(caught.value) == (
        f"{CLAIM_HOOK}GPUClaim sneaky is labelled gpu.cozystack.io/template-claim, which marks "
        "the claims the controller creates from a VMI's claimTemplates; such a claim is owned "
        "by its VirtualMachineInstance. Remove the label to order a claim"
    )


def test_the_template_mark_cannot_be_added_later(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 1)
    corner.bound(namespace, "a", corner.gpu_class("h100"), node=node)
    with pytest.raises(ApiException) as caught:
        kube.custom.patch_namespaced_custom_object(
            keys.GROUP,
            keys.VERSION,
            namespace,
            keys.PLURAL_CLAIMS,
            "a",
            {"metadata": {"labels": {keys.LABEL_TEMPLATE_CLAIM: "true"}}},
        )
    assert refusal(caught.value) == (
        f"{CLAIM_HOOK}label gpu.cozystack.io/template-claim cannot be added to or removed "
        "from an existing claim"
    )


# --- classes -----------------------------------------------------------------------------


def test_two_classes_share_a_resource_name_only_on_disjoint_nodes(
    kube: Kube, corner: Corner
) -> None:
    resource = corner.resource("L40S")
    pool_a = {**corner.selector, "pool": "a"}
    first = corner.gpu_class("first", resource, selector=pool_a)
    second = corner.name("second")
    with pytest.raises(ApiException) as caught:
        kube.gpu_class(second, resource, selector={**corner.selector, "zone": "x"})
    assert refusal(caught.value) == (
        f"{CLASS_HOOK}GPUClass {second}: resourceName {resource} is already served by "
        f"GPUClass {first} on overlapping nodes; two classes may share a resourceName only "
        "when their nodeSelectors do not overlap"
    )
    third = corner.gpu_class("third", resource, selector={**corner.selector, "pool": "b"})
    # An update that makes the selectors overlap is refused too.
    with pytest.raises(ApiException) as moved:
        kube.custom.patch_cluster_custom_object(
            keys.GROUP,
            keys.VERSION,
            keys.PLURAL_CLASSES,
            third,
            {"spec": {"nodeSelector": {"pool": "a"}}},
        )
    assert f"GPUClass {third}: resourceName {resource} is already served by GPUClass {first}" in (
        refusal(moved.value)
    )


def test_a_class_is_judged_against_classes_applied_just_before_it(
    kube: Kube, corner: Corner
) -> None:
    # Read from the API server, not a watch: the second apply sees the first at once.
    resource = corner.resource("H100")
    corner.gpu_class("one", resource)
    with pytest.raises(ApiException):
        corner.gpu_class("two", resource)


def test_a_bound_claim_counts_at_once_for_the_next_order(
    kube: Kube, corner: Corner, namespace: str
) -> None:
    node = corner.node("n1", 1)
    gpu_class = corner.gpu_class("h100")
    corner.order(namespace, "a", gpu_class)
    bind(kube, namespace, "a", node)
    assert "has 1 free unit; the largest has 0" in refused_order(kube, namespace, "b", gpu_class)
