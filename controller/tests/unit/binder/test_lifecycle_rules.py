"""The binder's pure rules beside the model: attachment, conditions, records, raw usage."""

from __future__ import annotations

from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import attachment as attachment_rules
from cozystack_gpu.binder.rules import (
    claim_status,
    class_status,
    gate,
    node_reports,
    protection,
    records,
)
from cozystack_gpu.keys import Phase, RawNamesPolicy
from cozystack_gpu.model import ClassStatus
from cozystack_gpu.objects import attachment, conditions, launcher, pod_usage, translate
from cozystack_gpu.objects.annotation import TemplateEntry
from cozystack_gpu.objects.translate import VMIState
from cozystack_gpu_testkit.dra_objects import dra_class

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
    change = attachment_rules.attachment_change(
        claim("Bound", "vm", NOW), vmi("Running"), NOW, GRACE
    )
    assert change is not None and change.phase is Phase.ATTACHED and not change.clear_attachment


@pytest.mark.parametrize("final", ["Succeeded", "Failed"])
def test_attached_claim_returns_to_bound_when_its_vmi_is_final(final: str) -> None:
    change = attachment_rules.attachment_change(
        claim("Attached", "vm", NOW), vmi(final), NOW, GRACE
    )
    assert change is not None and change.phase is Phase.BOUND and change.clear_attachment


def test_attached_claim_returns_to_bound_when_its_vmi_is_gone() -> None:
    change = attachment_rules.attachment_change(claim("Attached", "vm", NOW), None, NOW, GRACE)
    assert change is not None and change.phase is Phase.BOUND and change.reason == "VMIGone"


def test_an_attachment_may_precede_its_vmi_for_the_grace_only() -> None:
    fresh = claim("Bound", "vm", NOW - GRACE + 1)
    assert attachment_rules.attachment_change(fresh, None, NOW, GRACE) is None
    stale = claim("Bound", "vm", NOW - GRACE - 1)
    change = attachment_rules.attachment_change(stale, None, NOW, GRACE)
    assert change is not None and change.reason == "AttachmentExpired" and change.clear_attachment


def test_a_running_attached_claim_changes_nothing() -> None:
    assert (
        attachment_rules.attachment_change(claim("Attached", "vm", NOW), vmi("Running"), NOW, GRACE)
        is None
    )
    assert attachment_rules.attachment_change(claim("Bound"), None, NOW, GRACE) is None


def test_vmi_liveness_follows_the_phase_of_the_claim() -> None:
    assert attachment.vmi_live(claim("Lost", "vm", NOW), vmi("Running"), NOW, GRACE)
    assert not attachment.vmi_live(claim("Lost", "vm", NOW), vmi("Failed"), NOW, GRACE)
    # A Lost claim's VMI existed: gone is gone, whatever the grace says.
    assert not attachment.vmi_live(claim("Lost", "vm", NOW), None, NOW, GRACE)
    assert attachment.vmi_live(claim("Bound", "vm", NOW), None, NOW, GRACE)
    assert not attachment.vmi_live(claim("Bound", "vm", NOW - GRACE), None, NOW, GRACE)


def started(uid: str, phase: str = "Running", attachment_id: str = "") -> VMIState:
    """One start (incarnation) of the VM: KubeVirt names every VMI of a VM after the VM."""
    return VMIState("t", "vm", phase, "n1", ("c",), True, uid, attachment_id)


def attached(phase: str, *, uid: str = "", attachment_id: str = "", at: float = NOW) -> Any:
    obj = claim(phase, "vm", at)
    if uid:
        obj["status"]["attachedToUID"] = uid
    if attachment_id:
        obj["status"]["attachmentID"] = attachment_id
    return obj


def test_a_running_vmi_records_its_uid_on_the_attachment_it_was_admitted_with() -> None:
    change = attachment_rules.attachment_change(
        attached("Bound", attachment_id="x1"), started("uid-1", attachment_id="x1"), NOW, GRACE
    )
    assert change is not None and change.phase is Phase.ATTACHED and change.uid == "uid-1"
    body = claim_status.attachment_patch(attached("Bound", attachment_id="x1"), change, NOW)
    assert body["status"]["attachedToUID"] == "uid-1"


