"""Every replica's read-only snapshot: built once every kind is listed, kept current by
events, and what the claim webhook judges orders with."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu import keys
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


def test_an_order_is_admitted_with_a_warning_before_the_replica_has_read_the_cluster(
    feed: SnapshotFeed,
) -> None:
    webhook = ClaimWebhook(feed, access=None, clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "c", "namespace": "tenant-a"}, "spec": {"class": "h100"}}
    assert webhook.admit_create(claim) == [NOT_SYNCED]
    feed.take(full_listing(bound("a", "n1"), bound("b", "n1")))
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.message == "no node serving class h100 has 1 free unit; the largest has 0"


def test_orders_are_refused_when_the_feed_has_died(feed: SnapshotFeed) -> None:
    feed.failure = "RuntimeError: boom"
    webhook = ClaimWebhook(feed, access=None, clock=lambda: NOW)  # type: ignore[arg-type]
    claim = {"metadata": {"name": "c", "namespace": "tenant-a"}, "spec": {"class": "h100"}}
    with pytest.raises(Refused) as refused:
        webhook.admit_create(claim)
    assert refused.value.code == 500
    assert "its watch feed stopped (RuntimeError: boom)" in refused.value.message
