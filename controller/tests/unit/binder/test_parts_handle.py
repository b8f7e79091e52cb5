"""The binder's parts (the gate, the reports) against a fake handle and a recording writer:
what each decides and writes, with no API server and no binder loop (binder/parts/handle.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer, Call, CallKey, Outcome
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.reports import (
    ClassStatus,
    RecordCreate,
    RecordDelete,
    RecordStatus,
    Settings,
)
from cozystack_gpu.binder.calls.start_path import ClaimCreate, PodPin, VmiDelete
from cozystack_gpu.binder.parts.attachments import Attachments
from cozystack_gpu.binder.parts.gatekeeper import Gatekeeper
from cozystack_gpu.binder.parts.publisher import SETTINGS_REFRESH_S, Publisher
from cozystack_gpu.binder.parts.waiting_notes import WaitingNotes
from cozystack_gpu.binder.rules import records
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import Action, ClaimInfo, ClaimKey, Reason, Refusal, Snapshot, Step
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit.objects import binder_config

NS, RES, NOW = "tenant-a", "nvidia.com/X", 1_800_000_000.0


@dataclass
class FakeHandle:
    """What the binder hands its parts (binder.parts.handle.PartHandle), over a real view and
    snapshot built from hand-made objects: every call a part sends is recorded, none is
    sent, and each stays out until the test answers it (``answer``)."""

    view: ClusterView
    snapshot: Snapshot
    config: Config
    out: set[ClaimKey] = field(default_factory=set)
    decided: list[tuple[ClaimInfo, Decision]] = field(default_factory=list)
    sent: list[Call] = field(default_factory=list)
    events: list[tuple[str, str]] = field(default_factory=list)  # (object name, reason)
    unanswered: list[Call] = field(default_factory=list)
    vacating: set[str] = field(default_factory=set)  # nodes a move off is out for (the loop's)

    def clock(self) -> float:
        return NOW

    def in_flight(self, keys_: Any) -> bool:
        return any(k in self.out for k in keys_)

    def decide(self, claim: ClaimInfo, call: Decision) -> bool:
        if claim.key in self.out:
            return False
        self.snapshot.upsert_claim(claim)
        self.decided.append((claim, call))
        self.out.add(claim.key)
        self.send(call)
        return True

    def send(self, call: Call) -> None:
        self.sent.append(call)
        self.unanswered.append(call)

    def writing(self, key: CallKey) -> bool:
        return any(c.key == key for c in self.unanswered)

    def vacated_in_flight(self, node: str | None) -> bool:
        return node in self.vacating

    def event(self, obj: Any, reason: str, message: str, warning: bool, **kw: Any) -> None:
        self.events.append((str(obj["metadata"]["name"]), reason))

    def answer(
        self, call: Call, outcome: Outcome, error: str = "", code: int | None = None
    ) -> None:
        """The API's answer, as the loop takes it: the call is no longer out and the part
        that keeps books on it is told."""
        self.unanswered.remove(call)
        if call.heard is not None:
            call.heard(Answer(call, outcome, error=error, code=code))

    def of(self, kind: type[Call]) -> list[Any]:
        return [c for c in self.sent if isinstance(c, kind)]


def _meta(name: str, namespace: str = "", **more: Any) -> dict[str, Any]:
    found = {"name": name, "resourceVersion": "1", "uid": f"uid-{name}", **more}
    if namespace:
        found["namespace"] = namespace
    return found


def _objects(claim_status: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    return {
        keys.NODE.kind: [
            {
                "metadata": _meta("n1", labels={"kubernetes.io/hostname": "n1"}),
                "spec": {},
                "status": {
                    "allocatable": {RES: "2"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            }
        ],
        keys.GPU_NODE.kind: [
            {
                "metadata": _meta("n1"),
                "status": {"devices": [{"resourceName": RES, "allocatable": 2}]},
            }
        ],
        keys.GPU_CLASS.kind: [
            {
                "metadata": _meta("h100"),
                "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": RES}}},
            }
        ],
        keys.NAMESPACE.kind: [{"metadata": _meta(NS, labels={f"tenant.cozystack.io/{NS}": ""})}],
        keys.GPU_CLAIM.kind: [
            {
                "metadata": _meta("c", namespace=NS, creationTimestamp="2026-12-01T10:00:00Z"),
                "spec": {"class": "h100", "count": 1},
                "status": claim_status,
            }
        ],
        keys.VMI.kind: [
            {
                "metadata": _meta(
                    "vm",
                    namespace=NS,
                    labels=labels,
                    annotations={keys.ANNOTATION_CLAIMS: json.dumps({"claims": ["c"]})},
                ),
                "spec": {},
                "status": {"phase": "Scheduling"},
            }
        ],
        keys.POD.kind: [_gated_launcher("vm")],
    }


def _gated_launcher(vmi: str, units: int = 1) -> dict[str, Any]:
    """VMI ``vmi``'s launcher pod as virt-controller makes it and the webhook gates it,
    asking for ``units`` of RES."""
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": vmi,
             "uid": f"uid-{vmi}", "controller": True}  # fmt: skip
    return {
        "metadata": _meta(
            f"virt-launcher-{vmi}", namespace=NS, labels=labels, ownerReferences=[owner]
        ),
        "spec": {
            "containers": [{"name": "compute", "resources": {"limits": {RES: str(units)}}}],
            "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
        },
        "status": {"phase": "Pending"},
    }


def _handle(
    claim_status: dict[str, Any],
    *,
    cordoned: bool = False,
    change: Callable[[dict[str, list[dict[str, Any]]]], None] = lambda _given: None,
) -> FakeHandle:
    config = binder_config("ctl")
    watched = keys.BINDER_WATCHES + ((keys.WORKLOAD,) if config.workload_records else ())
    view = ClusterView(config, watched)
    given = _objects(claim_status)
    given[keys.NODE.kind][0]["spec"]["unschedulable"] = cordoned
    change(given)
    for kind in view.kinds:
        view.relist(kind, given.get(kind, []))
    view.refresh_staleness(NOW)
    return FakeHandle(view, view.build_snapshot(NOW), config)


BOUND = {"phase": "Bound", "nodeName": "n1", "boundAt": "2026-12-01T10:00:01Z"}
# A held claim as the start finds it: attached to the VMI and protected.
ATTACHED = {**BOUND, "phase": "Attached", "attachedTo": "vm"}


def _protected(given: dict[str, list[dict[str, Any]]]) -> None:
    given[keys.GPU_CLAIM.kind][0]["metadata"]["finalizers"] = [keys.FINALIZER_CLAIM]


KEY = ClaimKey(NS, "c")


def _conditions(call: Any) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in call.body["status"]["conditions"]}


def test_the_gate_pins_a_gated_pod_whose_claims_are_bound_on_one_node() -> None:
    handle = _handle(ATTACHED, change=_protected)
    Gatekeeper(handle).run(NOW)
    [pin] = handle.of(PodPin)
    assert (pin.namespace, pin.name) == (NS, "virt-launcher-vm")
    assert pin.body["metadata"] == {"resourceVersion": "1"}, "written over the pod it read"
    assert pin.body["spec"]["schedulingGates"] is None, "the gate goes in the same update"
    terms = pin.body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
    ], "pinned to the claims' node by name"
    [placed] = handle.of(ClaimNote)
    assert placed.note is Note.PLACED and _conditions(placed)["Placed"]["reason"] == "Pinned"
    assert handle.decided == [], "the claims stay where they are"


def _surplus(given: dict[str, list[dict[str, Any]]]) -> None:
    """KubeVirt added a request for a network whose NetworkAttachmentDefinition names the
    class's resource: the launcher pod asks 2 units where its claim covers 1."""
    [pod] = given[keys.POD.kind]
    pod["spec"]["containers"][0]["resources"] = {"limits": {RES: "2"}, "requests": {RES: "2"}}