def test_a_restart_racing_the_end_of_the_previous_vmi_keeps_the_new_start_attached() -> None:
    """The interleaving of issue 18 item 3, step by step as the binder can see it: the VM's
    first VMI ends, the VM controller creates the next VMI under the same name, whose
    webhook re-attaches the claims, while the binder's view of VMIs still lags."""
    first = started("uid-1", attachment_id="x1")
    confirmed = attached("Attached", uid="uid-1", attachment_id="x1")
    # 1. The first VMI is Succeeded: its attachment ends.
    change = attachment_rules.attachment_change(
        confirmed, started("uid-1", "Succeeded", "x1"), NOW, GRACE
    )
    assert change is not None and change.clear_attachment
    # 2. Before that clear lands, the next VMI's webhook wrote a new attachment (new id, no
    # uid); the view still shows the first VMI, final. The new start is not ended by it.
    rewritten = attached("Attached", attachment_id="x2")
    ended_first = started("uid-1", "Succeeded", "x1")
    assert attachment_rules.attachment_change(rewritten, ended_first, NOW, GRACE) is None
    assert attachment.vmi_live(rewritten, ended_first, NOW, GRACE, NOW)
    # ... nor by the first VMI's being gone from the view, nor by the first VMI still
    # running in a view that lags further behind.
    assert attachment_rules.attachment_change(rewritten, None, NOW, GRACE, NOW) is None
    assert attachment_rules.attachment_change(rewritten, first, NOW, GRACE, NOW) is None
    # 3. The next VMI shows up: its uid is recorded, and the claim stays Attached.
    second = started("uid-2", attachment_id="x2")
    change = attachment_rules.attachment_change(rewritten, second, NOW, GRACE, NOW)
    assert change is not None and not change.clear_attachment and change.uid == "uid-2"
    # 4. From then on only the end of the second VMI ends the attachment: the first one
    # seen in a view that lags (a new leader's first listing) changes nothing, the second
    # one's end does.
    now_second = attached("Attached", uid="uid-2", attachment_id="x2")
    assert attachment_rules.attachment_change(now_second, ended_first, NOW, GRACE) is None
    assert attachment_rules.attachment_change(now_second, second, NOW, GRACE) is None
    change = attachment_rules.attachment_change(now_second, started("uid-2", "Failed"), NOW, GRACE)
    assert change is not None and change.reason == "VMIFinished"


def test_a_confirmed_attachment_ends_when_a_vmi_of_the_name_that_does_not_hold_it_runs() -> None:
    confirmed = attached("Attached", uid="uid-1")
    other = VMIState("t", "vm", "Running", "n1", ("other-claim",), True, "uid-2", "")
    change = attachment_rules.attachment_change(confirmed, other, NOW, GRACE)
    assert change is not None and change.clear_attachment and change.reason == "VMIGone"
    assert not attachment.vmi_live(confirmed, other, NOW, GRACE)


def test_an_unconfirmed_attachment_expires_by_the_binders_clock_too() -> None:
    """attachedAt comes from a webhook replica's clock: one far behind the leader's must not
    make a starting VM's attachment expire at once."""
    behind = attached("Bound", attachment_id="x1", at=NOW - 10 * GRACE)
    assert attachment_rules.attachment_change(behind, None, NOW, GRACE, seen_at=NOW - 1) is None
    change = attachment_rules.attachment_change(behind, None, NOW, GRACE, seen_at=NOW - GRACE - 1)
    assert change is not None and change.reason == "AttachmentExpired"


def test_the_binder_attaches_a_bound_claim_a_live_vmi_names_to_it_by_uid() -> None:
    """The VMI webhook writes nothing: the binder attaches once it sees the VMI stored, by
    uid, in one write that also says Attached."""
    change = attachment_rules.start_attachment(claim("Bound"), started("uid-1"))
    assert change is not None
    assert (change.phase, change.attach_to, change.uid) == (Phase.ATTACHED, "vm", "uid-1")
    body = claim_status.attachment_patch(claim("Bound"), change, NOW)
    assert body["metadata"]["resourceVersion"] == "7", "an attachment must not overwrite a race"
    status = body["status"]
    assert status["phase"] == "Attached"
    assert (status["attachedTo"], status["attachedToUID"]) == ("vm", "uid-1")
    assert status["attachedAt"] == translate.rfc3339(NOW)
    assert status["attachmentID"] is None  # an earlier release's id, cleared


