"""The binder's ResourceClaims part (binder/parts/dra_claims.py) against a fake handle: one
write per ResourceClaim out at a time, a claim looked at again when its write is answered
whatever the answer changed, and a turn that walks no claim whose write is still out."""

from __future__ import annotations

from typing import Any

import pytest
from test_parts_handle import NOW, FakeHandle

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Outcome
from cozystack_gpu.binder.calls.dra_claims import ResourceClaimCreate
from cozystack_gpu.binder.parts.dra_claims import DraClaims
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.model import ClaimKey
from cozystack_gpu_testkit.dra_objects import (
    VFIO_DEVICE_CLASS,
    dra_class,
    gpu_claim,
    passthrough_node,
)
from cozystack_gpu_testkit.objects import binder_config

NS = "tenant"


def _held(name: str) -> dict[str, Any]:
    claim = gpu_claim(name, 1, NS)
    claim["metadata"]["resourceVersion"] = "1"
    claim["status"] = {"phase": "Bound", "nodeName": "n1", "boundAt": "2026-12-07T10:00:00Z"}
    return claim


def _handle(claims: int) -> FakeHandle:
    config = binder_config("ctl", dra="true")
    view = ClusterView(config, config.watches)
    given: dict[str, list[dict[str, Any]]] = {
        keys.NODE.kind: [
            {
                "metadata": {"name": "n1", "resourceVersion": "1", "uid": "uid-n1"},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
        ],
        keys.GPU_CLASS.kind: [dra_class("h100")],
        keys.DEVICE_CLASS.kind: [VFIO_DEVICE_CLASS],
        keys.RESOURCE_SLICE.kind: passthrough_node("n1", 8),
        keys.NAMESPACE.kind: [{"metadata": {"name": NS, "uid": "uid-ns"}}],
        keys.GPU_CLAIM.kind: [_held(f"c{i}") for i in range(claims)],
    }
    for kind in view.kinds:
        view.relist(kind, given.get(kind, []))
    return FakeHandle(view, view.build_snapshot(NOW), config)


def _creates(handle: FakeHandle) -> list[ClaimKey]:
    return [ClaimKey(c.namespace, c.name) for c in handle.of(ResourceClaimCreate)]


def test_each_held_claim_gets_one_create_while_its_create_is_out() -> None:
    handle = _handle(3)
    part = DraClaims(handle)
    for _turn in range(3):
        part.run()
    assert sorted(_creates(handle)) == [ClaimKey(NS, f"c{i}") for i in range(3)]
    made = handle.of(ResourceClaimCreate)[0].body
    assert made["metadata"]["name"] == "c0" and made["metadata"]["namespace"] == NS


def test_a_create_answered_with_a_failure_is_sent_again_though_the_view_did_not_change() -> None:
    """The answer changed nothing the view holds, so no watch event marks the claim again:
    the answer itself must."""
    handle = _handle(1)
    part = DraClaims(handle)
    part.run()
    [create] = handle.of(ResourceClaimCreate)
    handle.answer(create, Outcome.FAILED, error="the server is away", code=503)
    part.run()
    assert _creates(handle) == [ClaimKey(NS, "c0")] * 2
    part.run()
    assert len(_creates(handle)) == 2, "the second create is out: one at a time"


def test_a_turn_walks_no_claim_whose_write_is_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """During a burst thousands of creates wait behind the binds: a turn that walked them
    all, asking for each whether its write was out, was most of the leader's time
    (BENCHMARKS.md, issue 45)."""
    handle = _handle(50)
    part = DraClaims(handle)
    part.run()
    assert len(_creates(handle)) == 50
    looked: list[tuple[str, str, str]] = []
    writing, claim = handle.writing, handle.view.claim
    monkeypatch.setattr(handle, "writing", lambda key: looked.append(key) or writing(key))
    monkeypatch.setattr(handle.view, "claim", lambda key: looked.append(key) or claim(key))
    for _turn in range(5):
        part.run()
    assert looked == [], "nothing changed and every claim's write is out"
    first = handle.of(ResourceClaimCreate)[0]
    handle.answer(first, Outcome.FAILED, error="refused", code=500)
    part.run()
    assert {(k[-2], k[-1]) for k in looked} == {(NS, "c0")}, "only the answered claim"