def test_the_gate_keeps_a_pod_asking_more_gpus_than_its_claims_cover_gated() -> None:
    handle = _handle(BOUND, change=_surplus)
    Gatekeeper(handle).run(NOW)
    assert handle.of(PodPin) == [], "a pod asking 2 units for a 1-unit claim started"
    [note] = handle.of(ClaimNote)
    assert (note.namespace, note.name, note.note) == (NS, "c", Note.PLACED)
    placed = _conditions(note)["Placed"]
    beyond = keys.ClaimReason.REQUESTS_BEYOND_CLAIMS.value
    assert (placed["status"], placed["reason"]) == ("False", beyond)
    assert RES in placed["message"]
    assert ("vm", keys.EventReason.SET_NOT_PLACED.value) in handle.events


def _forged_older(given: dict[str, list[dict[str, Any]]]) -> None:
    """A tenant's pod naming the VMI by uid, older than the launcher pod."""
    [pod] = given[keys.POD.kind]
    pod["metadata"]["creationTimestamp"] = "2026-12-01T10:00:05Z"
    forged = json.loads(json.dumps(pod))
    forged["metadata"].update(name="forged", creationTimestamp="2026-12-01T10:00:02Z")
    given[keys.POD.kind].append(forged)


def test_the_gate_pins_only_the_one_launcher_pod_of_a_vmi() -> None:
    def forged_and_protected(given: dict[str, list[dict[str, Any]]]) -> None:
        _forged_older(given)
        _protected(given)

    handle = _handle(ATTACHED, change=forged_and_protected)
    Gatekeeper(handle).run(NOW)
    assert [p.name for p in handle.of(PodPin)] == ["forged"], "two pods pinned under one set"
    assert ("vm", keys.EventReason.SET_NOT_PLACED.value) in handle.events