@pytest.mark.parametrize(
    "held, vm",
    [
        pytest.param(claim("Bound", "other"), started("uid-1"), id="attached-to-another-vmi"),
        pytest.param(claim("Bound", "vm"), started("uid-1"), id="attachment-being-replaced"),
        pytest.param(
            claim("Bound", deletionTimestamp="2027-01-01T00:00:00Z"),
            started("uid-1"),
            id="being-deleted",
        ),
        pytest.param(claim("Pending"), started("uid-1"), id="pending"),
        pytest.param(claim("Lost"), started("uid-1"), id="lost"),
        pytest.param(
            claim("Bound", annotations={keys.ANNOTATION_TEMPLATE_VMI_UID: "uid-1"}),
            started("uid-1"),
            id="template-claim",
        ),
        pytest.param(claim("Bound"), started("uid-1", "Succeeded"), id="vmi-ended"),
        pytest.param(claim("Bound"), started(""), id="vmi-without-uid"),
    ],
)
def test_the_binder_attaches_only_a_free_bound_claim_to_a_live_vmi(
    held: dict[str, Any], vm: VMIState
) -> None:
    assert attachment_rules.start_attachment(held, vm) is None


def test_a_restart_after_a_long_run_hands_the_claim_to_the_next_vmi_of_the_name() -> None:
    """Nothing re-attaches at admission any more: the attachment of the VMI that ran ends
    once the view shows the next VMI of the name, and the binder attaches that one."""
    long_ago = NOW - 10 * GRACE
    first = attached("Attached", uid="uid-1", at=long_ago)
    second = started("uid-2")
    change = attachment_rules.attachment_change(first, second, NOW, GRACE, seen_at=long_ago)
    assert change is not None and change.clear_attachment and change.reason == "VMIGone"
    assert not attachment.vmi_live(first, second, NOW, GRACE, long_ago)
    cleared = claim("Bound")
    handed = attachment_rules.start_attachment(cleared, second)
    assert handed is not None and handed.uid == "uid-2"


def test_an_attachment_newer_than_a_lagging_view_waits_for_the_view() -> None:
    """A new leader whose first listing of VMIs is older than its listing of claims sees
    the previous VMI of the name beside an attachment to the next one: within the grace of
    the attachment, or of its first look at it, it waits instead of taking the claim from a
    running VM."""
    second = attached("Attached", uid="uid-2", at=NOW - GRACE - 5)
    lagging = started("uid-1")
    assert attachment_rules.attachment_change(second, lagging, NOW, GRACE, seen_at=NOW) is None
    assert attachment.vmi_live(second, lagging, NOW, GRACE, NOW)
    assert attachment_rules.start_attachment(second, lagging) is None


def test_merged_conditions_keep_other_writers_and_transition_times() -> None:
    current = [
        {"type": "Placed", "status": "True", "reason": "Pinned", "message": "m",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "Bound", "status": "False", "reason": "BudgetExceeded", "message": "old",
         "lastTransitionTime": "2026-01-02T00:00:00Z"},
    ]  # fmt: skip
    same_status = conditions.condition("Bound", False, "InsufficientCapacity", "new", NOW)
    merged = conditions.merge_conditions(current, same_status)
    assert merged[0] == current[0]
    assert merged[1]["message"] == "new"
    assert merged[1]["lastTransitionTime"] == "2026-01-02T00:00:00Z", "status did not change"
    flipped = conditions.merge_conditions(
        current, conditions.condition("Bound", True, "Bound", "x", NOW)
    )
    assert flipped[1]["lastTransitionTime"] == translate.rfc3339(NOW)


def test_a_claim_status_patch_carries_the_resource_version_it_was_decided_on() -> None:
    from cozystack_gpu.model import ClaimInfo

    updated = ClaimInfo("t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n1", bound_at=NOW)
    body = claim_status.claim_status_patch(claim(None), updated, None)
    assert body["metadata"]["resourceVersion"] == "7"
    assert body["status"] == {
        "phase": "Bound",
        "nodeName": "n1",
        "boundAt": translate.rfc3339(NOW),
    }


def test_a_claim_moved_off_the_node_its_pod_was_pinned_to_says_placed_no_more() -> None:
    """A Placed condition tells where the VM's launcher pod was pinned; once the claim is
    moved elsewhere (packing, a rebind) it would name a node the claim no longer holds."""
    from cozystack_gpu.model import ClaimInfo

    pinned = conditions.condition(
        keys.CONDITION_PLACED, True, keys.ClaimReason.PINNED, "pinned to node n2", NOW
    )
    bound = conditions.condition(keys.CONDITION_BOUND, True, "Bound", "holds on n2", NOW)
    obj = claim("Bound")
    obj["status"].update(nodeName="n2", conditions=[bound, pinned])
    moved = conditions.condition(keys.CONDITION_BOUND, True, "Moved", "moved to n1", NOW)
    updated = ClaimInfo("t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n1", bound_at=NOW)
    body = claim_status.claim_status_patch(obj, updated, moved)
    assert [c["type"] for c in body["status"]["conditions"]] == [keys.CONDITION_BOUND]
    # Staying on its node, the claim keeps what its start was told.
    stays = ClaimInfo("t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n2", bound_at=NOW)
    kept = claim_status.claim_status_patch(obj, stays, bound)
    assert [c["type"] for c in kept["status"]["conditions"]] == [
        keys.CONDITION_BOUND,
        keys.CONDITION_PLACED,
    ]


