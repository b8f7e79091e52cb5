"""Attacks across the tenant boundary (docs/security.md, rows T12 and G2), each made with the
identity the chart gives the attacker, on the real API server with the chart's webhook
configurations in front of one controller replica:

- a tenant admin (the built-in ``admin`` role the chart's claim roles aggregate into, bound
  in its own namespace) reaching into another tenant's namespace: ordering there, starting
  a VM there, or holding a claim of that namespace from its own VM;
- a tenant VM guest, which holds no credential but may reach a replica's webhook port on the
  pod network, forging the AdmissionReview the API server would send, to attach another
  tenant's claim to a VMI that never exists.

For the guest, the replica runs twice: as the default install runs it, where it answers
anyone and a forged review must change nothing and refuse nothing of the other tenant's
(the VMI webhook writes nothing; the binder attaches claims to VMIs that exist), and as a
hoster runs it with ``webhook.clientAuth``, where it answers only callers holding the client
certificate the API server presents to webhooks, on a control plane of its own whose
kube-apiserver has one (--admission-control-config-file; the session's plane has none,
since virt-api's webhooks refuse a certificate they cannot verify).
"""

from __future__ import annotations

import ssl
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Corner, Replica, create_vmi, refusal, serving, vmi_body
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube
from cozystack_gpu_testkit.tenants import as_tenant_admin

pytestmark = pytest.mark.apiserver

ATTACKER = "boundary-tenant-admin"


@pytest.fixture(scope="module")
def replica(
    control_plane: ControlPlane, kube: Kube, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    with serving(control_plane, kube, tmp_path_factory.mktemp("boundary")) as running:
        yield running


@pytest.fixture(scope="module")
def client_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Kube, Replica]]:
    """A control plane whose API server presents a webhook client certificate, and a
    replica that answers only its CA (``--webhook-client-ca``)."""
    with cluster.running(
        crds=[*sorted(cluster.CRD_DIR.glob("*.yaml")), cluster.kubevirt_crds()],
        webhook_client_auth=True,
    ) as plane:
        assert plane.webhook_client_ca is not None
        kube = Kube(plane.api_client())
        args = ("--webhook-client-ca", str(plane.webhook_client_ca))
        with serving(plane, kube, tmp_path_factory.mktemp("client-auth"), args=args) as running:
            yield kube, running


@pytest.fixture
def tenants(kube: Kube, replica: Replica) -> tuple[Kube, str, str, Corner]:
    """The attacker's own namespace, another tenant's, and the attacker as the chart's
    tenant admin of its own namespace only."""
    corner = Corner(kube)
    own, other = corner.name("own"), corner.name("other")
    for namespace in (own, other):
        kube.namespace(namespace, {f"tenant.cozystack.io/{namespace}": ""})
    user = f"{ATTACKER}-{corner.id}"
    attacker = as_tenant_admin(kube.api, user, [own])
    return attacker, own, other, corner


def _denied(call: Any) -> ApiException:
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def test_a_tenant_admin_orders_and_starts_only_in_its_own_namespaces(
    tenants: tuple[Kube, str, str, Corner],
) -> None:
    attacker, own, other, corner = tenants
    node = corner.node("n1", 2)
    gpu_class = corner.gpu_class("h100")
    corner.bound(other, "theirs", gpu_class, node=node)

    # Its own namespace is its own: the order passes RBAC (and the claim webhook).
    corner.order(own, "mine", gpu_class)
    attacker.get_claim(own, "mine")

    ordered = _denied(lambda: attacker.claim(other, "taken", gpu_class, 1))
    assert ordered.status == 403, f"a tenant admin ordered in {other}: {ordered}"
    started = _denied(lambda: create_vmi(attacker, other, vmi_body("vm", {"claims": ["theirs"]})))
    assert started.status == 403, f"a tenant admin started a VMI in {other}: {started}"
    for read in (
        lambda: attacker.get_claim(other, "theirs"),
        lambda: attacker.claims(other),
    ):
        assert _denied(read).status == 403, f"a tenant admin read {other}'s claims"
    deleted = _denied(
        lambda: attacker.custom.delete_namespaced_custom_object(
            keys.GROUP, keys.VERSION, other, keys.PLURAL_CLAIMS, "theirs"
        )
    )
    assert deleted.status == 403, f"a tenant admin deleted {other}'s claim"
    theirs = corner.kube.get_claim(other, "theirs")
    assert "attachedTo" not in (theirs.get("status") or {}), theirs["status"]