@pytest.mark.parametrize(
    ("status", "protected"),
    [(BOUND, True), ({**BOUND, "attachedTo": "vm"}, True), (ATTACHED, False)],
    ids=["not attached", "attached, not yet confirmed", "not protected"],
)
def test_a_held_claim_not_attached_and_protected_keeps_its_vms_pod_gated(
    status: dict[str, Any], protected: bool
) -> None:
    # The fault suite's slow API server: a VM ran while its claim had no claim-protection
    # finalizer (the pin had gone out before the finalizer's write), so it could have been
    # deleted from under the VM. The pin waits for both.
    handle = _handle(status, change=_protected if protected else lambda _given: None)
    Gatekeeper(handle).run(NOW)
    assert handle.of(PodPin) == [], "pinned before its held claim was attached and protected"


def test_the_gate_binds_a_pending_claim_of_a_starting_set_and_pins_only_once_it_is_written() -> (
    None
):
    handle = _handle({"phase": "Pending"})
    Gatekeeper(handle).run(NOW)
    [(decided, call)] = handle.decided
    assert (decided.key, decided.phase, decided.node, call.step) == (KEY, Phase.BOUND, "n1", "Bind")
    assert call.body["metadata"] == {"resourceVersion": "1"}, "written over the claim it read"
    assert (call.body["status"]["phase"], call.body["status"]["nodeName"]) == ("Bound", "n1")
    assert _conditions(call)["Bound"]["reason"] == "Bound"
    assert handle.snapshot.claim(KEY) == decided, "recorded in the snapshot when sent"
    assert handle.of(PodPin) == [], "pinned once the API confirms the bind"


def _one_template(given: dict[str, list[dict[str, Any]]]) -> None:
    """The VM asks one template claim and holds none."""
    [vmi] = given[keys.VMI.kind]
    entry = {"name": "gpu", "class": "h100", "count": 1}
    vmi["metadata"]["annotations"][keys.ANNOTATION_CLAIMS] = json.dumps({"claimTemplates": [entry]})
    given[keys.GPU_CLAIM.kind] = []


def test_a_template_claim_refused_as_invalid_is_not_sent_again_but_said() -> None:
    # A name the API server can never accept looped the leader: about 360 refused creates a
    # second, each logged (issue 41). The same body gets the same 422.
    handle = _handle(BOUND, change=_one_template)
    gatekeeper = Gatekeeper(handle)
    gatekeeper.run(NOW)
    [create] = handle.of(ClaimCreate)
    handle.answer(create, Outcome.FAILED, "422 Unprocessable Entity", code=422)
    for _turn in range(5):
        gatekeeper.run(NOW)
    assert handle.of(ClaimCreate) == [create], "sent once, never again as it is"
    assert handle.events == [("vm", "GPUSetNotPlaced")], "said once, on the VMI"
    # A create that failed for another reason (the server away) is sent again.
    other = _handle(BOUND, change=_one_template)
    keeper = Gatekeeper(other)
    keeper.run(NOW)
    [first] = other.of(ClaimCreate)
    other.answer(first, Outcome.FAILED, "MaxRetryError")
    keeper.run(NOW)
    assert len(other.of(ClaimCreate)) == 2


