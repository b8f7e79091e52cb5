"""A reservation's window against the real API server (SPEC §11), the binder's clock moved
through it: at the start the window's claim is made, owned by the reservation and Bound on
the booked node, and counted once (orders keep what the window leaves); the VM runs on it;
warnBefore ahead of the end the reservation and the VMI are told; at the end the VM is
halted, the claim deleted once the VMI stops, and the reservation Ended.

No webhook runs here (binder_env.py): the tenant's writes are its own role's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import GRACE_S, Env, condition
from test_admission_reservations import tomorrow
from test_binder_bookings import reservation, reserve, wait_reservation
from test_binder_events import events_of

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit.objects import binder_config, unless, wait_for

pytestmark = pytest.mark.apiserver


class Clock:
    """The binder's clock, moved by the test: a window of hours passes in seconds."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked(env: Env) -> Iterator[tuple[Env, Clock]]:
    """The test's binder again, on a clock the test moves (now, to begin with)."""
    clock = Clock(tomorrow(9).timestamp() - 86_400 / 2)
    env.binder.stop()
    # Hours pass in seconds: no node agent's report would stay fresh, so none goes stale.
    config = binder_config(env.controller_ns, attachment_grace=GRACE_S, inventory_stale_after=0)
    env.binder = Binder(env.kube.api, config, clock=clock)
    env.binder.start()
    assert env.binder.synced.wait(30)
    yield env, clock


def running_vm(env: Env, name: str, claim: str, node: str) -> None:
    """A VirtualMachine whose template holds ``claim``, and its VMI Running on ``node``
    with the claim attached, as KubeVirt and the VMI webhook would leave them."""
    notes = {keys.ANNOTATION_CLAIMS: json.dumps({"claims": [claim]})}
    labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    vm = env.kube.custom.create_namespaced_custom_object(
        keys.VM.group, keys.VM.version, env.tenant, keys.VM.plural,
        {
            "apiVersion": keys.VM.api_version, "kind": keys.VM.kind,
            "metadata": {"name": name},
            "spec": {
                "running": True,
                "template": {
                    "metadata": {"labels": labels, "annotations": notes},
                    "spec": {"domain": {"devices": {}}},
                },
            },
        },
    )  # fmt: skip
    owner = {"apiVersion": keys.VM.api_version, "kind": keys.VM.kind, "name": name,
             "uid": vm["metadata"]["uid"], "controller": True}  # fmt: skip
    env.kube.custom.create_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural,
        {
            "apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind,
            "metadata": {"name": name, "labels": labels, "annotations": notes,
                         "ownerReferences": [owner]},
            "spec": {"domain": {"devices": {}}},
        },
    )  # fmt: skip
    env.kube.vmi_phase(env.tenant, name, "Running", node)
    env.kube.attach(env.tenant, claim, name)


def vm_spec(env: Env, name: str) -> dict[str, Any]:
    obj = env.kube.custom.get_namespaced_custom_object(
        keys.VM.group, keys.VM.version, env.tenant, keys.VM.plural, name
    )
    return dict(obj["spec"])