def test_a_rebind_clears_the_migration_target_it_ends_and_other_writes_keep_it() -> None:
    """SPEC §12: a decision whose claim has no migration any more (a Lost claim rebound)
    writes ``migration: null``, or the watch would bring the old target back to count on
    its node; a decision of a migrating claim leaves the field as it is."""
    from cozystack_gpu.model import ClaimInfo, MigrationTarget

    obj = claim("Lost")
    obj["status"].update(nodeName="n2", migration={"node": "n3", "migrationUID": "m", "since": "x"})
    rebound = ClaimInfo("t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n1", bound_at=NOW)
    assert claim_status.claim_status_patch(obj, rebound, None)["status"]["migration"] is None
    migrating = ClaimInfo(
        "t", "c", "l40s-24c", 2, phase=Phase.BOUND, node="n2", bound_at=NOW,
        migration=MigrationTarget("n3", "m", NOW),
    )  # fmt: skip
    assert "migration" not in claim_status.claim_status_patch(obj, migrating, None)["status"]


def test_class_status_carries_free_numbers_only_and_skips_unchanged_writes() -> None:
    obj: dict[str, Any] = {"metadata": {"name": "h100"}}
    body = class_status.class_status_body(obj, ClassStatus(free=5, max_free_per_node=3), NOW)
    assert body is not None
    assert set(body["status"]) == {"free", "maxFreePerNode", "conditions"}
    assert body["status"]["conditions"][0]["status"] == "True"
    obj["status"] = body["status"]
    assert class_status.class_status_body(obj, ClassStatus(5, 3), NOW + 60) is None
    empty = class_status.class_status_body(obj, ClassStatus(0, 0), NOW)
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
    assert records.wants_usage_record(claim(phase, labels=labels)) is wanted


