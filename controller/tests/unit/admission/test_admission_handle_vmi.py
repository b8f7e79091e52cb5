"""The VMI webhook's writes against an API stand-in that enforces resourceVersions and JSON
patch tests as the API server does: races lost to another VMI refuse and take back what was
written, races lost to a harmless change are won on the next try, dry runs write nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jsonpatch
import pytest
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handle_vmi import VMIWebhook

NOW = 1_800_000_000.0
H100 = "nvidia.com/GH100_H100"


class FakeApi:
    """Claims in memory, written as the API server writes them."""

    def __init__(self, *claims: dict[str, Any]) -> None:
        self.claims = {c["metadata"]["name"]: c for c in claims}
        self.vmis: dict[str, dict[str, Any]] = {}  # VMIs stored, by name
        self.rv = 10
        self.writes: list[tuple[str, str]] = []
        # Called before a write reaches the store: another writer acting in between.
        self.before_write: Callable[[str, str], None] = lambda _what, _name: None

    def bump(self, name: str) -> None:
        self.rv += 1
        self.claims[name]["metadata"]["resourceVersion"] = str(self.rv)

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

    def _write(self, what: str, name: str, body: Any, part: str) -> dict[str, Any]:
        self.before_write(what, name)
        current = self.claims[name]
        if isinstance(body, list):
            try:
                changed = jsonpatch.apply_patch(current, body)
            except jsonpatch.JsonPatchTestFailed:
                raise ApiException(status=422, reason="Unprocessable Entity") from None
        else:
            wanted = (body.get("metadata") or {}).get("resourceVersion")
            if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            changed = copy.deepcopy(current)
            for key, value in (body.get(part) or {}).items():
                if value is None:
                    changed.setdefault(part, {}).pop(key, None)
                else:
                    changed.setdefault(part, {})[key] = value
        # The status subresource changes status only, the main resource all but status.
        if part == "status":
            current["status"] = changed.get("status") or {}
        else:
            current["metadata"] = {**changed["metadata"], "resourceVersion": current[
                "metadata"]["resourceVersion"]}  # fmt: skip
        self.bump(name)
        self.writes.append((what, name))
        return copy.deepcopy(current)

    def claim_status(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        return self._write("status", name, body, "status")

    def claim_meta(self, namespace: str, name: str, body: Any) -> dict[str, Any]:
        return self._write("meta", name, body, "metadata")


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
    api: FakeApi, pool: ThreadPoolExecutor, names: frozenset[str] | None = frozenset({H100})
) -> VMIWebhook:
    """The webhook of a replica whose view is synced (GPU names known), or not (None)."""
    return VMIWebhook(api, pool, lambda _name: 8, lambda: NOW, lambda: names)  # type: ignore[arg-type]


def test_a_start_attaches_and_protects_every_held_claim(pool: ThreadPoolExecutor) -> None:
    api = FakeApi(bound("a"), bound("b"))
    api.claims["b"]["metadata"]["finalizers"] = ["example.com/keep"]
    admitted = webhook(api, pool).admit(vmi("vm", "a", "b"), dry_run=False)
    assert admitted.gpus == [{"name": f"gpu-cozystack-{i}", "deviceName": H100} for i in range(2)]
    assert admitted.attachment_id
    for name in ("a", "b"):
        assert api.claims[name]["status"]["attachedTo"] == "vm"
        assert api.claims[name]["status"]["attachmentID"] == admitted.attachment_id
        assert api.claims[name]["status"]["attachedAt"] == "2027-01-15T08:00:00Z"
    assert api.claims["a"]["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]
    assert api.claims["b"]["metadata"]["finalizers"] == ["example.com/keep", keys.FINALIZER_CLAIM]


def test_a_start_of_claims_protected_since_their_creation_writes_only_their_attachments(
    pool: ThreadPoolExecutor,
) -> None:
    """Admission puts the finalizer on every new claim: the start writes one status patch
    per claim and no metadata patch (from 2N writes to N)."""
    api = FakeApi(bound("a"), bound("b"))
    for name in ("a", "b"):
        api.claims[name]["metadata"]["finalizers"] = [keys.FINALIZER_CLAIM]
    webhook(api, pool).admit(vmi("vm", "a", "b"), dry_run=False)
    assert sorted(api.writes) == [("status", "a"), ("status", "b")]


def test_a_replica_that_has_not_read_the_cluster_refuses_a_start_retryably(
    pool: ThreadPoolExecutor,
) -> None:
    """Before its first listing a replica knows neither the GPU names nor the node sizes it
    judges a start with: it refuses with "try again", and attaches nothing."""
    api = FakeApi(bound("a"))
    with pytest.raises(Refused) as refused:
        webhook(api, pool, names=None).admit(vmi("vm", "a"), dry_run=False)
    assert refused.value.code == 503, "a start was judged without the replica's view"
    assert refused.value.reason == keys.AdmissionReason.REPLICA_NOT_SYNCED
    assert "try again" in refused.value.message
    assert api.writes == [], "a replica that cannot judge the start wrote to a claim"


def test_a_dry_run_writes_nothing(pool: ThreadPoolExecutor) -> None:
    api = FakeApi(bound("a"))
    assert webhook(api, pool).admit(vmi("vm", "a"), dry_run=True).gpus
    assert api.writes == []


def test_a_race_lost_to_another_vmi_refuses_and_takes_back_what_was_written(
    pool: ThreadPoolExecutor,
) -> None:
    api = FakeApi(bound("a"), bound("b"))

    def other_vmi_first(what: str, name: str) -> None:
        if what == "status" and name == "b" and "attachedTo" not in api.claims["b"]["status"]:
            api.claims["b"]["status"]["attachedTo"] = "other"
            api.bump("b")

    api.before_write = other_vmi_first
    with pytest.raises(Refused) as refused:
        webhook(api, pool).admit(vmi("vm", "a", "b"), dry_run=False)
    assert refused.value.code == 409
    assert refused.value.message.startswith(
        "GPUClaim b is attached to VirtualMachineInstance other"
    )
    assert api.claims["b"]["status"]["attachedTo"] == "other"
    assert "attachedTo" not in api.claims["a"]["status"]


def test_a_race_lost_to_a_harmless_change_is_won_on_the_next_try(
    pool: ThreadPoolExecutor,
) -> None:
    api = FakeApi(bound("a"))
    told = []

    def binder_notes_first(what: str, name: str) -> None:
        if not told:
            told.append(what)
            api.claims[name]["status"]["conditions"] = [{"type": "Bound", "status": "True"}]
            api.bump(name)

    api.before_write = binder_notes_first
    webhook(api, pool).admit(vmi("vm", "a"), dry_run=False)
    assert api.claims["a"]["status"]["attachedTo"] == "vm"
    assert api.claims["a"]["status"]["conditions"] == [{"type": "Bound", "status": "True"}]
    assert keys.FINALIZER_CLAIM in api.claims["a"]["metadata"]["finalizers"]


def test_a_reinvocation_writes_no_new_attachment(pool: ThreadPoolExecutor) -> None:
    api = FakeApi(bound("a"))
    first = webhook(api, pool).admit(vmi("vm", "a"), dry_run=False)
    writes = len(api.writes)
    again = vmi("vm", "a")
    again["metadata"]["annotations"][keys.ANNOTATION_ATTACHMENT_ID] = first.attachment_id
    second = webhook(api, pool).admit(again, dry_run=False)
    assert second.attachment_id == first.attachment_id
    assert len(api.writes) == writes


def test_a_restart_replaces_the_attachment_of_the_previous_vmi_of_the_name(
    pool: ThreadPoolExecutor,
) -> None:
    """The VM's previous VMI (same name) ended and is gone, but its attachment is still on
    the claim: the new start writes its own (new id, the old uid removed), so no late clear
    of the old one can take the claim from the new VMI."""
    api = FakeApi(bound("a", attachedTo="vm", attachedToUID="uid-1", attachmentID="x1"))
    api.claims["a"]["metadata"]["finalizers"] = [keys.FINALIZER_CLAIM]
    admitted = webhook(api, pool).admit(vmi("vm", "a"), dry_run=False)
    status = api.claims["a"]["status"]
    assert status["attachedTo"] == "vm" and "attachedToUID" not in status
    assert status["attachmentID"] == admitted.attachment_id != "x1"


def test_a_vmi_of_the_same_name_that_still_exists_is_not_taken_over(
    pool: ThreadPoolExecutor,
) -> None:
    api = FakeApi(bound("a", attachedTo="vm", attachedToUID="uid-1", attachmentID="x1"))
    api.vmis["vm"] = {"metadata": {"name": "vm", "uid": "uid-1"}, "status": {"phase": "Running"}}
    with pytest.raises(Refused) as refused:
        webhook(api, pool).admit(vmi("vm", "a"), dry_run=False)
    assert refused.value.reason == keys.AdmissionReason.VMI_EXISTS.value
    assert "still exists (Running)" in refused.value.message
    assert api.writes == []


def test_a_set_changed_by_a_lost_race_is_judged_again_whole(pool: ThreadPoolExecutor) -> None:
    """After a lost race the webhook judges the set as it is now: a claim the binder moved to
    another node meanwhile splits the set, which is refused, not admitted on the old read."""
    api = FakeApi(bound("a"), bound("b"))

    def binder_moves_b(what: str, name: str) -> None:
        if name == "b" and api.claims["b"]["status"]["nodeName"] == "n1":
            api.claims["b"]["status"]["nodeName"] = "n2"
            api.bump("b")

    api.before_write = binder_moves_b
    with pytest.raises(Refused) as refused:
        webhook(api, pool).admit(vmi("vm", "a", "b"), dry_run=False)
    assert refused.value.reason == keys.AdmissionReason.CLAIMS_ON_SEVERAL_NODES.value
    assert "attachedTo" not in api.claims["a"]["status"]
