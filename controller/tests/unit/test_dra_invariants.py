"""The invariant checker on a ``dra`` class (SPEC §13), on hand-made states: its units are
counted against the devices of the node's ResourceSlices its DeviceClass matches, and each
held claim has one ResourceClaim of its own, allocated only on the claim's node."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit.dra_objects import VFIO_CLASS, VFIO_DEVICE_CLASS, passthrough_node
from cozystack_gpu_testkit.invariants import CAPACITY, DRA_NOT_FOLLOWED, Invariants, State

NS = "tenant"


def _claim(name: str, node: str = "n1", count: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {"class": "h100", "count": count},
        "status": {"phase": "Bound", "nodeName": node, "boundAt": "2026-01-01T00:00:00Z"},
    }


def _resource_claim(claim: str, node: str | None = None, owner_uid: str = "") -> dict[str, Any]:
    """The claim's ResourceClaim, allocated ``gpu-vfio-0`` of ``node``'s pool when given."""
    body: dict[str, Any] = {
        "metadata": {
            "name": claim,
            "namespace": NS,
            "ownerReferences": [
                {"apiVersion": keys.API_VERSION, "kind": keys.KIND_CLAIM, "name": claim,
                 "uid": owner_uid or f"uid-{claim}", "controller": True}
            ],
        },
        "status": {},
    }  # fmt: skip
    if node is not None:
        result = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node}
        body["status"]["allocation"] = {
            "devices": {"results": [{**result, "device": "gpu-vfio-0"}]}
        }
    return body


def _state(claims: list[dict[str, Any]], resource_claims: list[dict[str, Any]]) -> State:
    """Nodes n1 and n2, each with 2 GPUs in both forms; class h100 over the VFIO ones."""
    return State(
        nodes=[{"metadata": {"name": n}, "status": {"allocatable": {}}} for n in ("n1", "n2")],
        gpunodes=[],
        classes=[
            {
                "metadata": {"name": "h100"},
                "spec": {"source": {"dra": {"deviceClassName": VFIO_CLASS}}},
            }
        ],
        claims=claims,
        namespaces=[],
        quotas=[],
        pods=[],
        workloads=[],
        vmis=[],
        resource_slices=[*passthrough_node("n1", 2), *passthrough_node("n2", 2)],
        device_classes=[copy.deepcopy(VFIO_DEVICE_CLASS)],
        resource_claims=resource_claims,
    )


def _rules(state: State) -> set[tuple[str, str]]:
    """The capacity and dra rules broken (the states have no usage records to judge)."""
    found = Invariants(client.ApiClient()).settled(state)
    return {(v.rule, v.subject) for v in found if v.rule in (CAPACITY, DRA_NOT_FOLLOWED)}


def test_a_dra_class_holds_no_more_than_the_vfio_devices_its_device_class_matches() -> None:
    # Each node publishes 4 devices, 2 of them VFIO: 2 units of the class fit, 3 do not.
    fits = [_claim("a", count=2)]
    assert (CAPACITY, "n1/dra:h100") not in _rules(_state(fits, [_resource_claim("a")]))
    over = [_claim("a", count=2), _claim("b")]
    found = _rules(_state(over, [_resource_claim("a"), _resource_claim("b")]))
    assert (CAPACITY, "n1/dra:h100") in found


def test_a_held_dra_claim_without_its_resource_claim_is_not_followed() -> None:
    assert (DRA_NOT_FOLLOWED, f"{NS}/a") in _rules(_state([_claim("a")], []))
    # Another claim's ResourceClaim does not stand in for it.
    other = _resource_claim("a", owner_uid="uid-someone-else")
    assert (DRA_NOT_FOLLOWED, f"{NS}/a") in _rules(_state([_claim("a")], [other]))


def test_a_resource_claim_allocated_off_its_claims_node_is_not_followed() -> None:
    assert not _rules(_state([_claim("a", "n1")], [_resource_claim("a", "n1")]))
    found = _rules(_state([_claim("a", "n1")], [_resource_claim("a", "n2")]))
    assert (DRA_NOT_FOLLOWED, f"{NS}/a") in found


def test_a_resource_claim_that_outlives_its_claim_is_not_followed() -> None:
    assert (DRA_NOT_FOLLOWED, f"{NS}/gone") in _rules(_state([], [_resource_claim("gone")]))
