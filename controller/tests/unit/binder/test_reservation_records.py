"""A booked window is billed once, from its reservation (SPEC §11): every reservation from
Booked until its window's end or its deletion has exactly one usage record of its own (type
``gpu-reservation``, owned by it, carrying its class, count, window and node), and the claim
it makes at its start has none, while an ordered claim beside it keeps its own.

The rules are pure (``binder/rules/records.py``); each pass here applies a plan as the API
server would (creates, merge patches, deletes), over the clock the test gives."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import records
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit.invariants import RECORDS, Invariants, State

NS = "tenant-a"
START, END = 1_800_003_600.0, 1_800_007_200.0  # whole minutes, as the CRD asks
BEFORE, DURING, AFTER = START - 600, START + 600, END
CLASS_KEY = keys.quota_key("h100")


def reservation(
    phase: str = "Booked", name: str = "train", uid: str = "uid-r", count: int = 4, **status: Any
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {
            "class": "h100",
            "count": count,
            "start": translate.rfc3339(START),
            "end": translate.rfc3339(END),
        },
        "status": {"phase": phase, **({"nodeName": "n1"} if phase != "Lost" else {}), **status},
    }


def claim(name: str, uid: str, count: int = 4, **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid, **metadata},
        "spec": {"class": "h100", "count": count},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }


def window_claim(of: dict[str, Any], count: int | None = None) -> dict[str, Any]:
    """The claim a reservation makes at its start: of its name, labelled, owned by it."""
    name = of["metadata"]["name"]
    owner = {"apiVersion": keys.API_VERSION, "kind": keys.KIND_RESERVATION, "name": name,
             "uid": of["metadata"]["uid"], "controller": True}  # fmt: skip
    return claim(
        name,
        "uid-window-claim",
        count=of["spec"]["count"] if count is None else count,
        labels={keys.LABEL_RESERVATION: name},
        ownerReferences=[owner],
    )


def merged(target: Any, patch: Any) -> Any:
    """A JSON merge patch (RFC 7386), as the API server applies one."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merged(out.get(key), value)
    return out


def settle(
    claims: list[dict[str, Any]],
    reservations: list[dict[str, Any]],
    now: float,
    workloads: dict[Any, Any] | None = None,
) -> dict[Any, Any]:
    """The records after a few publishes at ``now``, each plan applied whole."""
    after = copy.deepcopy(workloads or {})
    for _pass in range(4):
        wanting = records.record_owners(claims, reservations, now)
        plan = records.plan_records(wanting[0], after, wanting[1])
        for key in plan.delete:
            after.pop(key, None)
        for key, patch in (*plan.repair, *plan.annotate):
            after[key] = merged(after[key], patch)
        for body in plan.create:
            key = (body["metadata"]["namespace"], body["metadata"]["name"])
            after.setdefault(key, merged(body, {"metadata": {"resourceVersion": "5"}}))
    wanting = records.record_owners(claims, reservations, now)
    assert records.plan_records(wanting[0], after, wanting[1]) == records.RecordPlan(), (
        "settled: nothing more to write"
    )
    return after


def owned_by(workloads: dict[Any, Any], uid: str) -> list[dict[str, Any]]:
    return [w for w in workloads.values() if records.owner_uid(w) == uid]


@pytest.mark.parametrize("phase", ["Booked", "Active"])
def test_a_booked_reservation_has_exactly_one_record_of_type_gpu_reservation_with_its_window(
    phase: str,
) -> None:
    booked = reservation(phase)
    after = settle([], [booked], BEFORE if phase == "Booked" else DURING)
    [record] = after.values()
    assert after == {(NS, "gpureservation-train"): record}
    [owner] = record["metadata"]["ownerReferences"]
    assert (owner["apiVersion"], owner["kind"], owner["name"], owner["uid"]) == (
        keys.API_VERSION,
        keys.KIND_RESERVATION,
        "train",
        "uid-r",
    ), "owned by the reservation: the garbage collector takes it with it"
    assert record["status"] == {
        "kind": "GPUReservation",
        "type": "gpu-reservation",
        "resources": {CLASS_KEY: "4"},
        "operational": True,
    }, "the claim records' layout: class and count in resources"
    assert record["metadata"]["annotations"] == {
        keys.ANNOTATION_RECORD_START: translate.rfc3339(START),
        keys.ANNOTATION_RECORD_END: translate.rfc3339(END),
        keys.ANNOTATION_RECORD_NODE: "n1",
    }


def test_a_lost_reservation_keeps_its_record_not_operational_and_without_a_node() -> None:
    booked = settle([], [reservation("Booked")], BEFORE)
    after = settle([], [reservation("Lost")], BEFORE, booked)
    [record] = after.values()
    assert list(after) == list(booked), "the same record: the window is still owed"
    assert record["status"]["operational"] is False
    assert keys.ANNOTATION_RECORD_NODE not in record["metadata"]["annotations"]
    again = settle([], [reservation("Booked", nodeName="n2")], BEFORE, after)
    [record] = again.values()
    assert record["status"]["operational"] is True
    assert record["metadata"]["annotations"][keys.ANNOTATION_RECORD_NODE] == "n2", "booked again"