def test_a_window_opens_holds_its_vm_warns_and_ends_it(clocked: tuple[Env, Clock]) -> None:
    env, clock = clocked
    node = env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    reserve(env.tenant_admin(), env.tenant, "train", gpu_class, 2)
    wait_reservation(env, "train", "Booked")
    start, end = tomorrow(9).timestamp(), tomorrow(18).timestamp()

    # The window opens: its claim, owned by the reservation, Bound where it was booked.
    clock.now = start + 60
    active = wait_reservation(env, "train", "Active")
    assert condition(active, keys.CONDITION_BOOKED)["reason"] == "WindowOpen"
    claim = env.wait_phase("train", "Bound")
    assert claim["status"]["nodeName"] == node
    assert claim["metadata"]["labels"] == {keys.LABEL_RESERVATION: "train"}
    [owner] = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"]) == (keys.KIND_RESERVATION, active["metadata"]["uid"])
    # Counted once: an order takes the other two units, not a third.
    env.kube.claim(env.tenant, "two", gpu_class, 2)
    env.wait_phase("two", "Bound")
    env.kube.claim(env.tenant, "more", gpu_class, 1)

    def refused() -> dict[str, Any] | None:
        found = condition(env.kube.get_claim(env.tenant, "more"))
        return found if found.get("reason") == "InsufficientCapacity" else None

    wait_for(refused, 15, "a third order refused: the node is full")

    # The VM runs on the window's claim.
    running_vm(env, "trainer", "train", node)
    env.wait_phase("train", "Attached")

    # warnBefore (30 min) ahead of the end: the reservation and the VMI are told.
    clock.now = end - 30 * 60

    def warned() -> dict[str, Any] | None:
        found = condition(reservation(env, "train"), keys.CONDITION_ENDING)
        return found if found.get("status") == "True" else None

    ending = wait_for(warned, 15, "the Ending condition")
    assert ending["reason"] == "WindowEnding" and "in 30m" in ending["message"]
    told = wait_for(
        lambda: [e for e in events_of(env.kube, env.tenant, "trainer")
                 if e["reason"] == "WindowEnding"] or None,
        15, "the VMI's WindowEnding event",
    )  # fmt: skip
    assert told[0]["involvedObject"]["kind"] == keys.VMI.kind

    # The end: the VM halted, the claim deleted once its VMI stops, the window Ended.
    clock.now = end
    wait_for(
        lambda: vm_spec(env, "trainer").get("runStrategy") == "Halted" or None, 15, "VM halted"
    )
    assert "running" not in vm_spec(env, "trainer")
    ended = wait_reservation(env, "train", "Ended")
    assert condition(ended, keys.CONDITION_BOOKED)["reason"] == "WindowEnded"
    # Deleted, and kept by its finalizer until its VMI stops (the delete and the Ended
    # status are separate writes: either may land first).
    wait_for(
        lambda: env.kube.get_claim(env.tenant, "train")["metadata"].get("deletionTimestamp"),
        15,
        "the window's claim deleted, kept until its VMI stops",
    )
    env.kube.delete_vmi(env.tenant, "trainer")  # what virt-controller does for Halted
    wait_for(
        lambda: unless(404, lambda: env.kube.get_claim(env.tenant, "train")) is None or None,
        15,
        "the window's claim gone",
    )
    # Its units are orders' again.
    env.wait_phase("more", "Bound")


def test_a_window_opens_beside_a_tenant_claim_of_its_name_without_taking_it(
    clocked: tuple[Env, Clock],
) -> None:
    env, clock = clocked
    env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    reserve(env.kube, env.tenant, "train", gpu_class, 2)
    wait_reservation(env, "train", "Booked")
    env.kube.claim(env.tenant, "train", gpu_class, 1)  # the tenant's own order, same name
    env.wait_phase("train", "Bound")
    clock.now = tomorrow(9).timestamp()
    wait_reservation(env, "train", "Active")

    def said() -> dict[str, Any] | None:
        found = condition(reservation(env, "train"), keys.CONDITION_BOOKED)
        return found if found.get("reason") == "ClaimNameTaken" else None

    assert "delete that claim" in wait_for(said, 15, "the window says its name is taken")["message"]
    order = env.kube.get_claim(env.tenant, "train")
    assert keys.LABEL_RESERVATION not in (order["metadata"].get("labels") or {})
    assert order["spec"]["count"] == 1, "the order stays as the tenant made it"
    clock.now = tomorrow(18).timestamp()
    wait_reservation(env, "train", "Ended")
    assert not env.kube.get_claim(env.tenant, "train")["metadata"].get("deletionTimestamp"), (
        "the end deletes only the claim the window made"
    )