def test_a_vmi_holds_only_claims_of_its_own_namespace(
    tenants: tuple[Kube, str, str, Corner],
) -> None:
    """The claims annotation names claims by name alone: they are looked up in the VMI's
    namespace, so another tenant's claim of the same name, or a name shaped as
    ``namespace/name``, never reaches it."""
    attacker, own, other, corner = tenants
    node = corner.node("n1", 2)
    gpu_class = corner.gpu_class("h100")
    corner.bound(other, "theirs", gpu_class, node=node)

    missing = _denied(lambda: create_vmi(attacker, own, vmi_body("vm", {"claims": ["theirs"]})))
    assert (
        f"GPUClaim theirs named in {keys.ANNOTATION_CLAIMS} does not exist in namespace {own}"
        in (refusal(missing))
    ), refusal(missing)
    qualified = _denied(
        lambda: create_vmi(attacker, own, vmi_body("vm2", {"claims": [f"{other}/theirs"]}))
    )
    assert "is not a GPUClaim name" in refusal(qualified), refusal(qualified)
    theirs = corner.kube.get_claim(other, "theirs")
    assert "attachedTo" not in (theirs.get("status") or {}), (
        f"a VMI in {own} took {other}'s claim: {theirs['status']}"
    )


def _forged_review(namespace: str, claim: str) -> dict[str, Any]:
    """The review the API server would send for a VMI (by virt-controller) naming ``claim``."""
    body = vmi_body("forged", {"claims": [claim]})
    body["metadata"].update(namespace=namespace, uid="00000000-0000-0000-0000-00000000f04d")
    group_version = {"group": keys.VMI.group, "version": keys.VMI.version}
    return {
        "kind": {**group_version, "kind": "VirtualMachineInstance"},
        "resource": {**group_version, "resource": keys.VMI.plural},
        "name": "forged",
        "namespace": namespace,
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kubevirt:kubevirt-controller"},
        "object": body,
        "dryRun": False,
    }  # fmt: skip


def test_a_forged_review_in_the_default_install_changes_nothing_and_refuses_nothing(
    replica: Replica, tenants: tuple[Kube, str, str, Corner]
) -> None:
    """SPEC §7: without ``webhook.clientAuth`` anything on the pod network reaches the
    webhook port. A guest posts, again and again, the review for a VMI naming another
    tenant's claim: it gets an answer, which goes only to itself. The claim is not written
    (before, it was attached to a VMI that never exists, and its VM could not start for the
    attachment grace), and that tenant's own start is admitted at once."""
    _attacker, _own, other, corner = tenants
    node = corner.node("n1", 2)
    before = corner.bound(other, "theirs", corner.gpu_class("h100"), node=node)
    for _round in range(3):
        answer = replica.review("/mutate-vmi", _forged_review(other, "theirs"))
        assert answer["uid"], answer  # answered: the port is open in the default install
    theirs = corner.kube.get_claim(other, "theirs")
    assert theirs["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"], (
        f"a forged review wrote {other}'s claim: {theirs.get('status')}"
    )
    started = create_vmi(corner.kube, other, vmi_body("vm", {"claims": ["theirs"]}))
    assert len(started["spec"]["domain"]["devices"]["gpus"]) == 1, started["spec"]


def test_a_guest_cannot_forge_an_admission_review(client_auth: tuple[Kube, Replica]) -> None:
    """A guest that reaches the webhook port sends the review the API server would send for
    a VMI naming another tenant's claim. Without a client certificate of the API server's
    CA it gets no answer, and the claim is not attached; the API server's own calls (the
    dry runs ``serving`` waited on) are answered."""
    kube, replica = client_auth
    corner = Corner(kube)
    other = corner.name("other")
    kube.namespace(other)
    node = corner.node("n1", 2)
    corner.bound(other, "theirs", corner.gpu_class("h100"), node=node)
    forged = _forged_review(other, "theirs")
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        answer = replica.review("/mutate-vmi", forged)
        raise AssertionError(f"the replica answered a caller without a certificate: {answer}")
    theirs = kube.get_claim(other, "theirs")
    assert "attachedTo" not in (theirs.get("status") or {}), (
        f"a forged review attached {other}'s claim: {theirs['status']}"
    )
