"""Every replica's read-only snapshot: built once every kind is listed, kept current by
events, and what the claim webhook judges orders with."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.admission import handle_catalog
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.admission.handle_catalog import NOT_SYNCED, ClaimWebhook
from cozystack_gpu.cluster.informer import Event, EventType
from cozystack_gpu.model import ClaimInfo, Placement, Refusal
from cozystack_gpu_testkit.objects import binder_config

H100 = "nvidia.com/GH100_H100"
NOW = 1_800_000_000.0


def node(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1", "managedFields": [{"manager": "x"}]},
        "status": {
            "allocatable": {H100: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpunode(name: str, gpus: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "devices": [
                {"pciAddress": f"0000:{i:02x}:00.0", "resourceName": H100, "allocatable": 1}
                for i in range(gpus)
            ],
            "resourceNames": [H100],
        },
    }


def gpu_class(name: str = "h100") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": "1"},
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": H100}}},
    }


def bound(name: str, node_name: str, rv: str = "2") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "tenant-a", "resourceVersion": rv},
        "spec": {"class": "h100", "count": 1},
        "status": {"phase": "Bound", "nodeName": node_name},
    }


def listed(kind: keys.ApiKind, *objects: dict[str, Any]) -> Event:
    return Event(kind.kind, EventType.LISTED, objects=objects)


def full_listing(*claims: dict[str, Any]) -> list[Event]:
    given = {
        keys.NODE.kind: (node("n1", 2),),
        keys.GPU_NODE.kind: (gpunode("n1", 2),),
        keys.GPU_CLASS.kind: (gpu_class(),),
        keys.GPU_CLAIM.kind: claims,
        keys.NAMESPACE.kind: ({"metadata": {"name": "tenant-a", "resourceVersion": "1"}},),
    }
    return [listed(kind, *given.get(kind.kind, ())) for kind in keys.BINDER_WATCHES]


def order(count: int = 1) -> ClaimInfo:
    return ClaimInfo("tenant-a", "new", "h100", count)


@pytest.fixture
def feed() -> SnapshotFeed:
    # Never started: the test hands it the events its informers would.
    return SnapshotFeed(client.ApiClient(), binder_config("ctl"), clock=lambda: NOW)


def test_nothing_is_judged_before_every_kind_is_listed(feed: SnapshotFeed) -> None:
    feed.take(full_listing()[:-1])
    assert not feed.synced.is_set()
    assert feed.check_order(order(), NOW) is None
    assert feed.largest_node("h100") is None


def test_the_first_build_waits_until_the_binder_has_passed(feed: SnapshotFeed) -> None:
    """In the leader the webhooks' snapshot is built after the binder's first pass: listed
    in full, it waits until ``build_after`` says so, then is built at the next turn."""
    passed = threading.Event()
    waiting = SnapshotFeed(
        client.ApiClient(), binder_config("ctl"), clock=lambda: NOW, build_after=passed.is_set
    )
    waiting.take(full_listing(bound("a", "n1")))
    assert not waiting.synced.is_set()
    assert waiting.check_order(order(), NOW) is None
    passed.set()
    waiting.take([])
    assert waiting.synced.is_set()
    assert waiting.check_order(order(), NOW) == Placement("n1")


def test_orders_are_judged_against_what_the_watches_delivered(feed: SnapshotFeed) -> None:
    feed.take(full_listing(bound("a", "n1")))
    assert feed.synced.is_set()
    assert feed.check_order(order(), NOW) == Placement("n1")
    decision = feed.check_order(order(2), NOW)
    assert isinstance(decision, Refusal)
    assert decision.message == "no node serving class h100 has 2 free units; the largest has 1"
    # A claim released by a later event frees its unit.
    feed.take([Event(keys.GPU_CLAIM.kind, EventType.DELETED, obj=bound("a", "n1", "3"))])
    assert feed.check_order(order(2), NOW) == Placement("n1")
    assert feed.largest_node("h100") == 2


def raw_pod(node_name: str) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": "raw", "namespace": "tenant-a", "resourceVersion": "4",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{...}"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": {
            "nodeName": node_name,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "cuda", "image": "cuda:12", "env": [{"name": "A", "value": "1"}],
                "resources": {"limits": {H100: "1"}},
            }],
        },
        "status": {"phase": "Running", "podIP": "10.0.0.7"},
    }  # fmt: skip


def test_a_pod_using_the_raw_name_takes_its_unit(feed: SnapshotFeed) -> None:
    """A pod requesting the class's resource name outside any claim occupies the node (the
    shared cache drops its managedFields, tests/unit/test_shared_cache.py, nothing more)."""
    feed.take(full_listing(bound("a", "n1")))
    feed.take([Event(keys.POD.kind, EventType.ADDED, obj=raw_pod("n1"))])
    decision = feed.check_order(order(), NOW)
    assert isinstance(decision, Refusal)
    assert decision.message == "no node serving class h100 has 1 free unit; the largest has 0"


def test_a_replica_that_has_not_read_the_cluster_refuses_orders_retryably(
    feed: SnapshotFeed,
) -> None:
    """An order that reaches a replica before its first listing is not admitted unchecked
    (it could take a budget's last unit twice): it is refused with a code that says "try
    again", and judged once the replica has read the cluster."""
    webhook = ClaimWebhook(feed, access=None, clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "c", "namespace": "tenant-a"}, "spec": {"class": "h100"}}
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.code == 503, "an unchecked order was admitted"
    assert refused.value.reason == keys.AdmissionReason.REPLICA_NOT_SYNCED
    assert refused.value.message == NOT_SYNCED
    assert "try again" in NOT_SYNCED
    feed.take(full_listing(bound("a", "n1"), bound("b", "n1")))
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.message == "no node serving class h100 has 1 free unit; the largest has 0"


