"""A live migration in the binder (SPEC §12), against a fake handle: the target pod's set is
placed on another node and recorded on each claim before the pod is pinned there; the hold
follows the VM when it lands, and the target goes when the migration fails; a second
target pod of the migration is never pinned."""

from __future__ import annotations

import copy
import json
from typing import Any

from test_decision_counts import _nowhere
from test_parts_handle import NOW, NS, RES, FakeHandle, _gated_launcher, _handle, _meta

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer, Outcome
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.start_path import PodPin
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.binder.parts.migrations import Migrations
from cozystack_gpu.binder.rules import migration
from cozystack_gpu.cluster.informer import Event, EventType
from cozystack_gpu.model import ClaimKey, MigrationTarget

KEY = ClaimKey(NS, "c")
UID = "mig-1"
ATTACHED = {"phase": "Attached", "nodeName": "n1", "attachedTo": "vm", "attachedToUID": "uid-vm"}


def _job(phase: str = "Scheduling", **more: Any) -> dict[str, Any]:
    """The VirtualMachineInstanceMigration of uid UID, of VMI vm."""
    return {
        "metadata": {**_meta("move", namespace=NS), "uid": UID, **more},
        "spec": {"vmiName": "vm"},
        "status": {"phase": phase},
    }


def _world(
    claim_status: dict[str, Any],
    *,
    vmi_node: str = "n1",
    state: Any = None,
    more: Any = None,
    job: dict[str, Any] | None = None,
    target_pod: bool = True,
) -> Any:
    def change(given: dict[str, list[dict[str, Any]]]) -> None:
        n2 = copy.deepcopy(given[keys.NODE.kind][0])
        n2["metadata"] = _meta("n2", labels={"kubernetes.io/hostname": "n2"})
        given[keys.NODE.kind].append(n2)
        g2 = copy.deepcopy(given[keys.GPU_NODE.kind][0])
        g2["metadata"] = _meta("n2")
        given[keys.GPU_NODE.kind].append(g2)
        [vmi] = given[keys.VMI.kind]
        vmi["status"] = {"phase": "Running", "nodeName": vmi_node}
        if state is not None:
            vmi["status"]["migrationState"] = state
        [launcher] = given[keys.POD.kind]
        launcher["spec"].pop("schedulingGates")
        launcher["spec"]["nodeName"] = "n1"
        launcher["status"] = {"phase": "Running"}
        vmi["status"]["conditions"] = [{"type": "LiveMigratable", "status": "True"}]
        if target_pod:
            given[keys.POD.kind].append(_target_pod("virt-launcher-vm-target"))
        given[keys.VMIM.kind] = [job if job is not None else _job()]
        given[keys.GPU_CLAIM.kind][0]["metadata"]["finalizers"] = [keys.FINALIZER_CLAIM]
        if more is not None:
            more(given)

    return _handle(claim_status, change=change)


def _target_pod(name: str, created: str = "2026-12-01T10:05:00Z") -> dict[str, Any]:
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE, keys.LABEL_MIGRATION_JOB_UID: UID}
    owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": "vm",
             "uid": "uid-vm", "controller": True}  # fmt: skip
    return {
        "metadata": _meta(name, namespace=NS, labels=labels, ownerReferences=[owner],
                          creationTimestamp=created),
        "spec": {
            "containers": [{"name": "compute", "resources": {"limits": {RES: "1"}}}],
            "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
        },
        "status": {"phase": "Pending"},
    }  # fmt: skip


def _record(handle: FakeHandle, target: dict[str, Any]) -> None:
    """The view takes the claim as the record write left it."""
    obj = copy.deepcopy(handle.view.claim(KEY))
    assert obj is not None
    obj["status"]["migration"] = target
    obj["metadata"]["resourceVersion"] = "2"
    handle.view.apply(keys.GPU_CLAIM.kind, obj, deleted=False)
    handle.out.clear()
    handle.unanswered.clear()


def _placed_then_pinned(handle: FakeHandle, part: Migrations) -> None:
    """Two passes: the first records the set's target, the view takes the record, the
    second pins the target pod."""
    part.run(1_800_000_000.0)
    [(_recorded, decision)] = handle.decided
    _record(handle, decision.body["status"]["migration"])
    handle.snapshot = handle.view.build_snapshot(1_800_000_001.0)
    part.run(1_800_000_001.0)


