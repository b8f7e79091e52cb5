"""The GPUClaim webhook's rules: orders judged by the model at create time, template claims
only as VMI-owned, the spec never changed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu import keys
from cozystack_gpu.admission.claim_rules import (
    SPEC_IMMUTABLE,
    is_template,
    order_refusal,
    template_refusal,
    update_refusal,
    window_label_refusal,
)
from cozystack_gpu.keys import Mode, Phase
from cozystack_gpu.model import ClaimInfo, Reason, Snapshot
from cozystack_gpu.model.types import ClassInfo, Device, NamespaceInfo, NodeInfo

CRD_DIR = Path(keys.__file__).parent / "crds"
H100 = "nvidia.com/GH100_H100"
NOW = 10_000.0


def claim_obj(
    name: str = "c", gpu_class: str = "h100", count: int = 1, **meta: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "tenant-a", **meta},
        "spec": {"class": gpu_class, "count": count},
    }


def snapshot(gpus: int = 2, quota: dict[str, int] | None = None, held: int = 0) -> Snapshot:
    node = NodeInfo("node-1", allocatable={H100: gpus}, devices=tuple([Device(H100, 1)] * gpus))
    tenant = NamespaceInfo(
        "tenant-a", {keys.TENANT_LABEL_PREFIX + "tenant-a": ""}, dict(quota or {})
    )
    claims = [
        ClaimInfo("tenant-a", f"held-{i}", "h100", 1, phase=Phase.BOUND, node="node-1")
        for i in range(held)
    ]
    return Snapshot.build(
        nodes=[node],
        classes=[ClassInfo("h100", Mode.PASSTHROUGH, H100)],
        claims=claims,
        namespaces=[tenant],
    )


def test_an_order_that_fits_is_admitted() -> None:
    assert order_refusal(snapshot(), claim_obj(), NOW) is None


def test_an_order_over_budget_is_refused_with_the_models_message() -> None:
    snap = snapshot(gpus=4, quota={"gpu.cozystack.io/h100": 2}, held=2)
    refusal = order_refusal(snap, claim_obj(), NOW)
    assert refusal is not None
    assert refusal.reason is Reason.BUDGET_EXCEEDED
    assert (
        refusal.message
        == "budget gpu.cozystack.io/h100 of tenant-a (this namespace's own quota) allows 2: "
        "2 in use, the order asks 1 more; the hoster can raise it "
        "(on Cozystack, the platform administrator)"
    )


def test_an_order_above_capacity_is_refused_naming_the_largest_node() -> None:
    refusal = order_refusal(snapshot(gpus=2, held=1), claim_obj(count=2), NOW)
    assert refusal is not None
    assert refusal.reason is Reason.INSUFFICIENT_CAPACITY
    assert refusal.message == "no node serving class h100 has 2 free units; the largest has 1"


def test_an_order_is_judged_as_an_order_whatever_status_it_carries() -> None:
    # A create carrying a forged status is still a new order: it may not skip the budget.
    obj = claim_obj(count=1)
    obj["status"] = {"phase": "Bound", "nodeName": "node-1"}
    snap = snapshot(gpus=4, quota={"gpu.cozystack.io/h100": 1}, held=1)
    refusal = order_refusal(snap, obj, NOW)
    assert refusal is not None and refusal.reason is Reason.BUDGET_EXCEEDED


def test_an_order_of_a_missing_class_is_refused() -> None:
    refusal = order_refusal(snapshot(), claim_obj(gpu_class="a100"), NOW)
    assert refusal is not None
    assert (refusal.reason, refusal.message) == (Reason.CLASS_MISSING, "class a100 does not exist")


def test_a_template_claim_must_be_owned_by_a_vmi() -> None:
    labels = {keys.LABEL_TEMPLATE_CLAIM: "true"}
    owned = claim_obj(
        labels=labels,
        ownerReferences=[{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                          "name": "vm", "uid": "u"}],
    )  # fmt: skip
    assert is_template(owned) and template_refusal(owned) is None
    forged = claim_obj(labels=labels)
    assert template_refusal(forged) == (
        "GPUClaim c is labelled gpu.cozystack.io/template-claim, which marks the claims the "
        "controller creates from a VMI's claimTemplates; such a claim is owned by its "
        "VirtualMachineInstance. Remove the label to order a claim"
    )


def test_the_spec_never_changes_and_says_so_as_the_crd_does() -> None:
    assert update_refusal(claim_obj(), claim_obj(count=2)) == (
        SPEC_IMMUTABLE,
        keys.AdmissionReason.SPEC_IMMUTABLE,
    )
    crd = yaml.safe_load((CRD_DIR / "gpuclaims.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert [r["message"] for r in spec["x-kubernetes-validations"]] == [SPEC_IMMUTABLE]
    assert update_refusal(claim_obj(), claim_obj(finalizers=["x"])) is None


def test_the_template_mark_is_fixed_at_create() -> None:
    labelled = claim_obj(labels={keys.LABEL_TEMPLATE_CLAIM: "true"})
    assert update_refusal(claim_obj(), labelled) == (
        "label gpu.cozystack.io/template-claim cannot be added to or removed from an "
        "existing claim",
        keys.AdmissionReason.TEMPLATE_LABEL_MISUSED,
    )
    assert update_refusal(labelled, claim_obj()) is not None


def test_a_window_claim_must_be_owned_by_the_reservation_of_its_name() -> None:
    """The reservation label skips the order check: only the claim the controller makes at
    a window's start (of the reservation's name, owned by it) may carry it."""
    labels = {keys.LABEL_RESERVATION: "c"}
    owner = {"apiVersion": keys.API_VERSION, "kind": keys.KIND_RESERVATION, "name": "c", "uid": "u"}
    assert window_label_refusal(claim_obj(labels=labels, ownerReferences=[owner])) is None
    forged = window_label_refusal(claim_obj(labels=labels))
    assert forged is not None and forged.startswith(
        "GPUClaim c is labelled gpu.cozystack.io/reservation, which marks the claim the "
        "controller makes when a GPUReservation's window opens"
    )
    other = {**owner, "name": "someone-elses"}
    assert window_label_refusal(claim_obj(labels=labels, ownerReferences=[other])) is not None
    renamed = {keys.LABEL_RESERVATION: "other"}
    assert window_label_refusal(claim_obj(labels=renamed, ownerReferences=[owner])) is not None


def test_the_window_mark_is_fixed_at_create() -> None:
    labelled = claim_obj(labels={keys.LABEL_RESERVATION: "c"})
    assert update_refusal(claim_obj(), labelled) == (
        "label gpu.cozystack.io/reservation cannot be added to or removed from an existing claim",
        keys.AdmissionReason.WINDOW_LABEL_MISUSED,
    )
    assert update_refusal(labelled, claim_obj()) is not None