class ClassesAt:
    """The API server's classes, as the claim webhook reads them to tell a missing class
    from one this replica has not seen yet."""

    def __init__(self, *names: str) -> None:
        self.names = names

    def classes(self, latest: bool = False) -> dict[str, Any]:
        return {n: gpu_class(n) for n in self.names}


def test_an_order_of_a_class_the_replica_has_not_seen_yet_is_refused_retryably(
    feed: SnapshotFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class created moments ago may not have reached this replica's view: the order
    is not admitted unchecked but refused with "try again" (after a short wait for it)."""
    monkeypatch.setattr(handle_catalog, "CLASS_LAG_WAIT_S", 0.0)
    feed.take(full_listing())
    webhook = ClaimWebhook(feed, ClassesAt("h100", "a100"), clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "c", "namespace": "tenant-a"}, "spec": {"class": "a100"}}
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.code == 503, "an order of an unseen class was admitted unchecked"
    assert refused.value.reason == keys.AdmissionReason.REPLICA_NOT_SYNCED
    assert refused.value.message == (
        "this controller replica has not seen GPUClass a100 yet (it was created moments ago), "
        "so it cannot check the order against budgets and capacity; try again in a few seconds"
    )


def test_an_order_of_a_class_seen_while_waiting_is_judged(
    feed: SnapshotFeed, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(handle_catalog, "CLASS_LAG_WAIT_S", 5.0)
    feed.take(full_listing())
    webhook = ClaimWebhook(feed, ClassesAt("h100", "a100"), clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {
        "metadata": {"name": "c", "namespace": "tenant-a"},
        "spec": {"class": "a100", "count": 1},
    }
    late = gpu_class("a100")
    late["spec"]["source"]["devicePlugin"]["resourceName"] = "nvidia.com/GA100"
    seen = threading.Timer(
        0.2, lambda: feed.take([Event(keys.GPU_CLASS.kind, EventType.ADDED, obj=late)])
    )
    seen.start()
    try:
        with pytest.raises(Refused) as refused:
            webhook.admit_create(claim)
    finally:
        seen.join()
    # Judged by the model once the class is known (no node has its resource name).
    assert refused.value.code == 403
    assert refused.value.message.startswith("no node serves class a100"), refused.value


def test_orders_are_refused_when_the_feed_has_died(feed: SnapshotFeed) -> None:
    feed._threads.failure = "RuntimeError: boom"  # as its thread records a failure
    webhook = ClaimWebhook(feed, access=None, clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "c", "namespace": "tenant-a"}, "spec": {"class": "h100"}}
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.code == 500
    assert "its watch feed stopped (RuntimeError: boom)" in refused.value.message