def test_a_target_pod_gets_its_set_placed_on_another_node_recorded_then_pinned() -> None:
    handle = _world(ATTACHED)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    [(recorded, decision)] = handle.decided
    assert recorded.migration is not None and recorded.migration.node == "n2"
    assert recorded.node == "n1", "the claim holds its source until the VM lands"
    assert decision.body["status"]["migration"]["node"] == "n2"
    assert decision.body["status"]["migration"]["migrationUID"] == UID
    told = _migration_condition(decision.body)
    assert (told["status"], told["reason"]) == ("True", "MigrationTargetPlaced")
    assert "node n2" in told["message"]
    assert handle.of(PodPin) == [], "pinned only once every claim shows the target"
    assert handle.snapshot.used("n2", RES) == 1, "the target's unit counts on n2 at once"
    assert handle.snapshot.used("n1", RES) == 1, "and the source's stays"
    _record(handle, decision.body["status"]["migration"])
    handle.snapshot = handle.view.build_snapshot(1_800_000_001.0)
    part.run(1_800_000_001.0)
    [pin] = handle.of(PodPin)
    assert pin.name == "virt-launcher-vm-target"
    assert pin.body["spec"]["schedulingGates"] is None
    terms = pin.body["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert all({"key": "metadata.name", "operator": "In", "values": ["n2"]} in t["matchFields"]
               for t in terms)  # fmt: skip


def test_a_target_pod_is_pinned_as_its_record_is_answered_not_a_turn_later() -> None:
    """A busy leader's turn takes a second: the target pod, there when its set's record is
    sent, is pinned when the record's answer comes in (the view then shows it), not on the
    turn after; a start path's pod waits one turn, a target pod no more."""
    handle = _world(ATTACHED)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    [(_recorded, decision)] = handle.decided
    assert decision.heard is not None, "the record's answer is heard by the part"
    sent = handle.unanswered[0]
    _record(handle, decision.body["status"]["migration"])  # as the loop applies the answer
    handle.unanswered.append(sent)
    handle.answer(sent, Outcome.WRITTEN)
    [pin] = handle.of(PodPin)
    assert pin.name == "virt-launcher-vm-target"
    assert pin.body["spec"]["schedulingGates"] is None
    part.run(1_800_000_001.0)
    assert len(handle.of(PodPin)) == 1, "and pinned once"


def test_a_refused_record_pins_nothing_when_answered() -> None:
    handle = _world(ATTACHED)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    [_placed] = handle.decided
    handle.out.clear()
    handle.answer(handle.unanswered[0], Outcome.CONFLICT)
    assert handle.of(PodPin) == [], "the view shows no record: the pod stays gated"


def test_the_hold_follows_the_vm_when_it_lands_on_the_target() -> None:
    target = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}
    handle = _world({**ATTACHED, "migration": target}, vmi_node="n2")
    Migrations(handle).run(1_800_000_000.0)
    [(moved, decision)] = handle.decided
    assert (moved.node, moved.migration) == ("n2", None)
    assert decision.body["status"]["nodeName"] == "n2"
    assert decision.body["status"]["migration"] is None
    told = _migration_condition(decision.body)
    assert (told["status"], told["reason"]) == ("False", "MigrationLanded")


LANDED_TARGET = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}


def _second_vm(given: dict[str, list[dict[str, Any]]]) -> None:
    """VM vm2, starting: its held claim d of 2 units, Pending, and its gated launcher pod
    asking for them. Beside the landed VM, no node has 2 units free."""
    [claim] = given[keys.GPU_CLAIM.kind]
    d = copy.deepcopy(claim)
    d["metadata"] = _meta("d", namespace=NS, creationTimestamp="2026-12-01T10:06:00Z")
    d["spec"]["count"] = 2
    d["status"] = {}
    given[keys.GPU_CLAIM.kind].append(d)
    vmi = copy.deepcopy(given[keys.VMI.kind][0])
    vmi["metadata"] = _meta(
        "vm2",
        namespace=NS,
        labels=vmi["metadata"]["labels"],
        annotations={keys.ANNOTATION_CLAIMS: json.dumps({"claims": ["d"]})},
    )
    vmi["status"] = {"phase": "Scheduling"}
    given[keys.VMI.kind].append(vmi)
    given[keys.POD.kind].append(_gated_launcher("vm2", units=2))


def _binder_of(handle: FakeHandle) -> Binder:
    """A leader's loop over the same objects as ``handle``'s view (its writes go nowhere)."""
    binder = Binder(_nowhere(), handle.config)
    for kind in binder.view.kinds:
        binder.view.relist(kind, [copy.deepcopy(o) for o in handle.view.raw[kind].values()])
    binder.snapshot = binder.view.build_snapshot(NOW)
    return binder


def _decisions(binder: Binder, name: str) -> list[Decision]:
    return [
        call
        for _p, _s, call in list(binder.writer._jobs.queue)
        if isinstance(call, Decision) and call.name == name
    ]


