"""The VMI webhook judges and writes nothing: against an API stand-in that has no write
call at all (any write would fail the test), a start is answered with its gpus entries, a
refusal with its message, and the claims are left exactly as they were, whoever sent the
review. The binder attaches the claims once the VMI is stored (SPEC §7)."""

from __future__ import annotations

import copy
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.admission import vmi_rules
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handle_vmi import VMIWebhook

H100 = "nvidia.com/GH100_H100"


class ReadOnlyApi:
    """Claims and VMIs in memory, to read; no write call exists."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}
        self.vmis: dict[str, dict[str, Any]] = {}  # VMIs stored, by name

    def claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.claims.get(name)
        return copy.deepcopy(found) if found is not None else None

    def classes(self, *, latest: bool = False) -> dict[str, Any]:
        spec = {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": H100}}}
        return {"h100": {"metadata": {"name": "h100"}, "spec": spec}}

    def namespace_labels(self, name: str) -> dict[str, str]:
        return {}

    def vmi(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.vmis.get(name))


def bound(name: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t", "uid": f"uid-{name}", "resourceVersion": "1"},
        "spec": {"class": "h100", "count": 1},
        "status": {"phase": "Bound", "nodeName": "n1", **status},
    }


def vmi(name: str, *claims: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "t",
            "annotations": {keys.ANNOTATION_CLAIMS: json.dumps({"claims": list(claims)})},
        },
        "spec": {"domain": {"devices": {}}},
    }


@pytest.fixture
def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(4)


def webhook(
    api: ReadOnlyApi, pool: ThreadPoolExecutor, names: frozenset[str] | None = frozenset({H100})
) -> VMIWebhook:
    """The webhook of a replica whose view is synced (GPU names known), or not (None)."""
    return VMIWebhook(api, pool, lambda _name: 8, lambda: names)  # type: ignore[arg-type]


def test_a_start_is_answered_with_one_gpus_entry_per_unit_and_no_claim_changes(
    pool: ThreadPoolExecutor,
) -> None:
    api = ReadOnlyApi(bound("a"), bound("b"))
    before = copy.deepcopy(api.claims)
    admitted = webhook(api, pool).admit(vmi("vm", "a", "b"))
    assert admitted.gpus == [{"name": f"gpu-cozystack-{i}", "deviceName": H100} for i in range(2)]
    assert api.claims == before


def test_a_replica_that_has_not_read_the_cluster_refuses_a_start_retryably(
    pool: ThreadPoolExecutor,
) -> None:
    """Before its first listing a replica knows neither the GPU names nor the node sizes it
    judges a start with: it refuses with "try again"."""
    api = ReadOnlyApi(bound("a"))
    with pytest.raises(Refused) as refused:
        webhook(api, pool, names=None).admit(vmi("vm", "a"))
    assert refused.value.code == 503, "a start was judged without the replica's view"
    assert refused.value.reason == keys.AdmissionReason.REPLICA_NOT_SYNCED
    assert "try again" in refused.value.message


def test_a_claim_another_vmi_holds_is_refused_and_left_to_it(pool: ThreadPoolExecutor) -> None:
    api = ReadOnlyApi(bound("a"), bound("b", attachedTo="other", attachedToUID="uid-o"))
    before = copy.deepcopy(api.claims)
    with pytest.raises(Refused) as refused:
        webhook(api, pool).admit(vmi("vm", "a", "b"))
    assert refused.value.code == 403
    assert refused.value.message.startswith(
        "GPUClaim b is attached to VirtualMachineInstance other"
    )
    assert api.claims == before


def test_a_restart_after_the_previous_vmi_of_the_name_is_gone_is_admitted(
    pool: ThreadPoolExecutor,
) -> None:
    """The VM's previous VMI (same name) ended and is gone, but its attachment is still on
    the claim: the new start is admitted, and the binder replaces the attachment once it
    sees the new VMI stored."""
    api = ReadOnlyApi(bound("a", phase="Attached", attachedTo="vm", attachedToUID="uid-1"))
    before = copy.deepcopy(api.claims)
    assert webhook(api, pool).admit(vmi("vm", "a")).gpus
    assert api.claims == before


def test_a_vmi_of_the_same_name_that_still_exists_is_not_taken_over(
    pool: ThreadPoolExecutor,
) -> None:
    api = ReadOnlyApi(bound("a", phase="Attached", attachedTo="vm", attachedToUID="uid-1"))
    api.vmis["vm"] = {"metadata": {"name": "vm", "uid": "uid-1"}, "status": {"phase": "Running"}}
    with pytest.raises(Refused) as refused:
        webhook(api, pool).admit(vmi("vm", "a"))
    assert refused.value.reason == keys.AdmissionReason.VMI_EXISTS.value
    assert "still exists (Running)" in refused.value.message


def test_a_vmi_that_brings_its_own_attachment_id_is_stored_without_it() -> None:
    """The binder reads an attachment id only to tell which VMI an earlier release's
    attachment belongs to: a VMI may not bring one of its own to pass for another."""
    body = vmi("vm", "a")
    body["metadata"]["annotations"][keys.ANNOTATION_ATTACHMENT_ID] = "x1"
    vmi_rules.set_gpus(body, [{"name": "gpu-cozystack-0", "deviceName": H100}])
    assert keys.ANNOTATION_ATTACHMENT_ID not in body["metadata"]["annotations"]
    assert body["spec"]["domain"]["devices"]["gpus"] == [
        {"name": "gpu-cozystack-0", "deviceName": H100}
    ]