def test_the_gate_touches_no_set_whose_claim_has_a_write_out() -> None:
    handle = _handle({"phase": "Pending"})
    handle.out.add(KEY)
    Gatekeeper(handle).run(NOW)
    assert handle.decided == [] and handle.sent == []


def test_a_decision_about_a_claim_with_a_write_out_is_refused_by_the_handle() -> None:
    """The rule lives in ``decide``, not at each call site: a part that forgot to ask
    ``in_flight`` still cannot send a second placement over the first."""
    handle = _handle({"phase": "Pending"})
    Gatekeeper(handle).run(NOW)
    [(claim, _call)] = handle.decided
    again = Decision(NS, "c", {"status": {}}, "Bind")
    assert handle.decide(claim, again) is False
    assert again not in handle.sent


def test_a_set_told_it_cannot_start_is_told_again_when_that_note_was_refused() -> None:
    """The note lost a race (409: another write of the claim's, such as a rejection kept
    against the VM, came first): the next pass says it again, over the claim as it is then.
    Found by the lifecycle fuzz on the real virt-controller: a VM's next template claim was
    left with no phase and no reason for good."""
    handle = _handle({"phase": "Pending"}, cordoned=True)
    gate = Gatekeeper(handle)
    gate.run(NOW)
    [note] = handle.of(ClaimNote)
    assert note.note is Note.PLACED and note.body["status"]["phase"] == "Pending"
    assert _conditions(note)["Placed"]["status"] == "False"
    gate.run(NOW + 1)
    assert handle.of(ClaimNote) == [note], "said once while it stands"
    handle.answer(note, Outcome.CONFLICT, "409 Conflict")
    gate.run(NOW + 2)
    assert len(handle.of(ClaimNote)) == 2, "told again after the refusal"
    again = _conditions(handle.of(ClaimNote)[1])["Placed"]
    assert (again["reason"], again["message"]) == (
        _conditions(note)["Placed"]["reason"],
        _conditions(note)["Placed"]["message"],
    ), "the same reason, said again"


def test_the_reports_write_the_class_status_and_the_settings() -> None:
    handle = _handle(BOUND)
    Publisher(handle).publish(NOW)
    [status] = handle.of(ClassStatus)
    assert status.name == "h100"
    numbers = status.body["status"]
    assert numbers["free"] == 1 and numbers["maxFreePerNode"] == 1
    [settings] = handle.of(Settings)
    assert settings.namespace == handle.config.namespace
    assert RES in settings.data["resourceNames"]


def test_the_reports_write_one_usage_record_per_ordered_held_claim() -> None:
    handle = _handle(BOUND)
    assert handle.config.workload_records, "the default settings keep usage records"
    Publisher(handle).publish(NOW)
    [record] = handle.of(RecordCreate)
    assert (record.namespace, record.name) == (NS, records.workload_name("c"))
    assert record.body["status"]["operational"] is True


def test_the_reports_write_back_a_usage_records_edited_status_once_at_a_time() -> None:
    handle = _handle(BOUND)
    claim = handle.view.claim(KEY)
    assert claim is not None
    edited = records.usage_record(claim)
    edited["metadata"]["resourceVersion"] = "40"
    edited["status"] = {**edited["status"], "operational": False}
    handle.view.apply(keys.WORKLOAD.kind, edited, deleted=False)
    publisher = Publisher(handle)
    publisher.publish(NOW)
    [write] = handle.of(RecordStatus)
    assert (write.namespace, write.name) == (NS, records.workload_name("c"))
    assert write.body["status"]["operational"] is True
    assert write.body["metadata"] == {"resourceVersion": "40"}
    assert handle.of(RecordCreate) == [], "it exists: no second record"
    publisher.publish(NOW + 1)
    assert len(handle.of(RecordStatus)) == 1, "one write in flight at a time"


def _booked(given: dict[str, list[dict[str, Any]]]) -> None:
    """A window booked on n1 for the hour after NOW, beside the claim."""
    start = NOW - NOW % 60 + 600
    given[keys.GPU_RESERVATION.kind] = [
        {
            "metadata": _meta("train", namespace=NS),
            "spec": {
                "class": "h100",
                "count": 1,
                "start": translate.rfc3339(start),
                "end": translate.rfc3339(start + 3600),
            },
            "status": {"phase": "Booked", "nodeName": "n1"},
        }
    ]


