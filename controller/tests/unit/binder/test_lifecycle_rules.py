"""The binder's pure rules beside the model: attachment, conditions, records, raw usage."""

from __future__ import annotations

from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.binder import lifecycle, translate
from cozystack_gpu.binder.translate import VMIState
from cozystack_gpu.keys import Phase, RawNamesPolicy
from cozystack_gpu.model import ClassStatus

NOW = 1_800_000_000.0
GRACE = 120.0


def claim(phase: str | None, attached_to: str | None = None, attached_at: float | None = None,
          **meta: Any) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if attached_to:
        status["attachedTo"] = attached_to
    if attached_at is not None:
        status["attachedAt"] = translate.rfc3339(attached_at)
    return {
        "metadata": {"name": "c", "namespace": "t", "uid": "u-1", "resourceVersion": "7", **meta},
        "spec": {"class": "l40s-24c", "count": 2},
        "status": status,
    }


def vmi(phase: str, node: str | None = "n1") -> VMIState:
    return VMIState("t", "vm", phase, node, ("c",))


def test_bound_claim_becomes_attached_once_its_vmi_runs() -> None:
    change = lifecycle.attachment_change(claim("Bound", "vm", NOW), vmi("Running"), NOW, GRACE)
    assert change is not None and change.phase is Phase.ATTACHED and not change.clear_attachment


@pytest.mark.parametrize("final", ["Succeeded", "Failed"])
def test_attached_claim_returns_to_bound_when_its_vmi_is_final(final: str) -> None:
    change = lifecycle.attachment_change(claim("Attached", "vm", NOW), vmi(final), NOW, GRACE)
    assert change is not None and change.phase is Phase.BOUND and change.clear_attachment


def test_attached_claim_returns_to_bound_when_its_vmi_is_gone() -> None:
    change = lifecycle.attachment_change(claim("Attached", "vm", NOW), None, NOW, GRACE)
    assert change is not None and change.phase is Phase.BOUND and change.reason == "VMIGone"


def test_an_attachment_may_precede_its_vmi_for_the_grace_only() -> None:
    fresh = claim("Bound", "vm", NOW - GRACE + 1)
    assert lifecycle.attachment_change(fresh, None, NOW, GRACE) is None
    stale = claim("Bound", "vm", NOW - GRACE - 1)
    change = lifecycle.attachment_change(stale, None, NOW, GRACE)
    assert change is not None and change.reason == "AttachmentExpired" and change.clear_attachment


def test_a_running_attached_claim_changes_nothing() -> None:
    assert (
        lifecycle.attachment_change(claim("Attached", "vm", NOW), vmi("Running"), NOW, GRACE)
        is None
    )
    assert lifecycle.attachment_change(claim("Bound"), None, NOW, GRACE) is None


def test_vmi_liveness_follows_the_phase_of_the_claim() -> None:
    assert translate.vmi_live(claim("Lost", "vm", NOW), vmi("Running"), NOW, GRACE)
    assert not translate.vmi_live(claim("Lost", "vm", NOW), vmi("Failed"), NOW, GRACE)
    # A Lost claim's VMI existed: gone is gone, whatever the grace says.
    assert not translate.vmi_live(claim("Lost", "vm", NOW), None, NOW, GRACE)
    assert translate.vmi_live(claim("Bound", "vm", NOW), None, NOW, GRACE)
    assert not translate.vmi_live(claim("Bound", "vm", NOW - GRACE), None, NOW, GRACE)


def test_merged_conditions_keep_other_writers_and_transition_times() -> None:
    current = [
        {"type": "Placed", "status": "True", "reason": "Pinned", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Bound", "status": "False", "reason": "BudgetExceeded", "message": "old",
         "lastTransitionTime": "2026-01-02T00:00:00Z"},
    ]  # fmt: skip
    same_status = lifecycle.condition("Bound", False, "InsufficientCapacity", "new", NOW)
    merged = lifecycle.merge_conditions(current, same_status)
    assert merged[0] == current[0]
    assert merged[1]["message"] == "new"
    assert merged[1]["lastTransitionTime"] == "2026-01-02T00:00:00Z", "status did not change"
    flipped = lifecycle.merge_conditions(
        current, lifecycle.condition("Bound", True, "Bound", "x", NOW)
    )
    assert flipped[1]["lastTransitionTime"] == translate.rfc3339(NOW)


