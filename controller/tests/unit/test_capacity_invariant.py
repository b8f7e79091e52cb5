"""The invariant checker's capacity rule on hand-made states: what holds a node's units
(claims, and what launcher pods use beyond their own VMI's claims), and a node that loses a
unit by the hardware's doing under claims bound before the loss."""

from __future__ import annotations

import datetime
import time
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit.invariants import CAPACITY, START_GRACE_S, Invariants, State

NS, NODE, RESOURCE = "tenant", "n1", "nvidia.com/X"
OLD = "2026-01-01T00:00:00Z"


def _stamp(seconds_from_now: float) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _claim(name: str, bound_at: str = OLD, attached: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Bound", "nodeName": NODE, "boundAt": bound_at}
    if attached:
        status.update(phase="Attached", attachedTo=attached)
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"c-{name}"},
        "spec": {"class": "a", "count": 1},
        "status": status,
    }


def _vmi(uid: str, created: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "vm", "namespace": NS, "uid": uid, "creationTimestamp": created},
        "status": {"phase": "Running", "nodeName": NODE},
    }


def _launcher(uid: str, created: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"virt-launcher-vm-{uid}",
            "namespace": NS,
            "creationTimestamp": created,
            "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
            "ownerReferences": [
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                 "name": "vm", "uid": uid, "controller": True}
            ],
        },
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "compute", "resources": {"limits": {RESOURCE: "1"}}}],
        },
        "status": {"phase": "Running"},
    }  # fmt: skip


def _state(units: int, claims: list[dict[str, Any]], **kw: Any) -> State:
    return State(
        nodes=[{"metadata": {"name": NODE}, "status": {"allocatable": {RESOURCE: str(units)}}}],
        gpunodes=[
            {
                "metadata": {"name": NODE},
                "status": {"devices": [{"resourceName": RESOURCE, "allocatable": 2}]},
            }
        ],
        classes=[
            {
                "metadata": {"name": "a"},
                "spec": {"source": {"devicePlugin": {"resourceName": RESOURCE}}},
            }
        ],
        claims=claims,
        namespaces=[],
        quotas=[],
        pods=kw.get("pods", []),
        workloads=[],
        vmis=kw.get("vmis", []),
    )


def _over(checker: Invariants, state: State) -> bool:
    return any(v.rule == CAPACITY for v in checker.check(state))


def test_two_claims_on_a_node_of_one_unit_are_over_capacity() -> None:
    checker = Invariants(client.ApiClient())
    assert _over(checker, _state(1, [_claim("a"), _claim("b")]))
    assert not _over(checker, _state(2, [_claim("a"), _claim("b")]))


def test_a_unit_lost_under_claims_bound_before_is_not_the_binders_doing() -> None:
    checker = Invariants(client.ApiClient())
    checker.capacity_lost(NODE)
    assert not _over(checker, _state(1, [_claim("a"), _claim("b")]))
    # A claim bound there well after the loss was placed on a node without room.
    assert _over(checker, _state(1, [_claim("a"), _claim("b", bound_at=_stamp(10))]))
    # Once the node has its unit back, the loss excuses nothing more.
    checker.capacity_restored(NODE)
    assert _over(checker, _state(1, [_claim("a"), _claim("b")]))


def test_a_look_read_while_the_unit_was_lost_is_judged_as_of_then() -> None:
    """The checker's thread may have read the node short of its unit just before the test
    gave it back: that look is judged with the loss, whenever its rules run."""
    checker = Invariants(client.ApiClient())
    checker.capacity_lost(NODE)
    read_while_lost = _state(1, [_claim("a"), _claim("b")])
    read_while_lost.read_at = time.time() - 1.0
    checker.capacity_restored(NODE)
    assert not _over(checker, read_while_lost)
    read_after = _state(1, [_claim("a"), _claim("b")])
    read_after.read_at = time.time() + 1.0
    assert _over(checker, read_after)


def test_a_launcher_pod_counts_beyond_its_own_vmis_claims_only() -> None:
    checker = Invariants(client.ApiClient())
    held = [_claim("a", attached="other")]
    running = _vmi("u2", "2026-12-01T10:05:00Z")
    # The pod of the VMI now under that name, its claims elsewhere: it holds its unit.
    own = _launcher("u2", "2026-12-01T10:05:01Z")
    assert _over(checker, _state(1, held, vmis=[running], pods=[own]))
    # The finishing pod of the VMI before it (older than the running one): nothing.
    earlier = _launcher("u1", "2026-12-01T10:00:01Z")
    assert not _over(checker, _state(1, held, vmis=[running], pods=[earlier]))
    # A pod whose VMI is gone at that moment: nothing either.
    assert not _over(checker, _state(1, held, vmis=[], pods=[own]))


def _reservation(name: str, phase: str, start: float, end: float) -> dict[str, Any]:
    def at(t: float) -> str:
        return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"r-{name}"},
        "spec": {"class": "a", "count": 1, "start": at(start), "end": at(end)},
        "status": {"phase": phase, "nodeName": NODE},
    }