def test_a_usage_record_is_owned_by_its_claim_and_counts_its_units() -> None:
    record = records.usage_record(claim("Bound"))
    owner = record["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("GPUClaim", "c", "u-1")
    assert record["status"]["resources"] == {"gpu.cozystack.io/l40s-24c": "2"}
    assert records.owned_claim_name(record) == "c"


def test_a_usage_records_status_is_written_back_when_edited_or_missing() -> None:
    held = claim("Bound")
    record = records.usage_record(held)
    record["metadata"]["resourceVersion"] = "12"
    assert records.status_repair(record, held) is None, "as it should be: nothing to write"
    missing = {**record, "status": None}
    repair = records.status_repair(missing, held)
    assert repair == {"metadata": {"resourceVersion": "12"}, "status": record["status"]}
    edited = {
        **record,
        "status": {
            **record["status"],
            "resources": {"gpu.cozystack.io/l40s-24c": "0", "extra": "1"},
            "operational": False,
            "note": "edited",
        },
    }
    repair = records.status_repair(edited, held)
    assert repair is not None
    assert repair["metadata"] == {"resourceVersion": "12"}, "only over what was read"
    assert repair["status"] == {
        **record["status"],
        "resources": {"gpu.cozystack.io/l40s-24c": "2", "extra": None},
        "note": None,
    }, "a merge patch: keys that do not belong are removed"


def test_settings_list_every_gpu_name_once_sorted() -> None:
    data = node_reports.settings_data(
        ["nvidia.com/B", "nvidia.com/A", "nvidia.com/A", "nvidia.com/C", " nvidia.com/D "],
        RawNamesPolicy.FORBIDDEN,
    )
    assert data == {
        "resourceNames": "nvidia.com/A,nvidia.com/B,nvidia.com/C,nvidia.com/D",
        "rawResourceNames": "forbidden",
        "draDeviceClasses": "",
    }


def test_settings_list_the_device_classes_of_dra_classes_once() -> None:
    classes = [dra_class("a"), dra_class("b"), {"metadata": {"name": "c"}, "spec": {}}]
    data = node_reports.settings_data([], RawNamesPolicy.FORBIDDEN, classes)
    assert data["draDeviceClasses"] == "vfio.gpu.nvidia.com"


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


def test_raw_name_pods_take_units_whatever_their_labels_but_final_pods_do_not() -> None:
    usage = launcher.raw_usage(_pod())
    assert usage is not None and usage.requests == {"nvidia.com/GH100": 3} and usage.node == "n1"
    labelled = launcher.raw_usage(_pod({keys.LABEL_CLAIMS_REF: "true"}))
    assert labelled is not None and labelled.requests == {"nvidia.com/GH100": 3}
    assert launcher.raw_usage(_pod(phase="Succeeded")) is None
    assert pod_usage.sum_usage([usage], frozenset({"nvidia.com/OTHER"})) == {}


def test_a_launcher_pod_uses_what_its_claims_do_not_cover_on_its_node() -> None:
    pod = _pod({keys.LABEL_CLAIMS_REF: "true"})
    resource_of = {"h100": "nvidia.com/GH100"}.get

    def claim_on(node: str, count: int, phase: str = "Attached") -> dict[str, Any]:
        return {
            "metadata": {"name": "c"},
            "spec": {"class": "h100", "count": count},
            "status": {"phase": phase, "nodeName": node, "attachedTo": "vm"},
        }

    assert pod_usage.claims_cover([claim_on("n1", 2), claim_on("n2", 1)], resource_of, "n1") == {
        "nvidia.com/GH100": 2
    }
    assert pod_usage.claims_cover([claim_on("n1", 2, "Pending")], resource_of, "n1") == {}
    used = launcher.launcher_usage(pod, {"nvidia.com/GH100": 2})
    assert used is not None and used.requests == {"nvidia.com/GH100": 1} and used.node == "n1"
    assert launcher.launcher_usage(pod, {"nvidia.com/GH100": 3}) is None
    assert launcher.launcher_usage(_pod({keys.LABEL_CLAIMS_REF: "true"}, "Failed"), {}) is None
    gated = _pod({keys.LABEL_CLAIMS_REF: "true"})
    del gated["spec"]["nodeName"]
    assert launcher.launcher_usage(gated, {}) is None, "not on a node yet"


@pytest.mark.parametrize(
    ("value", "units"),
    [("8", 8), (4, 4), ("2k", 2000), ("1Ki", 1024), ("3800m", None), ("x", None), (True, None)],
)
def test_whole_quantities(value: Any, units: int | None) -> None:
    assert translate.whole_quantity(value) == units


# --- Pending, finalizers and GPUNode conditions ------------------------------------------


def test_a_waiting_order_shows_the_pending_phase_and_a_waiting_lost_claim_keeps_its_own() -> None:
    cond = conditions.condition(keys.CONDITION_BOUND, False, "InsufficientCapacity", "no room", NOW)
    order = claim(None)
    assert claim_status.waiting_note_due(order, cond)
    assert claim_status.waiting_patch(order, cond)["status"]["phase"] == "Pending"
    lost = claim("Lost")
    assert "phase" not in claim_status.waiting_patch(lost, cond)["status"]
    # Told once: the same reason on a claim that already shows Pending is not written again.
    told = claim("Pending")
    told["status"]["conditions"] = [cond]
    assert not claim_status.waiting_note_due(told, cond)
    assert claim_status.waiting_note_due(told, {**cond, "message": "another reason"})


def test_a_live_class_keeps_its_finalizer_and_a_deleted_one_goes_once_nothing_holds_it() -> None:
    live = {"metadata": {"name": "h100", "resourceVersion": "3"}}
    body = protection.class_protection(live, holding_claims=5)
    assert body == {"metadata": {"resourceVersion": "3", "finalizers": [keys.FINALIZER_CLASS]}}
    deleting = {
        "metadata": {
            "name": "h100",
            "resourceVersion": "4",
            "deletionTimestamp": "2026-11-30T10:00:00Z",
            "finalizers": ["other.example.com/keep", keys.FINALIZER_CLASS],
        }
    }
    assert protection.class_protection(deleting, holding_claims=1) is None
    released = protection.class_protection(deleting, holding_claims=0)
    assert released == {
        "metadata": {"resourceVersion": "4", "finalizers": ["other.example.com/keep"]}
    }


def test_an_attached_claim_is_protected_until_its_vmi_is_final_or_gone() -> None:
    attached = claim("Attached", "vm", NOW)
    assert protection.claim_protection(attached, vmi_live=True) == {
        "metadata": {"resourceVersion": "7", "finalizers": [keys.FINALIZER_CLAIM]}
    }
    protected = claim("Attached", "vm", NOW, finalizers=[keys.FINALIZER_CLAIM])
    assert protection.claim_protection(protected, vmi_live=True) is None
    deleted = claim(
        "Attached", "vm", NOW, finalizers=[keys.FINALIZER_CLAIM],
        deletionTimestamp="2026-11-30T10:00:00Z",
    )  # fmt: skip
    # Deleting an attached claim only marks it while its VMI runs, and says so.
    assert protection.claim_protection(deleted, vmi_live=True) is None
    waits = protection.deletion_waits_condition(deleted, NOW)
    assert waits is not None and waits["reason"] == "WaitingForVMI" and "VMI vm" in waits["message"]
    assert protection.claim_protection(deleted, vmi_live=False) == {
        "metadata": {"resourceVersion": "7", "finalizers": []}
    }
    assert protection.claim_protection(claim("Bound"), vmi_live=False) is None


def test_a_live_claim_keeps_the_protection_it_was_created_with_whatever_its_phase() -> None:
    """Admission puts the finalizer on at create time (as pvc-protection): the binder never
    takes it off a claim that is not deleted, so neither a bind nor a VM's next start has
    to write it again."""
    for phase, attached_to in (("Pending", None), ("Bound", None), ("Bound", "vm"), ("Lost", None)):
        held = claim(phase, attached_to, NOW, finalizers=[keys.FINALIZER_CLAIM])
        assert protection.claim_protection(held, vmi_live=False) is None, phase
        assert protection.claim_protection(held, vmi_live=True) is None, phase


def test_a_deleted_claim_loses_its_protection_once_nothing_uses_it() -> None:
    deleted = {"deletionTimestamp": "2026-11-30T10:00:00Z", "finalizers": [keys.FINALIZER_CLAIM]}
    unattached = claim("Bound", **deleted)
    assert protection.claim_protection(unattached, vmi_live=False) == {
        "metadata": {"resourceVersion": "7", "finalizers": []}
    }
    pending = claim("Pending", **deleted)
    assert protection.claim_protection(pending, vmi_live=False) == {
        "metadata": {"resourceVersion": "7", "finalizers": []}
    }
    # Another controller's finalizer stays where it was.
    shared = claim("Bound", deletionTimestamp="2026-11-30T10:00:00Z",
                   finalizers=["example.com/keep", keys.FINALIZER_CLAIM])  # fmt: skip
    assert protection.claim_protection(shared, vmi_live=False) == {
        "metadata": {"resourceVersion": "7", "finalizers": ["example.com/keep"]}
    }


def _node(ready: bool = True, cordoned: bool = False, state: str | None = None,
          allocatable: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    labels = {keys.LABEL_NODE_LAYOUT_STATE: state} if state else {}
    return {
        "metadata": {"name": "n1", "labels": labels},
        "spec": {"unschedulable": cordoned},
        "status": {
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "allocatable": allocatable if allocatable is not None else {"nvidia.com/A": "2"},
        },
    }


def _gpunode(
    updated: float | None = NOW, names: tuple[str, ...] = ("nvidia.com/A",)
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "devices": [
            {"pciAddress": f"0000:{i + 16:02x}:00.0", "resourceName": n, "allocatable": 1}
            for i, n in enumerate(names)
        ]
    }
    if updated is not None:
        status["updatedAt"] = translate.rfc3339(updated)
    return {"metadata": {"name": "n1"}, "status": status}


@pytest.mark.parametrize(
    ("node", "gpunode", "stale", "ready", "reason"),
    [
        (_node(), _gpunode(), False, "True", "Serving"),
        (None, _gpunode(), False, "False", "NodeGone"),
        (_node(), _gpunode(updated=None), False, "False", "NoInventory"),
        (_node(), _gpunode(updated=NOW - 900), True, "False", "InventoryStale"),
        (_node(ready=False), _gpunode(), False, "False", "NodeNotReady"),
        (_node(cordoned=True), _gpunode(), False, "False", "Cordoned"),
        (_node(state="pending"), _gpunode(), False, "False", "LayoutPending"),
        (_node(state="failed"), _gpunode(), False, "True", "LayoutFailed"),
    ],
)
def test_gpunode_ready_says_whether_and_why_the_node_serves(
    node: dict[str, Any] | None, gpunode: dict[str, Any], stale: bool, ready: str, reason: str
) -> None:
    conds = node_reports.gpunode_conditions(node, gpunode, stale, 300.0, NOW)
    found = {c["type"]: c for c in conds}[keys.CONDITION_READY]
    assert (found["status"], found["reason"]) == (ready, reason)
    assert found["message"]


def test_a_name_kubelet_does_not_advertise_is_reported_not_silently_used() -> None:
    gpunode = _gpunode(names=("nvidia.com/A", "nvidia.com/AD102GL_L40"))
    conds = node_reports.gpunode_conditions(_node(), gpunode, False, 300.0, NOW)
    names = {c["type"]: c for c in conds}[keys.CONDITION_NAMES_ADVERTISED]
    assert (names["status"], names["reason"]) == ("False", "NotAdvertised")
    assert "nvidia.com/AD102GL_L40 (0000:11:00.0)" in names["message"]
    assert "pci.ids" in names["message"]


def test_gpunode_conditions_are_written_only_when_they_change_and_keep_transition_times() -> None:
    gpunode = _gpunode()
    conds = node_reports.gpunode_conditions(_node(), gpunode, False, 300.0, NOW)
    body = node_reports.gpunode_status_patch(gpunode, conds)
    assert body is not None and set(body["status"]) == {"conditions"}
    gpunode["status"]["conditions"] = body["status"]["conditions"]
    later = node_reports.gpunode_conditions(_node(), gpunode, False, 300.0, NOW + 60)
    assert node_reports.gpunode_status_patch(gpunode, later) is None


def test_staleness_needs_a_report_and_a_period() -> None:
    assert translate.inventory_stale(NOW - 301, NOW, 300.0)
    assert not translate.inventory_stale(NOW - 299, NOW, 300.0)
    assert not translate.inventory_stale(None, NOW, 300.0)
    assert not translate.inventory_stale(NOW - 10_000, NOW, 0.0)


def test_a_template_claim_is_protected_while_the_vmi_it_was_made_for_lives() -> None:
    made = claim(None, finalizers=[keys.FINALIZER_CLAIM])  # created, not placed yet
    assert protection.claim_protection(made, vmi_live=False, owner_live=True) is None
    # Its VMI gone, the claim itself is deleted (``template_left_over``); then it goes.
    assert protection.claim_protection(made, vmi_live=False, owner_live=False) is None
    gone = claim(None, finalizers=[keys.FINALIZER_CLAIM], deletionTimestamp="2026-11-30T10:00:00Z")
    assert protection.claim_protection(gone, vmi_live=False, owner_live=False) == {
        "metadata": {"resourceVersion": "7", "finalizers": []}
    }


def test_gpunode_of_a_stale_report_says_its_holds_stay_and_nothing_new_is_placed() -> None:
    conds = node_reports.gpunode_conditions(_node(), _gpunode(updated=NOW - 900), True, 300.0, NOW)
    found = {c["type"]: c for c in conds}[keys.CONDITION_READY]
    assert found["reason"] == "InventoryStale"
    assert "holds stay" in found["message"]
    assert "nothing new is placed" in found["message"]
    assert "serves no class" not in found["message"]


# --- a class withdrawn -------------------------------------------------------------------


def deleting_class() -> dict[str, Any]:
    return {"metadata": {"name": "h100", "deletionTimestamp": translate.rfc3339(NOW)}}


def test_a_deleted_class_says_what_keeps_it_without_counting_claims() -> None:
    # Every authenticated user reads GPUClass (SPEC §3): its status carries no counts but
    # free and maxFreePerNode, so the Deleting condition says claims keep it, not how many.
    body = class_status.class_status_body(deleting_class(), ClassStatus(0, 0), NOW, kept=True)
    assert body is not None
    (cond,) = body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Available", "False", "Deleting")
    assert cond["message"] == (
        "the class is being deleted and takes no new orders; claims still hold units of "
        "this class, and it is removed once none does"
    )
    assert not any(ch.isdigit() for ch in cond["message"]), (
        f"the class's condition leaks claim counts to every user: {cond['message']!r}"
    )
    gone = class_status.class_status_body(deleting_class(), ClassStatus(0, 0), NOW, kept=False)
    assert gone is not None
    assert gone["status"]["conditions"][0]["message"] == (
        "the class is being deleted and takes no new orders; no claim holds its units, so "
        "it goes now"
    )


def test_a_claim_of_a_deleted_class_hears_the_offer_is_withdrawn() -> None:
    held = class_status.withdrawal_condition("h100", Phase.BOUND, NOW)
    assert held["type"] == keys.CONDITION_OFFER_WITHDRAWN
    assert (held["status"], held["reason"]) == ("True", "ClassDeleting")
    assert held["message"] == (
        "class h100 is being deleted: the hoster withdraws this offer; this claim keeps its "
        "units until it is deleted, and once released they cannot be ordered again"
    )
    pending = class_status.withdrawal_condition("h100", Phase.PENDING, NOW)
    assert pending["message"] == (
        "class h100 is being deleted: the hoster withdraws this offer; this order will not be "
        "bound: delete it and order another class"
    )


# --- template claims that outlived their VMI ----------------------------------------------


def _made_for(uid: str, **meta: Any) -> dict[str, Any]:
    """A template claim as the controller makes one for VMI ``vm`` of ``uid``, an hour ago."""
    vmi_obj = {"metadata": {"name": "vm", "namespace": "t", "uid": uid}}
    body = gate.template_claim(vmi_obj, TemplateEntry("gpu", "h100", 1))
    body["metadata"].update({"uid": "c-1", "creationTimestamp": translate.rfc3339(NOW - 3600)})
    body["metadata"].update(meta)
    body["status"] = {"phase": "Bound", "nodeName": "n1"}
    return body


def test_a_template_claim_goes_once_the_vmi_it_was_made_for_is_gone_whatever_its_metadata() -> None:
    """Its owner cut, a second owner added, the label taken off: what it was made for is
    still read from the uid the controller recorded, and the claim goes with that VMI."""
    live = {"vmi-1"}.__contains__
    gone = set[str]().__contains__
    ours = _made_for("vmi-1")
    assert protection.template_left_over(ours, live, NOW, GRACE) is None
    second_owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": "cm-1"}
    cut = [
        _made_for("vmi-1", ownerReferences=None),
        _made_for("vmi-1", ownerReferences=[*ours["metadata"]["ownerReferences"], second_owner]),
        _made_for("vmi-1", labels={}),
    ]
    for claim_obj in [ours, *cut]:
        verdict = protection.template_left_over(claim_obj, gone, NOW, GRACE)
        assert verdict is not None and verdict.delete is not None, (
            f"template claim {claim_obj['metadata']} outlives its VMI: a Bound hold unbilled"
        )
        assert "VMI uid vmi-1, which it was made for, is gone" in verdict.delete
    # Given the next VMI's uid as owner: still the VMI it was made for decides.
    retargeted = _made_for("vmi-1")
    retargeted["metadata"]["ownerReferences"][0]["uid"] = "vmi-2"
    verdict = protection.template_left_over(retargeted, {"vmi-2"}.__contains__, NOW, GRACE)
    assert verdict is not None and verdict.delete is not None
    # Made before the annotation: the controlling owner says; with neither, it names no VMI.
    older = _made_for("vmi-1")
    del older["metadata"]["annotations"]
    assert protection.template_left_over(older, live, NOW, GRACE) is None
    older["metadata"]["ownerReferences"] = []
    verdict = protection.template_left_over(older, live, NOW, GRACE)
    assert verdict is not None and verdict.delete is not None and "names no VMI" in verdict.delete


def test_a_young_template_claim_waits_for_its_vmi_and_an_order_is_never_deleted() -> None:
    gone = set[str]().__contains__
    young = _made_for("vmi-1", creationTimestamp=translate.rfc3339(NOW - 1))
    verdict = protection.template_left_over(young, gone, NOW, GRACE)
    assert verdict is not None and verdict.delete is None
    assert verdict.judge_at == pytest.approx(NOW - 1 + GRACE)
    order = claim("Bound")
    assert protection.template_left_over(order, gone, NOW, GRACE) is None
    deleting = _made_for("vmi-1", deletionTimestamp=translate.rfc3339(NOW))
    assert protection.template_left_over(deleting, gone, NOW, GRACE) is None


def test_the_gate_says_why_a_held_claim_cannot_become_this_vmis() -> None:
    """A tenant's race or delete between admission and the binder's attachment: the
    launcher pod waits, and its VMI hears which claim and why."""
    elsewhere = gate.held_claim_wait("c", claim("Attached", "other"), "vm")
    assert elsewhere is not None and elsewhere[0] == "ClaimAttachedElsewhere"
    assert "attached to VirtualMachineInstance other" in elsewhere[1]
    deleting = gate.held_claim_wait(
        "c", claim("Bound", deletionTimestamp="2027-01-01T00:00:00Z"), "vm"
    )
    assert deleting is not None and deleting[0] == "ClaimBeingDeleted"
    assert deleting[1].startswith("GPUClaim c is being deleted; remove it from the VM's")
    # Its own claim, attached or about to be (a deletion after the attachment waits for it).
    assert gate.held_claim_wait("c", claim("Bound"), "vm") is None
    mine = claim("Attached", "vm", deletionTimestamp="2027-01-01T00:00:00Z")
    assert gate.held_claim_wait("c", mine, "vm") is None
    assert gate.held_claim_wait("c", None, "vm") is None  # the gate says "does not exist"
