"""What each call's answer changes in the binder's view: the object the server answered
with is taken in (so the next pass judges on what the API holds, not on what was sent),
a refused claim write brings the claim as it is now, and a delete that is done forgets."""

from __future__ import annotations

from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer, Call, Outcome
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.reports import (
    ClassStatus,
    GpuNodeStatus,
    RecordCreate,
    RecordDelete,
    RecordStatus,
)
from cozystack_gpu.binder.calls.start_path import ClaimCreate, PodPin
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu_testkit.objects import binder_config

NS = "tenant-a"


def _view() -> ClusterView:
    config = binder_config("ctl")
    return ClusterView(config, (*keys.BINDER_WATCHES, keys.WORKLOAD))


def _obj(name: str, namespace: str = NS, version: str = "7") -> dict[str, Any]:
    meta = {"name": name, "resourceVersion": version, "uid": f"uid-{name}"}
    if namespace:
        meta["namespace"] = namespace
    return {"metadata": meta, "spec": {}, "status": {"written": True}}


CASES: list[tuple[Call, keys.ApiKind]] = [
    (Decision(NS, "c", {"status": {}}, "Bind"), keys.GPU_CLAIM),
    (ClaimNote(NS, "c", {"status": {}}, Note.WAIT), keys.GPU_CLAIM),
    (ClaimCreate(NS, "c", {"metadata": {"name": "c"}}), keys.GPU_CLAIM),
    (PodPin(NS, "c", {"spec": {}}), keys.POD),
    (ClassStatus("c", {"status": {}}), keys.GPU_CLASS),
    (GpuNodeStatus("c", {"status": {}}), keys.GPU_NODE),
    (RecordCreate(NS, {"metadata": {"name": "c"}}), keys.WORKLOAD),
    (RecordStatus(NS, "c", {"status": {}}), keys.WORKLOAD),
]


@pytest.mark.parametrize(("call", "kind"), CASES, ids=lambda c: type(c).__name__)
def test_a_written_answer_brings_the_servers_object_into_the_view(
    call: Call, kind: keys.ApiKind
) -> None:
    view = _view()
    namespace = NS if kind.namespaced else ""
    call.apply(Answer(call, Outcome.WRITTEN, _obj("c", namespace)), view)
    held = view.raw[kind.kind].get((namespace, "c"))
    assert held is not None and held["status"] == {"written": True}
    assert held["kind"] == kind.kind


def test_a_refused_decision_brings_the_claim_as_it_is_now_and_marks_it_for_judging() -> None:
    view = _view()
    call = Decision(NS, "c", {"status": {}}, "Bind")
    view.take_dirty()
    call.apply(Answer(call, Outcome.CONFLICT, _obj("c"), "409 Conflict"), view)
    assert view.claim(call.claim) is not None
    assert call.claim in view.dirty.claims


def test_a_decision_on_a_claim_that_is_gone_forgets_it() -> None:
    view = _view()
    view.apply(keys.GPU_CLAIM.kind, _obj("c", version="3"), deleted=False)
    call = Decision(NS, "c", {"status": {}}, "Bind")
    call.apply(Answer(call, Outcome.GONE), view)
    assert view.claim(call.claim) is None


def test_a_record_delete_done_forgets_the_record_and_a_failed_one_keeps_it() -> None:
    view = _view()
    view.apply(keys.WORKLOAD.kind, _obj("r", version="3"), deleted=False)
    call = RecordDelete(NS, "r")
    call.apply(Answer(call, Outcome.FAILED, error="500"), view)
    assert (NS, "r") in view.raw[keys.WORKLOAD.kind]
    call.apply(Answer(call, Outcome.WRITTEN), view)
    assert (NS, "r") not in view.raw[keys.WORKLOAD.kind]
