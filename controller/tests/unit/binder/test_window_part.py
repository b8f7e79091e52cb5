"""A reservation's window in the binder (SPEC §11), against a fake handle: at its start the
Booked reservation turns Active and its claim is made and bound on the booked node; before
its end it warns; at its end its VM is halted, its claim deleted and it is Ended. Nothing
is sent twice while a write is out, and a claim of its name that it did not make is never
bound, deleted or taken."""

from __future__ import annotations

import json
from typing import Any

from test_parts_handle import NS, FakeHandle, _handle, _meta

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Outcome
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.calls.reservations import ReservationStatus
from cozystack_gpu.binder.calls.start_path import ClaimCreate, ClaimDelete, VmHalt, VmiDelete
from cozystack_gpu.binder.parts.windows import Windows
from cozystack_gpu.binder.rules import windows
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects.translate import rfc3339

START, END = 1_800_003_600, 1_800_036_000  # whole minutes, 9 h apart
KEY = ClaimKey(NS, "train")


def _reservation(phase: str) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_RESERVATION,
        "metadata": _meta("train", namespace=NS, creationTimestamp="2026-12-01T10:00:00Z"),
        "spec": {"class": "h100", "count": 2, "start": rfc3339(START), "end": rfc3339(END)},
        "status": {"phase": phase, "nodeName": "n1"},
    }


def _with(reservation: dict[str, Any], claim: dict[str, Any] | None = None) -> FakeHandle:
    def change(given: dict[str, list[dict[str, Any]]]) -> None:
        given[keys.GPU_RESERVATION.kind] = [reservation]
        given[keys.GPU_CLAIM.kind] = [claim] if claim is not None else []
        given[keys.VMI.kind] = []
        given[keys.POD.kind] = []

    return _handle({}, change=change)


def _window_claim(reservation: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    info_obj = dict(reservation)
    claim = windows.window_claim(info_obj, _info(reservation))
    claim["metadata"].update(resourceVersion="3", uid="uid-claim")
    claim["status"] = status
    return claim


def _info(reservation: dict[str, Any]) -> Any:
    from cozystack_gpu.objects.translate import reservation_info

    info = reservation_info(reservation)
    assert info is not None
    return info


def _attach_vm(handle: FakeHandle, vm: str | None) -> None:
    """A running VMI holding the window's claim, of the VM ``vm`` (None: a bare VMI)."""
    owners = (
        [{"apiVersion": keys.VM.api_version, "kind": keys.VM.kind, "name": vm, "controller": True}]
        if vm
        else []
    )
    vmi = {
        "metadata": _meta(
            "job", namespace=NS, ownerReferences=owners,
            annotations={keys.ANNOTATION_CLAIMS: json.dumps({"claims": ["train"]})},
        ),
        "spec": {},
        "status": {"phase": "Running", "nodeName": "n1"},
    }  # fmt: skip
    handle.view.apply(keys.VMI.kind, vmi, deleted=False)


def test_a_booked_window_turns_active_at_its_start_and_not_a_minute_before() -> None:
    reservation = _reservation("Booked")
    handle = _with(reservation)
    part = Windows(handle)
    part.run(START - 60)
    assert handle.sent == [], "nothing happens before the window"
    part.run(START)
    [active] = handle.of(ReservationStatus)
    assert active.body["status"]["phase"] == "Active"
    assert active.body["metadata"] == {"resourceVersion": "1"}, "built on the version read"
    part.run(START + 1)
    assert len(handle.of(ReservationStatus)) == 1, "not sent again while it is out"


def test_an_active_window_makes_its_claim_owned_by_it_and_binds_it_on_the_booked_node() -> None:
    reservation = _reservation("Active")
    handle = _with(reservation)
    part = Windows(handle)
    part.run(START + 5)
    [create] = handle.of(ClaimCreate)
    meta = create.body["metadata"]
    assert (meta["namespace"], meta["name"]) == (NS, "train")
    assert meta["labels"] == {keys.LABEL_RESERVATION: "train"}
    assert meta["finalizers"] == [keys.FINALIZER_CLAIM], "protected from its creation on"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        keys.KIND_RESERVATION,
        "uid-train",
        True,
    )
    assert create.body["spec"] == {"class": "h100", "count": 2}
    # The claim comes in (Pending): the part binds it where the window is booked.
    handle.answer(create, Outcome.WRITTEN)
    handle.view.apply(keys.GPU_CLAIM.kind, _window_claim(reservation, {}), deleted=False)
    handle.snapshot = handle.view.build_snapshot(START + 6)
    part.run(START + 6)
    [(bound, decision)] = handle.decided
    assert (bound.phase.value, bound.node, bound.window) == ("Bound", "n1", True)
    assert isinstance(decision, Decision)
    assert decision.body["status"]["nodeName"] == "n1"
    assert decision.body["metadata"] == {"resourceVersion": "3"}


def test_the_planner_never_places_a_window_claim_as_an_order() -> None:
    from cozystack_gpu.model import plan

    reservation = _reservation("Active")
    handle = _with(reservation, _window_claim(reservation, {}))
    claim = handle.snapshot.claim(KEY)
    assert claim is not None and claim.window and not claim.ordered
    result = plan(handle.snapshot, START + 5)
    assert all(KEY not in a.claims for a in result.actions), result.actions