def test_a_record_follows_its_reservation_to_another_node_and_keeps_others_annotations() -> None:
    before = settle([], [reservation("Booked")], BEFORE)
    [(key, record)] = before.items()
    record["metadata"]["annotations"]["billing.example/ref"] = "kept"
    after = settle([], [reservation("Booked", nodeName="n2")], BEFORE, before)
    annotations = after[key]["metadata"]["annotations"]
    assert annotations[keys.ANNOTATION_RECORD_NODE] == "n2"
    assert annotations["billing.example/ref"] == "kept"


@pytest.mark.parametrize(
    ("change", "now"),
    [
        ("Ended", DURING),
        ("deleted", DURING),
        ("Booked", AFTER),  # its end passed before the binder wrote Ended
        ("Active", AFTER + 3600),
    ],
)
def test_an_ended_or_deleted_reservation_has_no_record(change: str, now: float) -> None:
    before = settle([], [reservation("Active")], DURING)
    assert len(before) == 1
    left = [] if change == "deleted" else [reservation(change)]
    assert settle([], left, now, before) == {}


@pytest.mark.parametrize("phase", ["Pending", "Ended"])
def test_a_reservation_not_booked_or_ended_gets_no_record(phase: str) -> None:
    assert settle([], [reservation(phase)], BEFORE) == {}


def test_a_window_claim_has_no_record_while_an_ordered_claim_of_the_same_class_has_one() -> None:
    active = reservation("Active")
    window = window_claim(active)
    order = claim("order", "uid-order")
    assert translate.is_window_claim(window) and not translate.is_window_claim(order)
    after = settle([window, order], [active], DURING)
    assert owned_by(after, "uid-window-claim") == [], "the window is billed from its reservation"
    [order_record] = owned_by(after, "uid-order")
    assert order_record["status"]["type"] == keys.WORKLOAD_STATUS_TYPE
    assert order_record["status"]["resources"] == {CLASS_KEY: "4"}
    [window_record] = owned_by(after, "uid-r")
    assert window_record["status"]["type"] == "gpu-reservation"
    assert len(after) == 2, "exactly one record each, none for the window claim"


@pytest.mark.parametrize(
    "why",
    ["reservation deleted", "reservation Ended", "another count", "label only", "another name"],
)
def test_a_claim_only_calling_itself_a_window_is_billed_as_an_order(why: str) -> None:
    """A held claim's units are billed by some record: a claim is let off only while the
    reservation it names is billed for the same class and count."""
    active = reservation("Active")
    reservations = [active]
    held = window_claim(active)
    if why == "reservation deleted":
        reservations = []
    elif why == "reservation Ended":
        reservations = [reservation("Ended")]
    elif why == "another count":
        held = window_claim(active, count=8)
    elif why == "label only":
        held["metadata"]["ownerReferences"] = []
    else:
        held["metadata"]["name"] = "other"
    after = settle([held], reservations, DURING)
    [record] = owned_by(after, "uid-window-claim")
    assert record["status"]["resources"] == {CLASS_KEY: str(held["spec"]["count"])}


def test_claim_and_reservation_records_of_one_name_leave_each_other_alone() -> None:
    """A reservation and an order of the same name: two records, two prefixes."""
    after = settle([claim("train", "uid-order")], [reservation("Booked")], BEFORE)
    assert sorted(after) == [(NS, "gpuclaim-train"), (NS, "gpureservation-train")]
    gone = settle([], [reservation("Booked")], BEFORE, after)
    assert sorted(gone) == [(NS, "gpureservation-train")], "only the claim's went"


def test_a_reservation_record_cut_loose_is_replaced_by_one_of_its_own() -> None:
    before = settle([], [reservation("Booked")], BEFORE)
    [record] = before.values()
    record["metadata"]["ownerReferences"] = []
    after = settle([], [reservation("Booked")], BEFORE, before)
    assert [records.owner_uid(w) for w in after.values()] == ["uid-r"]


def test_the_invariant_checker_reads_the_same_rule() -> None:
    """The test kit's settled look (RECORDS) agrees: the plan's records break no rule, and a
    record of the window claim, or none for the window, breaks it."""
    active, order = reservation("Active"), claim("order", "uid-order")
    window = window_claim(active)
    made = settle([window, order], [active], DURING)

    def broken(workloads: dict[Any, Any]) -> set[str]:
        look = State(
            nodes=[], gpunodes=[], classes=[], claims=[window, order], namespaces=[],
            quotas=[], pods=[], workloads=list(workloads.values()), vmis=[],
            reservations=[active], read_at=DURING,
        )  # fmt: skip
        found = Invariants(client.ApiClient()).settled(look)
        return {v.subject for v in found if v.rule == RECORDS}

    assert broken(made) == set()
    extra = records.usage_record(window)
    assert broken({**made, ("x", "y"): extra}) == {f"{NS}/{extra['metadata']['name']}"}
    without = {k: w for k, w in made.items() if records.owner_uid(w) != "uid-r"}
    assert broken(without) == {f"{NS}/train"}
