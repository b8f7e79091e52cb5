"""The binder's parts (the gate, the reports) against a fake handle and a recording writer:
what each decides and writes, with no API server and no binder loop (binder/part.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder import claim_status, records
from cozystack_gpu.binder.gatekeeper import Gatekeeper
from cozystack_gpu.binder.publisher import SETTINGS_REFRESH_S, Publisher
from cozystack_gpu.binder.waiting_notes import WaitingNotes
from cozystack_gpu.binder.writer import WriteDone, WriteKind
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import Action, ClaimInfo, ClaimKey, Reason, Refusal, Snapshot, Step
from cozystack_gpu_testkit.objects import binder_config

NS, RES, NOW = "tenant-a", "nvidia.com/X", 1_800_000_000.0


@dataclass
class RecordingWriter:
    """Every write a part asks for, in order, as (kind, name, detail); nothing is sent."""

    writes: list[tuple[str, str, Any]] = field(default_factory=list)
    core: Any = None
    custom: Any = None

    def call(self, what: str, namespace: str, name: str, request: Any, **kw: Any) -> None:
        self.writes.append((str(what), f"{namespace}/{name}" if namespace else name, None))

    def claim_status(
        self, key: ClaimKey, body: dict[str, Any], purpose: str, priority: Any
    ) -> None:
        self.writes.append(("claim-status", f"{key.namespace}/{key.name}", purpose))

    def event(self, obj: Any, reason: str, message: str, warning: bool, **kw: Any) -> None:
        self.writes.append(("event", str(obj["metadata"]["name"]), reason))

    def class_status(self, name: str, body: dict[str, Any]) -> None:
        self.writes.append(("class-status", name, body["status"]))

    def settings(self, namespace: str, data: dict[str, str]) -> None:
        self.writes.append(("settings", namespace, data))

    def create_record(self, namespace: str, body: dict[str, Any]) -> None:
        self.writes.append(("record", namespace, body["metadata"]["name"]))

    def delete_record(self, namespace: str, name: str) -> None:
        self.writes.append(("record-delete", namespace, name))

    def record_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.writes.append(("record-status", namespace, name, body))

    def kinds(self) -> list[str]:
        return [w[0] for w in self.writes]


@dataclass
class FakeHandle:
    """What the binder hands its parts (binder.part.PartHandle), over a real view and
    snapshot built from hand-made objects."""

    view: ClusterView
    snapshot: Snapshot
    writer: RecordingWriter
    config: Config
    out: set[ClaimKey] = field(default_factory=set)
    decided: list[tuple[ClaimInfo, str]] = field(default_factory=list)

    def clock(self) -> float:
        return NOW

    def in_flight(self, keys_: Any) -> bool:
        return any(k in self.out for k in keys_)

    def decide(self, claim: ClaimInfo, body: dict[str, Any], purpose: str) -> None:
        self.snapshot.upsert_claim(claim)
        self.decided.append((claim, purpose))
        self.out.add(claim.key)


def _meta(name: str, namespace: str = "", **more: Any) -> dict[str, Any]:
    found = {"name": name, "resourceVersion": "1", "uid": f"uid-{name}", **more}
    if namespace:
        found["namespace"] = namespace
    return found


def _objects(claim_status: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": "vm",
             "uid": "uid-vm", "controller": True}  # fmt: skip
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
        keys.POD.kind: [
            {
                "metadata": _meta(
                    "virt-launcher-vm", namespace=NS, labels=labels, ownerReferences=[owner]
                ),
                "spec": {
                    "containers": [{"name": "compute", "resources": {"limits": {RES: "1"}}}],
                    "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
                },
                "status": {"phase": "Pending"},
            }
        ],
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
    return FakeHandle(view, view.build_snapshot(NOW), RecordingWriter(), config)


BOUND = {"phase": "Bound", "nodeName": "n1", "boundAt": "2026-12-01T10:00:01Z"}
KEY = ClaimKey(NS, "c")


def test_the_gate_pins_a_gated_pod_whose_claims_are_bound_on_one_node() -> None:
    handle = _handle(BOUND)
    Gatekeeper(handle).run(NOW)
    assert ("pod-pin", f"{NS}/virt-launcher-vm", None) in handle.writer.writes
    assert handle.decided == [], "the claims stay where they are"


def _surplus(given: dict[str, list[dict[str, Any]]]) -> None:
    """KubeVirt added a request for a network whose NetworkAttachmentDefinition names the
    class's resource: the launcher pod asks 2 units where its claim covers 1."""
    [pod] = given[keys.POD.kind]
    pod["spec"]["containers"][0]["resources"] = {"limits": {RES: "2"}, "requests": {RES: "2"}}


