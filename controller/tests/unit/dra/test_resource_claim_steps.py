"""What a claim of a ``dra`` class needs of its ResourceClaim next (``rules.dra_claims``):
made once the claim is held, reserved for the claim once kube-scheduler allocated it on the
claim's node, let go (reservation out, then deleted) once the claim is held elsewhere and
no VM runs on it; never touched when someone else made it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cozystack_gpu.binder.rules.dra_claims import (
    Step,
    allocated_node,
    next_step,
    reserved_for_with,
)
from cozystack_gpu.objects import dra
from cozystack_gpu_testkit.dra_objects import gpu_claim

SOURCE = dra.DraSource("vfio.gpu.nvidia.com")


def _claim(phase: str | None = "Bound", node: str | None = "n1", **meta: Any) -> dict[str, Any]:
    claim = gpu_claim("c", 2)
    claim["metadata"].update(meta)
    if phase is not None:
        claim["status"] = {"phase": phase, **({"nodeName": node} if node else {})}
    return claim


def _made(
    claim: dict[str, Any], on: str | None = None, consumers: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The controller's ResourceClaim for ``claim``, allocated ``on`` a node or not."""
    made = dra.resource_claim_for(claim, SOURCE)
    if on is not None:
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [on]}]}
        made["status"] = {
            "allocation": {
                "devices": {"results": []},
                "nodeSelector": {"nodeSelectorTerms": [term]},
            },
            "reservedFor": consumers or [],
        }
    return made


POD = {"resource": "pods", "name": "virt-launcher-vm-x", "uid": "pod-uid"}


def test_a_held_claim_without_its_resource_claim_gets_one_and_an_unheld_one_none() -> None:
    assert next_step(_claim(), SOURCE, None) is Step.CREATE
    assert next_step(_claim("Attached"), SOURCE, None) is Step.CREATE
    assert next_step(_claim(None), SOURCE, None) is Step.NONE
    assert next_step(_claim("Lost", None), SOURCE, None) is Step.NONE
    assert next_step(_claim(), None, None) is Step.NONE, "a claim of a devicePlugin class"


def test_an_allocation_on_the_claims_node_is_reserved_for_the_claim_once() -> None:
    claim = _claim()
    assert next_step(claim, SOURCE, _made(claim)) is Step.NONE, "not allocated: nothing yet"
    allocated = _made(claim, on="n1", consumers=[POD])
    assert next_step(claim, SOURCE, allocated) is Step.RESERVE
    reserved = _made(claim, on="n1", consumers=reserved_for_with(allocated, claim, True))
    assert [e.get("resource") for e in reserved["status"]["reservedFor"]] == ["pods", "gpuclaims"]
    assert next_step(claim, SOURCE, reserved) is Step.NONE


def test_an_allocation_left_behind_is_let_go_once_no_vm_runs_on_it() -> None:
    """The claim is held on n2 now; its ResourceClaim is allocated on n1."""
    moved = _claim(node="n2")
    entry = dra.reserved_for_entry(moved)
    assert next_step(moved, SOURCE, _made(moved, on="n1", consumers=[POD, entry])) is Step.NONE
    assert next_step(moved, SOURCE, _made(moved, on="n1", consumers=[entry])) is Step.RELEASE
    assert next_step(moved, SOURCE, _made(moved, on="n1")) is Step.DELETE
    deleting = _made(moved, on="n1")
    deleting["metadata"]["deletionTimestamp"] = "2026-12-07T10:00:00Z"
    assert next_step(moved, SOURCE, deleting) is Step.NONE, "deleted once, then waited for"
    lost = _claim("Lost", "n1")
    assert next_step(lost, SOURCE, _made(lost, on="n1", consumers=[entry])) is Step.RELEASE


def test_a_claim_being_deleted_takes_its_entry_out_and_nothing_more() -> None:
    claim = _claim(deletionTimestamp="2026-12-07T10:00:00Z")
    entry = dra.reserved_for_entry(claim)
    assert next_step(claim, SOURCE, _made(claim, on="n1", consumers=[POD, entry])) is Step.RELEASE
    assert next_step(claim, SOURCE, _made(claim, on="n1", consumers=[POD])) is Step.NONE
    assert next_step(claim, SOURCE, None) is Step.NONE


@pytest.mark.parametrize("forged", ["other-uid", None])
def test_a_resource_claim_of_the_claims_name_it_was_not_made_for_is_never_touched(
    forged: str | None,
) -> None:
    claim = _claim()
    theirs = _made(claim, on="n1")
    if forged is None:
        theirs["metadata"]["ownerReferences"] = []
    else:
        theirs["metadata"]["ownerReferences"][0]["uid"] = forged
    assert next_step(claim, SOURCE, theirs) is Step.NAME_TAKEN


def test_reserved_for_keeps_the_other_consumers_as_they_are() -> None:
    claim = _claim()
    entry = dra.reserved_for_entry(claim)
    made = _made(claim, on="n1", consumers=[POD, copy.deepcopy(entry)])
    assert reserved_for_with(made, claim, False) == [POD]
    assert reserved_for_with(made, claim, True) == [POD, entry], "listed once, not twice"


def test_the_allocated_node_is_read_from_the_allocations_node_selector() -> None:
    claim = _claim()
    assert allocated_node(_made(claim)) is None
    assert allocated_node(_made(claim, on="n7")) == "n7"
    anywhere = _made(claim, on="n7")
    anywhere["status"]["allocation"].pop("nodeSelector")
    assert allocated_node(anywhere) == ""


def test_a_resource_claim_whose_claim_is_gone_lets_the_claims_entry_go() -> None:
    """The claim's finalizer may come off before its entry is out (or the controller was
    down): the ResourceClaim the garbage collector deletes must not stay allocated for a
    claim that no longer exists."""
    claim = _claim()
    entry = dra.reserved_for_entry(claim)
    orphan = _made(claim, on="n1", consumers=[POD, entry])
    assert next_step(None, SOURCE, orphan) is Step.RELEASE
    assert reserved_for_with(orphan, None, False) == [POD]
    assert next_step(None, SOURCE, _made(claim, on="n1", consumers=[POD])) is Step.NONE
    assert next_step(None, None, None) is Step.NONE