def test_a_landed_vms_source_node_takes_no_start_until_the_move_is_answered() -> None:
    """The hold moves to the target when the VM lands, but the source pod runs on for its
    guest's last moments, and the view counts it as the claim's until it sees the claim
    moved. The node synced meanwhile (its agent's report) showed its units free, and the
    lifecycle fuzz saw a 2-unit set started there beside the pod (3 units held on a node of
    2)."""
    handle = _world({**ATTACHED, "migration": LANDED_TARGET}, vmi_node="n2", more=_second_vm)
    binder = _binder_of(handle)
    assert binder.snapshot.free("n1", RES) == 1 and binder.snapshot.free("n2", RES) == 1
    binder.migrations.run(NOW)
    [move] = _decisions(binder, "c")
    assert move.body["status"]["nodeName"] == "n2"

    source = copy.deepcopy(binder.view.pod((NS, "virt-launcher-vm")))
    assert source is not None and source["spec"]["nodeName"] == "n1"
    source["metadata"]["deletionTimestamp"] = "2026-12-01T10:06:01Z"
    binder.view.apply(keys.POD.kind, source, deleted=False)
    # The agent's report of n1 comes in, as it does every few seconds: n1 is synced from
    # the view, which still counts the source pod as c's.
    report = copy.deepcopy(binder.view.gpunode("n1"))
    assert report is not None
    report["metadata"]["resourceVersion"] = "7"
    binder.view.apply(keys.GPU_NODE.kind, report, deleted=False)
    binder._flush()
    assert binder.snapshot.free("n1", RES) == 2, "the snapshot shows n1 empty meanwhile"
    binder.gatekeeper.run(NOW)
    assert _decisions(binder, "d") == [], "placed into the room the move leaves, unanswered"

    moved = copy.deepcopy(binder.view.claim(KEY))
    assert moved is not None
    moved["status"].update(nodeName="n2", migration=None)
    moved["metadata"]["resourceVersion"] = "3"
    binder._answered(Answer(move, Outcome.WRITTEN, obj=moved))
    binder._flush()
    assert binder.snapshot.free("n1", RES) == 1, "answered: the source pod counts as raw use"
    binder.gatekeeper.run(NOW)
    assert _decisions(binder, "d") == [], "and it still runs there"

    binder.view.apply(keys.POD.kind, source, deleted=True)
    binder._flush()
    binder.gatekeeper.run(NOW)
    [bind] = _decisions(binder, "d")
    assert bind.body["status"]["nodeName"] == "n1", "gone: the set starts there"


def test_a_migration_target_is_not_placed_where_a_move_is_out() -> None:
    handle = _world(ATTACHED)
    handle.vacating.add("n2")
    Migrations(handle).run(NOW)
    assert handle.decided == [], "n2 is the only other node: the target waits for the answer"
    handle.vacating.clear()
    Migrations(handle).run(NOW)
    [(recorded, _decision)] = handle.decided
    assert recorded.migration is not None and recorded.migration.node == "n2"


def test_a_landed_vms_source_pod_already_gone_leaves_its_units_free() -> None:
    target = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}

    def source_pod_ended(given: dict[str, list[dict[str, Any]]]) -> None:
        source = next(p for p in given[keys.POD.kind] if p["spec"].get("nodeName") == "n1")
        source["status"]["phase"] = "Succeeded"

    handle = _world({**ATTACHED, "migration": target}, vmi_node="n2", more=source_pod_ended)
    capacity = handle.snapshot.capacity("n1", RES)
    Migrations(handle).run(1_800_000_000.0)
    assert handle.snapshot.free("n1", RES) == capacity, "nothing runs there any more"


def test_a_failed_migration_frees_its_target_and_the_claim_stays() -> None:
    target = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}
    state = {"migrationUid": UID, "failed": True, "targetNode": "n2"}
    handle = _world({**ATTACHED, "migration": target}, state=state)
    assert handle.snapshot.used("n2", RES) == 1
    Migrations(handle).run(1_800_000_000.0)
    [(cleared, decision)] = handle.decided
    assert (cleared.node, cleared.migration) == ("n1", None)
    assert decision.body["status"]["migration"] is None
    assert "nodeName" not in decision.body["status"] or decision.body["status"]["nodeName"] == "n1"
    assert handle.snapshot.used("n2", RES) == 0, "the target's unit is free again"
    told = _migration_condition(decision.body)
    assert (told["status"], told["reason"]) == ("False", "MigrationEnded")