def test_a_claim_status_patch_carries_the_resource_version_it_was_decided_on() -> None:
    from cozystack_gpu.model import ClaimInfo

    updated = ClaimInfo("t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n1", bound_at=NOW)
    body = lifecycle.claim_status_patch(claim(None), updated, None)
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["status"] == {
        "phase": "Bound",
        "nodeName": "n1",
        "boundAt": translate.rfc3339(NOW),
    }


def test_class_status_carries_free_numbers_only_and_skips_unchanged_writes() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "h100"}}
    body = lifecycle.class_status_body(obj, ClassStatus(free=5, max_free_per_node=3), NOW)
    assert body is not None
    assert set(body["status"]) == {"free", "maxFreePerNode", "conditions"}
    assert body["status"]["conditions"][0]["status"] == "True"
    obj["status"] = body["status"]
    assert lifecycle.class_status_body(obj, ClassStatus(5, 3), NOW + 60) is None
    empty = lifecycle.class_status_body(obj, ClassStatus(0, 0), NOW)
    assert empty is not None and empty["status"]["conditions"][0]["reason"] == "NoFreeUnits"


@pytest.mark.parametrize(
    ("phase", "template", "wanted"),
    [("Bound", False, True), ("Attached", False, True), ("Lost", False, False),
     (None, False, False), ("Bound", True, False)],
)  # fmt: skip
def test_usage_records_exist_for_ordered_bound_or_attached_claims(
    phase: str | None, template: bool, wanted: bool
) -> None:
    labels = {keys.LABEL_TEMPLATE_CLAIM: "true"} if template else {}
    assert lifecycle.wants_usage_record(claim(phase, labels=labels)) is wanted


def test_a_usage_record_is_owned_by_its_claim_and_counts_its_units() -> None:
    record = lifecycle.usage_record(claim("Bound"))
    owner = record["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("GPUClaim", "c", "u-1")
    assert record["status"]["resources"] == {"gpu.cozystack.io/l40s-24c": "2"}
    assert lifecycle.owned_claim_name(record) == "c"


def test_settings_list_every_gpu_name_once_sorted() -> None:
    data = lifecycle.settings_data(
        ["nvidia.com/B", "nvidia.com/A"], ["nvidia.com/A", "nvidia.com/C"], [" nvidia.com/D "],
        RawNamesPolicy.FORBIDDEN,
    )  # fmt: skip
    assert data == {
        "resourceNames": "nvidia.com/A,nvidia.com/B,nvidia.com/C,nvidia.com/D",
        "rawResourceNames": "forbidden",
    }


def _pod(labels: dict[str, str] | None = None, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "t", "labels": labels or {}},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"resources": {"limits": {"nvidia.com/GH100": "2", "cpu": "500m"}}},
                {"resources": {"requests": {"nvidia.com/GH100": "1"}}},
            ],
        },
        "status": {"phase": phase},
    }


def test_raw_name_pods_take_units_but_claim_pods_and_final_pods_do_not() -> None:
    usage = translate.pod_usage(_pod())
    assert usage is not None and usage.requests == {"nvidia.com/GH100": 3} and usage.node == "n1"
    assert translate.pod_usage(_pod({keys.LABEL_CLAIMS_REF: "true"})) is None
    assert translate.pod_usage(_pod(phase="Succeeded")) is None
    assert translate.sum_usage([usage], frozenset({"nvidia.com/OTHER"})) == {}


@pytest.mark.parametrize(
    ("value", "units"),
    [("8", 8), (4, 4), ("2k", 2000), ("1Ki", 1024), ("3800m", None), ("x", None), (True, None)],
)
def test_whole_quantities(value: Any, units: int | None) -> None:
    assert translate.whole_quantity(value) == units