def test_the_reports_write_a_booked_windows_record_and_remove_it_at_its_end() -> None:
    handle = _handle({}, change=_booked)
    publisher = Publisher(handle)
    publisher.publish(NOW)
    [create] = handle.of(RecordCreate)
    assert (create.namespace, create.name) == (NS, "gpureservation-train")
    assert create.body["status"]["type"] == "gpu-reservation"
    assert create.body["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    handle.answer(create, Outcome.WRITTEN)
    handle.view.apply(keys.WORKLOAD.kind, {**create.body, "metadata": {
        **create.body["metadata"], "resourceVersion": "7"}}, deleted=False)  # fmt: skip
    publisher.publish(NOW + 1)
    assert len(handle.of(RecordCreate)) == 1 and handle.of(RecordDelete) == []
    publisher.publish(NOW - NOW % 60 + 600 + 3600)  # the window's end, still Booked
    [delete] = handle.of(RecordDelete)
    assert (delete.namespace, delete.name) == (NS, "gpureservation-train")


def test_a_waiting_order_is_told_why_once_and_never_while_a_placement_is_out() -> None:
    handle = _handle({})
    notes = WaitingNotes(handle)
    refusal = Refusal(Reason.INSUFFICIENT_CAPACITY, "no node serving class h100 has 1 free unit")
    wait = Action(Step.WAIT, (KEY,), refusal=refusal)
    notes.refill(NOW)
    notes.tell([wait], NOW, placing=True)
    assert handle.sent == [], "binds first: nothing while a placement write is out"
    notes.tell([wait], NOW, placing=False)
    [note] = handle.of(ClaimNote)
    assert (note.name, note.note, note.body["status"]["phase"]) == ("c", Note.WAIT, "Pending")
    bound = _conditions(note)["Bound"]
    assert (bound["status"], bound["reason"]) == ("False", "InsufficientCapacity")
    assert bound["message"] == refusal.message
    notes.tell([wait], NOW + 1, placing=False)
    assert len(handle.sent) == 1, "the same reason is said once"
    handle.answer(note, Outcome.CONFLICT, "409 Conflict")  # its note did not land
    notes.tell([wait], NOW + 2, placing=False)
    assert len(handle.sent) == 2


def test_a_failing_settings_write_is_retried_with_backoff_not_on_every_turn() -> None:
    """RBAC lost, say: each publish turn (four a second) must not send the settings write
    again and log its failure; the retries wait 1, 2, 4 ... s, at most the refresh period,
    and a write that lands ends the backoff."""
    handle = _handle(BOUND)
    publisher = Publisher(handle)

    def settings_writes_at(at: float) -> int:
        publisher.publish(at)
        return len(handle.of(Settings))

    def answered(outcome: Outcome) -> None:
        for call in [c for c in handle.unanswered if isinstance(c, Settings)]:
            handle.answer(call, outcome, "" if outcome is Outcome.WRITTEN else "403 Forbidden")

    def fails() -> None:
        answered(Outcome.FAILED)

    assert settings_writes_at(NOW) == 1
    assert settings_writes_at(NOW + 0.4) == 1, "one at a time while it is out"
    fails()
    assert settings_writes_at(NOW + 0.5) == 1, "no retry half a second later"
    assert settings_writes_at(NOW + 1.0) == 2, "the first retry after 1 s"
    fails()
    assert settings_writes_at(NOW + 2.5) == 2
    assert settings_writes_at(NOW + 3.0) == 3, "the second 2 s after the first"
    fails()
    [*_earlier, last] = handle.of(Settings)
    assert last.heard is not None
    for _try in range(9):  # as if each of these retries failed too
        last.heard(Answer(last, Outcome.FAILED, error="403 Forbidden"))
    assert settings_writes_at(NOW + 3.0 + SETTINGS_REFRESH_S - 0.5) == 3, "capped, not hours"
    assert settings_writes_at(NOW + 3.0 + SETTINGS_REFRESH_S) == 4
    answered(Outcome.WRITTEN)
    assert settings_writes_at(NOW + 3.5 + SETTINGS_REFRESH_S) == 4, "written: nothing to retry"


LOST_ON_GONE_NODE = {
    "phase": "Lost",
    "nodeName": "gone",
    "boundAt": "2026-12-01T10:00:01Z",
    "attachedTo": "vm",
    "attachedToUID": "uid-vm",
}


def test_a_vmi_pinned_to_a_gone_node_is_deleted_once_and_a_new_one_of_its_name_again() -> None:
    """Its launcher pod can never be scheduled: the VMI is deleted so the VM starts again
    elsewhere. The view shows it until the watch brings its end (KubeVirt's finalizers keep
    it a while), so it is deleted once, however many turns pass; a new VMI of that name
    (another uid) stuck the same way is deleted too."""
    handle = _handle(LOST_ON_GONE_NODE)
    attachments = Attachments(handle)
    attachments.release_stuck_vmis()
    attachments.release_stuck_vmis()
    [delete] = handle.of(VmiDelete)
    assert (delete.namespace, delete.name) == (NS, "vm")
    handle.answer(delete, Outcome.WRITTEN)
    attachments.release_stuck_vmis()
    assert len(handle.of(VmiDelete)) == 1, "deleted once while the view still shows it"
    [vmi] = handle.view.raw[keys.VMI.kind].values()
    again = json.loads(json.dumps(vmi))
    again["metadata"].update(uid="uid-vm-2", resourceVersion="9")
    handle.view.apply(keys.VMI.kind, again, deleted=False)
    attachments.release_stuck_vmis()
    assert len(handle.of(VmiDelete)) == 2, "the new VMI of that name is stuck too"


def test_a_failed_vmi_delete_is_sent_again() -> None:
    handle = _handle(LOST_ON_GONE_NODE)
    attachments = Attachments(handle)
    attachments.release_stuck_vmis()
    [delete] = handle.of(VmiDelete)
    handle.answer(delete, Outcome.FAILED, "503 Service Unavailable")
    attachments.release_stuck_vmis()
    assert len(handle.of(VmiDelete)) == 2


def _second_vmi(given: dict[str, list[dict[str, Any]]]) -> None:
    """Another live VMI names the same claim: both were admitted before either was attached
    (the VMI webhook writes nothing)."""
    [vmi] = given[keys.VMI.kind]
    other = json.loads(json.dumps(vmi))
    other["metadata"].update(name="other", uid="uid-other")
    given[keys.VMI.kind].append(other)


def test_the_binder_attaches_a_held_claim_to_its_live_vmi_once_and_by_uid() -> None:
    handle = _handle(BOUND, change=_protected)
    attachments = Attachments(handle)
    attachments.attach_started(NOW)
    attachments.attach_started(NOW)  # the write is out: not sent twice
    [(decided, call)] = handle.decided
    assert (decided.key, decided.phase, decided.attached_to) == (KEY, Phase.ATTACHED, "vm")
    assert call.body["status"]["attachedTo"] == "vm"
    assert call.body["status"]["attachedToUID"] == "uid-vm"
    assert call.body["metadata"] == {"resourceVersion": "1"}, "written over the claim it read"


def test_one_claim_named_by_two_live_vmis_goes_to_one_of_them_only() -> None:
    handle = _handle(BOUND, change=lambda given: (_second_vmi(given), _protected(given)))
    attachments = Attachments(handle)
    attachments.attach_started(NOW)
    [(decided, call)] = handle.decided
    assert decided.attached_to in ("vm", "other")
    # The write lands: the view has the claim attached, and the other VMI does not get it.
    [claim] = handle.view.raw[keys.GPU_CLAIM.kind].values()
    written = json.loads(json.dumps(claim))
    written["metadata"]["resourceVersion"] = "5"
    written["status"].update(call.body["status"])
    handle.view.apply(keys.GPU_CLAIM.kind, written, deleted=False)
    handle.out.clear()
    attachments.attach_started(NOW)
    assert len(handle.decided) == 1, "one claim attached to two VMIs"


def test_a_pod_whose_held_claim_another_vmi_holds_stays_gated_and_its_vmi_is_told_why() -> None:
    held = {**BOUND, "phase": "Attached", "attachedTo": "other", "attachedToUID": "uid-other"}
    handle = _handle(held, change=lambda given: (_second_vmi(given), _protected(given)))
    Gatekeeper(handle).run(NOW)
    Attachments(handle).attach_started(NOW)
    assert handle.of(PodPin) == [], "a pod started on a claim another VMI holds"
    assert handle.decided == [], "the claim was taken from the VMI that holds it"
    # Said on the waiting VMI; the claim's conditions are the VM's that holds it.
    assert handle.of(ClaimNote) == []
    assert handle.events == [("vm", keys.EventReason.SET_NOT_PLACED.value)]