def test_a_target_with_no_room_stays_gated_and_its_claims_say_why() -> None:
    """SPEC §12: no node has room for the set's target, so its pod stays gated; the VMI
    gets an Event and each claim of the set the Migration condition, once per reason."""
    occupied = {"phase": "Bound", "nodeName": "n2", "boundAt": "2026-12-01T10:00:00Z"}

    def fill_n2(given: dict[str, list[dict[str, Any]]]) -> None:
        other = copy.deepcopy(given[keys.GPU_CLAIM.kind][0])
        other["metadata"] = _meta("other", namespace=NS)
        other["spec"]["count"] = 2  # n2's two units
        other["status"] = occupied
        given[keys.GPU_CLAIM.kind].append(other)

    handle = _world(ATTACHED, more=fill_n2)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    part.run(1_800_000_001.0)
    assert handle.decided == [] and handle.of(PodPin) == []
    [note] = handle.of(ClaimNote)
    assert (note.name, note.note) == ("c", Note.MIGRATION)
    told = _migration_condition(note.body)
    assert (told["status"], told["reason"]) == ("False", "MigrationTargetNotPlaced")
    assert "the live migration of VMI vm waits" in told["message"]
    [event] = handle.events
    assert event[1] == keys.EventReason.SET_NOT_PLACED.value


def _migration_condition(body: dict[str, Any]) -> dict[str, Any]:
    [told] = [c for c in body["status"]["conditions"] if c["type"] == keys.CONDITION_MIGRATION]
    return dict(told)


def test_a_running_migration_keeps_its_target() -> None:
    target = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}
    state = {"migrationUid": UID, "targetNode": "n2"}
    handle = _world({**ATTACHED, "migration": target}, state=state)
    Migrations(handle).run(1_800_000_000.0)
    assert handle.decided == []


def test_only_the_first_target_pod_of_a_migration_is_placed() -> None:
    handle = _world(ATTACHED)
    handle.view.apply(keys.POD.kind, _target_pod("forged", "2026-12-01T10:06:00Z"), deleted=False)
    _placed_then_pinned(handle, Migrations(handle))
    assert [p.name for p in handle.of(PodPin)] == ["virt-launcher-vm-target"]


def test_the_outcome_of_a_migration_is_read_from_its_vmi() -> None:
    target = MigrationTarget("n2", UID, 0.0)
    running = {"status": {"phase": "Running", "nodeName": "n1"}}
    assert migration.outcome(target, running, True, "n1") is migration.Outcome.RUNNING
    assert migration.outcome(target, running, False, "n1") is migration.Outcome.ENDED
    landed = {"status": {"phase": "Running", "nodeName": "n2"}}
    assert migration.outcome(target, landed, False, "n1") is migration.Outcome.LANDED
    assert migration.outcome(target, None, True, "n1") is migration.Outcome.ENDED
    state = {"migrationUid": "mig-2", "completed": True, "startTimestamp": "1970-01-01T00:01:00Z"}
    later = {"status": {"phase": "Running", "nodeName": "n1", "migrationState": state}}
    assert migration.outcome(target, later, True, "n1") is migration.Outcome.ENDED
    # The state an earlier migration left on the VMI says nothing of this one.
    placed_later = MigrationTarget("n2", UID, 120.0)
    assert migration.outcome(placed_later, later, True, "n1") is migration.Outcome.RUNNING
    assert json.dumps(migration.record_patch({"metadata": {"resourceVersion": "9"}}, target))


def test_a_migration_seen_before_its_target_pod_is_placed_ahead_and_its_pod_pinned_at_once() -> (
    None
):
    """The target is recorded from the migration object alone, so when virt-controller's
    target pod comes, one pod update pins it: no claim write waits between."""
    handle = _world(ATTACHED, job=_job("Pending"), target_pod=False)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    [(recorded, decision)] = handle.decided
    assert recorded.migration is not None and recorded.migration.node == "n2"
    _record(handle, decision.body["status"]["migration"])
    handle.snapshot = handle.view.build_snapshot(1_800_000_001.0)
    handle.view.apply(keys.POD.kind, _target_pod("virt-launcher-vm-target"), deleted=False)
    part.run(1_800_000_001.0)
    assert len(handle.decided) == 1, "nothing recorded again"
    [pin] = handle.of(PodPin)
    assert pin.name == "virt-launcher-vm-target"