def _window_claim(name: str) -> dict[str, Any]:
    claim = _claim(name)
    claim["metadata"]["labels"] = {keys.LABEL_RESERVATION: name}
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": keys.API_VERSION, "kind": keys.KIND_RESERVATION, "name": name,
         "uid": f"r-{name}", "controller": True}
    ]  # fmt: skip
    return claim


def test_an_open_windows_claim_holds_its_unit_until_the_end_only() -> None:
    """SPEC §11: the claim an Active window made is the window's until its end; a window
    booked after that end may count on the same unit, one that overlaps may not."""
    checker = Invariants(client.ApiClient())
    now = time.time()
    hour = 3600.0
    ending = _reservation("now", "Active", now - hour, now + hour)
    after = _reservation("later", "Booked", now + hour, now + 2 * hour)
    state = _state(1, [_window_claim("now")])
    state.reservations = [ending, after]
    assert not _over(checker, state), "back-to-back windows share the unit"
    overlapping = _reservation("later", "Booked", now + hour / 2, now + 2 * hour)
    state.reservations = [ending, overlapping]
    assert _over(checker, state)
    # A claim whose window has ended (its deletion waits) holds its unit for good.
    ended = _reservation("now", "Ended", now - 2 * hour, now - hour)
    state.reservations = [ended, after]
    assert _over(checker, state)


def test_a_window_that_just_ended_has_its_claims_release_due_not_held() -> None:
    """Back-to-back windows on one unit: when the first ends, its claim's release is the
    leader's next write (a leader killed then takes its Lease first), while the next window
    counts from its start. For the checker's start grace the ended window's claim holds
    nothing; past it, it holds its unit as any claim (the fault suite saw a new leader end
    a window a few seconds late)."""
    checker = Invariants(client.ApiClient())
    now = time.time()
    next_window = _reservation("later", "Booked", now - 5, now + 3600)
    state = _state(1, [_window_claim("now")])
    for phase in ("Active", "Ended"):
        state.reservations = [_reservation("now", phase, now - 3600, now - 5), next_window]
        assert not _over(checker, state), f"{phase}: ended 5 s ago, its release is due"
    late = now - START_GRACE_S - 5
    state.reservations = [_reservation("now", "Active", now - 3600, late), next_window]
    assert _over(checker, state), "its release is overdue: it holds the unit again"


def test_a_migration_target_counts_on_its_node_and_its_pod_is_covered_there() -> None:
    """SPEC §12: while a live migration runs, the set's target holds units on the target
    node beside the source's; its target pod is covered by them, not counted again."""
    checker = Invariants(client.ApiClient())
    moving = _claim("a", attached="vm")
    moving["status"]["migration"] = {"node": "n2", "migrationUID": "m1", "since": OLD}
    vmi = _vmi("u1", OLD)
    vmi["metadata"]["labels"] = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    vmi["metadata"]["annotations"] = {keys.ANNOTATION_CLAIMS: '{"claims": ["a"]}'}
    state = _state(1, [moving], vmis=[vmi])
    devices = {"devices": [{"resourceName": RESOURCE, "allocatable": 1}]}
    state.nodes.append({"metadata": {"name": "n2"}, "status": {"allocatable": {RESOURCE: "1"}}})
    state.gpunodes.append({"metadata": {"name": "n2"}, "status": devices})
    assert not _over(checker, state)
    target_pod = _launcher("u1", "2026-01-01T00:05:00Z")
    target_pod["metadata"]["name"] = "virt-launcher-vm-target"
    target_pod["metadata"]["labels"][keys.LABEL_MIGRATION_JOB_UID] = "m1"
    target_pod["spec"]["nodeName"] = "n2"
    state.pods = [_launcher("u1", OLD), target_pod]
    assert not _over(checker, state), "the target pod counted beside its claim's target"
    other = _claim("b")
    other["status"]["nodeName"] = "n2"
    state.claims = [moving, other]
    assert _over(checker, state), "an order bound on the unit the target holds"


def test_an_open_windows_claim_counts_under_its_budget_until_the_end_only() -> None:
    """SPEC §11, budgets as capacity: a window booked after an open window's end may count
    on the same budget unit; one that overlaps may not."""
    from cozystack_gpu_testkit.invariants import BUDGET

    checker = Invariants(client.ApiClient())
    now = time.time()
    hour = 3600.0
    state = _state(2, [_window_claim("now")])
    state.nodes[0]["status"]["allocatable"][RESOURCE] = "2"
    state.namespaces = [{"metadata": {"name": NS}}]
    state.quotas = [
        {"metadata": {"name": "q", "namespace": NS}, "spec": {"hard": {keys.QUOTA_KEY_TOTAL: "1"}}}
    ]
    ending = _reservation("now", "Active", now - hour, now + hour)
    state.reservations = [ending, _reservation("later", "Booked", now + hour, now + 2 * hour)]
    assert not any(v.rule == BUDGET for v in checker.check(state))
    state.reservations = [ending, _reservation("later", "Booked", now, now + 2 * hour)]
    assert any(v.rule == BUDGET for v in checker.check(state))