def test_the_gate_keeps_a_pod_asking_more_gpus_than_its_claims_cover_gated() -> None:
    handle = _handle(BOUND, change=_surplus)
    Gatekeeper(handle).run(NOW)
    assert "pod-pin" not in handle.writer.kinds(), "a pod asking 2 units for a 1-unit claim started"
    assert ("claim-status", f"{NS}/c", claim_status.NOTE_PLACED) in handle.writer.writes
    assert ("event", "vm", keys.EventReason.SET_NOT_PLACED.value) in handle.writer.writes


def _forged_older(given: dict[str, list[dict[str, Any]]]) -> None:
    """A tenant's pod naming the VMI by uid, older than the launcher pod."""
    [pod] = given[keys.POD.kind]
    pod["metadata"]["creationTimestamp"] = "2026-12-01T10:00:05Z"
    forged = json.loads(json.dumps(pod))
    forged["metadata"].update(name="forged", creationTimestamp="2026-12-01T10:00:02Z")
    given[keys.POD.kind].append(forged)


def test_the_gate_pins_only_the_one_launcher_pod_of_a_vmi() -> None:
    handle = _handle(BOUND, change=_forged_older)
    Gatekeeper(handle).run(NOW)
    pins = [w for w in handle.writer.writes if w[0] == "pod-pin"]
    assert pins == [("pod-pin", f"{NS}/forged", None)], "two pods pinned under one set of claims"
    assert ("event", "vm", keys.EventReason.SET_NOT_PLACED.value) in handle.writer.writes


def test_the_gate_binds_a_pending_claim_of_a_starting_set_and_pins_only_once_it_is_written() -> (
    None
):
    handle = _handle({"phase": "Pending"})
    Gatekeeper(handle).run(NOW)
    [(decided, purpose)] = handle.decided
    assert (decided.key, decided.phase, decided.node, purpose) == (KEY, Phase.BOUND, "n1", "Bind")
    assert handle.snapshot.claim(KEY) == decided, "recorded in the snapshot when sent"
    assert "pod-pin" not in handle.writer.kinds(), "pinned once the API confirms the bind"


def test_the_gate_touches_no_set_whose_claim_has_a_write_out() -> None:
    handle = _handle({"phase": "Pending"})
    handle.out.add(KEY)
    Gatekeeper(handle).run(NOW)
    assert handle.decided == [] and handle.writer.writes == []


def test_a_set_told_it_cannot_start_is_told_again_when_that_note_was_refused() -> None:
    """The note lost a race (409: another write of the claim's, such as a rejection kept
    against the VM, came first): the next pass says it again, over the claim as it is then.
    Found by the lifecycle fuzz on the real virt-controller: a VM's next template claim was
    left with no phase and no reason for good."""
    handle = _handle({"phase": "Pending"}, cordoned=True)
    gate = Gatekeeper(handle)
    gate.run(NOW)
    assert ("claim-status", f"{NS}/c", claim_status.NOTE_PLACED) in handle.writer.writes
    handle.writer.writes.clear()
    gate.run(NOW + 1)
    assert handle.writer.writes == [], "said once while it stands"
    gate.placed_answered(KEY, written=False)
    gate.run(NOW + 2)
    assert ("claim-status", f"{NS}/c", claim_status.NOTE_PLACED) in handle.writer.writes