def test_a_migration_that_comes_in_mid_turn_is_placed_ahead_in_that_turn() -> None:
    """virt-controller renders the target pod as soon as it sees the migration, so a
    migration taken in by a turn's catch-up has its target recorded there: were it left to
    the next turn's start, its pod, come meanwhile, would wait a whole turn for the record
    where a start's pod waits for none (issue 44, at 1,000 VMs a turn takes about a
    second)."""
    handle = _world(ATTACHED, job=_job("Pending"), target_pod=False)
    binder = _binder_of(handle)
    job = copy.deepcopy(binder.view.migrations.get((NS, "move")))
    assert job is not None
    binder.view.relist(keys.VMIM.kind, [])
    binder._flush()
    job["metadata"]["resourceVersion"] = "5"  # made after the listing

    def migration_comes_in(*_args: Any) -> None:
        binder._threads.queue.put(Event(keys.VMIM.kind, EventType.ADDED, obj=job))

    binder.attachments.run = migration_comes_in  # type: ignore[method-assign]
    binder._turn(NOW)
    [record] = _decisions(binder, "c")
    assert record.body["status"]["migration"]["node"] == "n2"
    assert record.body["status"]["migration"]["migrationUID"] == UID


def test_a_migration_past_scheduling_or_of_a_vmi_not_migratable_is_not_placed_ahead() -> None:
    """Once its target pod runs, or after the VM landed (its claims on the target node),
    a migration still open must not get a second target."""
    for phase in ("Running", "TargetReady", "Succeeded"):
        handle = _world(ATTACHED, job=_job(phase), target_pod=False)
        Migrations(handle).run(1_800_000_000.0)
        assert handle.decided == [], phase
    vmi = {"status": {"phase": "Running", "conditions": []}}
    assert not migration.ahead(_job("Pending"), vmi), "virt-controller makes no target pod"


def test_a_target_pod_of_no_open_migration_is_never_placed() -> None:
    """A pod labelled with a migration uid that no open migration of its VMI has (forged,
    or its migration cancelled) stays gated: the label alone holds no units."""
    for job in (
        _job("Running", uid="another"),
        _job("Failed"),
        _job(deletionTimestamp="2026-12-01T10:06:00Z"),
    ):
        handle = _world(ATTACHED, job=job)
        Migrations(handle).run(1_800_000_000.0)
        assert handle.decided == [] and handle.of(PodPin) == [], job


def test_a_cancelled_migration_frees_its_target_once_its_pod_is_gone_or_never_came() -> None:
    """A migration deleted (cancelled) before virt-controller rendered its target pod has
    nothing left to land; one whose target pod still runs keeps the target's units until
    the pod goes (the units are in use until then)."""
    target = {"node": "n2", "migrationUID": UID, "since": "2026-12-01T10:05:00Z"}
    cancelled = _job(deletionTimestamp="2026-12-01T10:06:00Z")
    handle = _world({**ATTACHED, "migration": target}, job=cancelled, target_pod=False)
    Migrations(handle).run(1_800_000_000.0)
    [(cleared, decision)] = handle.decided
    assert (cleared.node, cleared.migration) == ("n1", None)
    assert _migration_condition(decision.body)["reason"] == "MigrationEnded"
    handle = _world({**ATTACHED, "migration": target}, job=cancelled)
    part = Migrations(handle)
    part.run(1_800_000_000.0)
    assert handle.decided == [], "its target pod still there"
    handle.view.forget(keys.POD.kind, (NS, "virt-launcher-vm-target"))
    part.run(1_800_000_001.0)
    [(cleared, _decision)] = handle.decided
    assert cleared.migration is None


def test_a_forged_target_pod_deleted_leaves_the_migrations_target_standing() -> None:
    """A tenant's pod forged with the migration's label beside the real target: deleting it
    must not end the migration (its target freed while the VM moves there would let another
    order take the units the VM lands on)."""
    handle = _world(ATTACHED)
    part = Migrations(handle)
    _placed_then_pinned(handle, part)
    [pin] = handle.of(PodPin)
    pinned = copy.deepcopy(handle.view.pod((NS, pin.name)))
    assert pinned is not None
    pinned["spec"].pop("schedulingGates")
    pinned["spec"]["nodeName"] = "n2"
    handle.view.apply(keys.POD.kind, pinned, deleted=False)
    handle.unanswered.clear()
    forged = _target_pod("forged", "2026-12-01T10:06:00Z")
    handle.view.apply(keys.POD.kind, forged, deleted=False)
    part.run(1_800_000_002.0)
    assert [p.name for p in handle.of(PodPin)] == [pin.name], "the forged pod is never pinned"
    handle.view.apply(keys.POD.kind, forged, deleted=True)
    part.run(1_800_000_003.0)
    ended = [d for _c, d in handle.decided if d.step == "migration-ended"]
    assert ended == [], "the real target pod lives: the migration's target stands"
    assert handle.snapshot.used("n2", RES) == 1