def test_a_claim_of_the_window_name_it_did_not_make_is_never_bound_and_the_window_says_so() -> None:
    reservation = _reservation("Active")
    order = {
        "metadata": _meta("train", namespace=NS, creationTimestamp="2026-12-01T11:00:00Z"),
        "spec": {"class": "h100", "count": 2},
        "status": {},
    }
    handle = _with(reservation, order)
    Windows(handle).run(START + 5)
    assert handle.decided == [] and handle.of(ClaimCreate) == []
    [taken] = handle.of(ReservationStatus)
    [cond] = taken.body["status"]["conditions"]
    assert cond["reason"] == windows.CLAIM_TAKEN_REASON
    assert "GPUClaim train exists" in cond["message"] and "delete that claim" in cond["message"]


def test_the_window_warns_its_reservation_and_its_vmi_before_its_end_once() -> None:
    reservation = _reservation("Active")
    bound = {"phase": "Attached", "nodeName": "n1", "attachedTo": "job"}
    handle = _with(reservation, _window_claim(reservation, bound))
    _attach_vm(handle, "trainer")
    part = Windows(handle)
    warn_at = END - handle.config.reservation_warn_before
    part.run(warn_at - 60)
    assert handle.of(ReservationStatus) == []
    part.run(warn_at)
    [ending] = handle.of(ReservationStatus)
    [cond] = ending.body["status"]["conditions"]
    assert (cond["type"], cond["status"]) == (keys.CONDITION_ENDING, "True")
    assert "ends at" in cond["message"] and "in 30m" in cond["message"]
    assert ("train", windows.ENDING_REASON) in handle.events
    assert ("job", windows.ENDING_REASON) in handle.events, "the VMI is told too"


def test_at_its_end_the_vm_is_halted_the_claim_deleted_and_the_window_ended() -> None:
    reservation = _reservation("Active")
    bound = {"phase": "Attached", "nodeName": "n1", "attachedTo": "job"}
    handle = _with(reservation, _window_claim(reservation, bound))
    _attach_vm(handle, "trainer")
    Windows(handle).run(END)
    [halt] = handle.of(VmHalt)
    assert (halt.namespace, halt.name) == (NS, "trainer")
    assert halt.body == {"spec": {"running": None, "runStrategy": "Halted"}}
    [delete] = handle.of(ClaimDelete)
    assert (delete.name, delete.uid) == ("train", "uid-claim"), "only the very claim it made"
    [ended] = handle.of(ReservationStatus)
    assert ended.body["status"]["phase"] == "Ended"


def test_at_its_end_a_bare_vmi_holding_the_window_is_deleted() -> None:
    reservation = _reservation("Active")
    bound = {"phase": "Attached", "nodeName": "n1", "attachedTo": "job"}
    handle = _with(reservation, _window_claim(reservation, bound))
    _attach_vm(handle, None)
    Windows(handle).run(END + 30)
    assert [(c.namespace, c.name) for c in handle.of(VmiDelete)] == [(NS, "job")]
    assert handle.of(VmHalt) == []


def test_a_window_that_ends_lost_is_ended_and_deletes_no_claim_it_did_not_make() -> None:
    reservation = _reservation("Lost")
    reservation["status"]["nodeName"] = None
    order = {
        "metadata": _meta("train", namespace=NS),
        "spec": {"class": "h100", "count": 2},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }
    handle = _with(reservation, order)
    Windows(handle).run(END)
    assert handle.of(ClaimDelete) == [] and handle.of(VmHalt) == []
    [ended] = handle.of(ReservationStatus)
    assert ended.body["status"]["phase"] == "Ended"
    assert "while the reservation was Lost" in ended.body["status"]["conditions"][0]["message"]


def test_the_window_claim_waits_while_the_units_are_still_held_and_never_overcommits() -> None:
    """Back-to-back windows: the earlier window's claim is deleted at its end but holds its
    units until its VM has stopped; the next window's claim is bound only once they are
    free (the node has 2 units: the earlier claim holds both here)."""
    reservation = _reservation("Active")

    def change(given: dict[str, list[dict[str, Any]]]) -> None:
        given[keys.GPU_RESERVATION.kind] = [reservation]
        earlier = {
            "metadata": _meta("earlier", namespace=NS, deletionTimestamp="2026-12-01T10:00:00Z",
                              finalizers=[keys.FINALIZER_CLAIM]),
            "spec": {"class": "h100", "count": 2},
            "status": {"phase": "Attached", "nodeName": "n1", "attachedTo": "old"},
        }  # fmt: skip
        given[keys.GPU_CLAIM.kind] = [_window_claim(reservation, {}), earlier]
        given[keys.VMI.kind] = []
        given[keys.POD.kind] = []

    from test_parts_handle import _handle as make

    handle = make({}, change=change)
    part = Windows(handle)
    part.run(START + 5)
    assert handle.decided == [], "bound over units another claim still holds"
    handle.view.apply(
        keys.GPU_CLAIM.kind,
        {"metadata": _meta("earlier", namespace=NS), "spec": {}, "status": {}},
        deleted=True,
    )
    handle.snapshot = handle.view.build_snapshot(START + 6)
    part.run(START + 6)
    [(bound, _decision)] = handle.decided
    assert (bound.node, bound.phase.value) == ("n1", "Bound")