def test_the_reports_write_the_class_status_and_the_settings() -> None:
    handle = _handle(BOUND)
    Publisher(handle).publish(NOW)
    [status] = [w for w in handle.writer.writes if w[0] == "class-status"]
    assert status[1] == "h100" and status[2]["free"] == 1 and status[2]["maxFreePerNode"] == 1
    assert "settings" in handle.writer.kinds()


def test_the_reports_write_one_usage_record_per_ordered_held_claim() -> None:
    handle = _handle(BOUND)
    assert handle.config.workload_records, "the default settings keep usage records"
    Publisher(handle).publish(NOW)
    written = [w for w in handle.writer.writes if w[0] == "record"]
    assert written == [("record", NS, records.workload_name("c"))]


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
    [write] = [w for w in handle.writer.writes if w[0] == "record-status"]
    assert write[1:3] == (NS, records.workload_name("c"))
    assert write[3]["status"]["operational"] is True
    assert write[3]["metadata"] == {"resourceVersion": "40"}
    assert "record" not in handle.writer.kinds(), "it exists: no second record"
    publisher.publish(NOW + 1)
    assert handle.writer.kinds().count("record-status") == 1, "one write in flight at a time"


def test_a_waiting_order_is_told_why_once_and_never_while_a_placement_is_out() -> None:
    handle = _handle({})
    notes = WaitingNotes(handle)
    refusal = Refusal(Reason.INSUFFICIENT_CAPACITY, "no node serving class h100 has 1 free unit")
    wait = Action(Step.WAIT, (KEY,), refusal=refusal)
    notes.refill(NOW)
    notes.tell([wait], NOW, placing=True)
    assert handle.writer.writes == [], "binds first: nothing while a placement write is out"
    notes.tell([wait], NOW, placing=False)
    assert handle.writer.writes == [("claim-status", f"{NS}/c", claim_status.NOTE_WAIT)]
    notes.tell([wait], NOW + 1, placing=False)
    assert len(handle.writer.writes) == 1, "the same reason is said once"
    notes.forget(KEY)  # its note did not land, say
    notes.tell([wait], NOW + 2, placing=False)
    assert len(handle.writer.writes) == 2


def test_a_failing_settings_write_is_retried_with_backoff_not_on_every_turn() -> None:
    """RBAC lost, say: each publish turn (four a second) must not send the settings write
    again and log its failure; the retries wait 1, 2, 4 ... s, at most the refresh period,
    and a write that lands ends the backoff."""
    handle = _handle(BOUND)
    publisher = Publisher(handle)

    def settings_writes_at(at: float) -> int:
        publisher.publish(at)
        return handle.writer.kinds().count("settings")

    def fails() -> None:
        publisher.written(WriteDone(WriteKind.SETTINGS, "", "gpu-settings", False, error="403"))

    assert settings_writes_at(NOW) == 1
    fails()
    assert settings_writes_at(NOW + 0.5) == 1, "no retry half a second later"
    assert settings_writes_at(NOW + 1.0) == 2, "the first retry after 1 s"
    fails()
    assert settings_writes_at(NOW + 2.5) == 2
    assert settings_writes_at(NOW + 3.0) == 3, "the second 2 s after the first"
    for _try in range(10):
        fails()
    assert settings_writes_at(NOW + 3.0 + SETTINGS_REFRESH_S - 0.5) == 3, "capped, not hours"
    assert settings_writes_at(NOW + 3.0 + SETTINGS_REFRESH_S) == 4
    publisher.written(WriteDone(WriteKind.SETTINGS, "", "gpu-settings", True))
    assert settings_writes_at(NOW + 3.5 + SETTINGS_REFRESH_S) == 4, "written: nothing to retry"
