"""One cache per process: the admission feed and the binder read the same listings and
watches (``cluster.informer.SharedInformers``), and so give the same answers.

The informers are never started here: each test hands the cache the events an informer
would deliver (``SharedInformers.take``), and drains the subscribers' queues itself.
"""

from __future__ import annotations

import copy
import json
import queue
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.cluster.informer import (
    LAST_APPLIED,
    SHARED_STRING_MAX,
    Event,
    EventType,
    SharedInformers,
    slim,
    source,
)
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.model import ClaimInfo, set_placement
from cozystack_gpu_testkit.objects import binder_config

H100 = "nvidia.com/GH100_H100"
NOW = 1_800_000_000.0
TENANT = "tenant-a"
API = client.ApiClient()
SOURCES = [source(API, kind) for kind in keys.BINDER_WATCHES]


def drain(sink: queue.Queue[Any]) -> list[Event]:
    events: list[Event] = []
    while True:
        try:
            events.append(sink.get_nowait())
        except queue.Empty:
            return events


def apply_as_the_binder(view: ClusterView, events: list[Event]) -> None:
    """What ``Binder._handle`` does with an informer event."""
    for event in events:
        if event.type is EventType.LISTED:
            view.relist(event.kind, event.objects)
        elif event.obj is not None:
            view.apply(event.kind, event.obj, deleted=event.type is EventType.DELETED)


def listed(kind: keys.ApiKind, *objects: dict[str, Any]) -> Event:
    return Event(kind.kind, EventType.LISTED, objects=objects)


def changed(kind: keys.ApiKind, obj: dict[str, Any], deleted: bool = False) -> Event:
    return Event(kind.kind, EventType.DELETED if deleted else EventType.MODIFIED, obj=obj)


def node(name: str, rv: int = 1) -> dict[str, Any]:
    return {
        "kind": "Node",
        "metadata": {
            "name": name, "resourceVersion": str(rv), "managedFields": [{"manager": "kubelet"}],
            "annotations": {LAST_APPLIED: "{...}", "kept": "yes"},
        },
        "status": {
            "allocatable": {H100: "2"}, "conditions": [{"type": "Ready", "status": "True"}],
        },
    }  # fmt: skip


def gpunode(name: str) -> dict[str, Any]:
    return {
        "kind": "GPUNode",
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "devices": [
                {"pciAddress": f"0000:{i:02x}:00.0", "resourceName": H100, "allocatable": 1}
                for i in range(2)
            ],
            "resourceNames": [H100],
        },
    }


def gpu_class() -> dict[str, Any]:
    return {
        "kind": "GPUClass",
        "metadata": {"name": "h100", "resourceVersion": "1"},
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": H100}}},
    }


def claim(name: str, phase: str, node_name: str | None, vmi: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "nodeName": node_name}
    if vmi is not None:
        status.update(attachedTo=vmi, attachedToUID=f"uid-{vmi}")
    status["conditions"] = [{"type": "Bound", "status": "True", "message": "a note"}]
    return {
        "kind": "GPUClaim",
        "metadata": {"name": name, "namespace": TENANT, "resourceVersion": "2"},
        "spec": {"class": "h100", "count": 1},
        "status": status,
    }


def vmi(name: str, phase: str, node_name: str, rv: int) -> dict[str, Any]:
    return {
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name, "namespace": TENANT, "uid": f"uid-{name}", "resourceVersion": str(rv),
            "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
        },
        "status": {"phase": phase, "nodeName": node_name},
    }  # fmt: skip


def pod(
    name: str,
    rv: int,
    *,
    owner: str | None,
    own_uid: bool,
    labelled: bool,
    node_name: str | None,
    units: int,
    phase: str,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name, "namespace": TENANT, "uid": f"uid-{name}", "resourceVersion": str(rv),
        "managedFields": [{"manager": "virt-controller"}],
    }  # fmt: skip
    if labelled:
        metadata["labels"] = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": owner,
                "uid": f"uid-{owner}" if own_uid else "uid-earlier",
                "controller": True,
            }
        ]
    resources = {"limits": {H100: str(units)}} if units else {}
    return {
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "nodeName": node_name,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "compute", "image": "virt-launcher", "resources": resources}],
        },
        "status": {"phase": phase},
    }


def first_listing() -> list[Event]:
    given_objects = {
        keys.NODE.kind: (node("n1"), node("n2")),
        keys.GPU_NODE.kind: (gpunode("n1"), gpunode("n2")),
        keys.GPU_CLASS.kind: (gpu_class(),),
        keys.GPU_CLAIM.kind: (
            claim("c1", "Attached", "n1", "vm1"),
            claim("c2", "Bound", "n2"),
            claim("c3", "Pending", None),
        ),
        keys.NAMESPACE.kind: ({"kind": "Namespace", "metadata": {"name": TENANT}},),
        keys.VMI.kind: (vmi("vm1", "Running", "n1", 3),),
    }
    return [listed(kind, *given_objects.get(kind.kind, ())) for kind in keys.BINDER_WATCHES]


def test_the_cache_keeps_every_field_a_reader_reads_and_drops_managed_fields() -> None:
    """managedFields and kubectl's last-applied copy go for every kind; a claim's
    conditions (the binder merges its notes into them) and a pod's owner and spec (the
    binder's view and gate read them) stay."""
    cache = SharedInformers(API)
    sink: queue.Queue[Any] = queue.Queue()
    cache.subscribe(sink, SOURCES)
    for event in first_listing():
        cache.take(event)
    launcher = pod(
        "p", 4, owner="vm1", own_uid=True, labelled=True, node_name="n1", units=1, phase="Running"
    )
    cache.take(changed(keys.POD, launcher))
    seen = {e.kind: e for e in drain(sink)}
    (n1, _n2) = seen[keys.NODE.kind].objects
    assert "managedFields" not in n1["metadata"]
    assert n1["metadata"]["annotations"] == {"kept": "yes"}
    claims = seen[keys.GPU_CLAIM.kind].objects
    assert claims[0]["status"]["conditions"][0]["message"] == "a note"
    kept = seen[keys.POD.kind].obj
    assert kept is not None and "managedFields" not in kept["metadata"]
    assert kept["metadata"]["ownerReferences"][0]["name"] == "vm1"
    assert kept["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(
    spec=st.dictionaries(st.text(max_size=12), JSON_VALUES, max_size=5),
    annotations=st.dictionaries(st.text(max_size=12), st.text(max_size=80), max_size=3),
)
def test_the_cache_changes_no_value_it_keeps_and_shares_short_strings_between_objects(
    spec: dict[str, Any], annotations: dict[str, str]
) -> None:
    """Two objects decoded from separate watch events come out of the cache equal to what
    the API sent, less managedFields and the last-applied copy, and holding one copy of
    each key and short string they have in common (the memory of a replica watching
    50,000 claims); longer strings are left alone."""
    sent = {
        "metadata": {
            "name": "c",
            "annotations": {**annotations, LAST_APPLIED: "{}"},
            "managedFields": [{"manager": "kubectl"}],
        },
        "spec": spec,
    }
    expected = copy.deepcopy(sent)
    del expected["metadata"]["managedFields"]
    del expected["metadata"]["annotations"][LAST_APPLIED]
    first, second = (slim(json.loads(json.dumps(sent))) for _copy in range(2))
    assert first == expected and second == expected

    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for k, v in value.items() for s in (k, *strings(v))]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    for a, b in zip(strings(first), strings(second), strict=True):
        assert a == b
        assert (a is b) == (len(a) <= SHARED_STRING_MAX) or len(a) <= 1


def test_a_late_subscriber_gets_each_kind_as_it_is_now_then_every_later_event() -> None:
    """A replica that wins the Lease after the feed has read the cluster starts its binder
    from the cache: one LISTED per kind with the objects as last seen (an added node in,
    a deleted claim out), no listing of its own, and then each event once."""
    cache = SharedInformers(API)
    feed: queue.Queue[Any] = queue.Queue()
    cache.subscribe(feed, SOURCES)
    for event in first_listing():
        cache.take(event)
    cache.take(Event(keys.NODE.kind, EventType.ADDED, obj=node("n3")))
    cache.take(changed(keys.GPU_CLAIM, claim("c3", "Pending", None), deleted=True))

    binder: queue.Queue[Any] = queue.Queue()
    cache.subscribe(binder, SOURCES)
    replay = drain(binder)
    assert all(e.type is EventType.LISTED for e in replay)
    assert {e.kind for e in replay} == {k.kind for k in keys.BINDER_WATCHES}
    by_kind = {e.kind: e.objects for e in replay}
    assert [o["metadata"]["name"] for o in by_kind[keys.NODE.kind]] == ["n1", "n2", "n3"]
    assert [o["metadata"]["name"] for o in by_kind[keys.GPU_CLAIM.kind]] == ["c1", "c2"]

    later = changed(keys.NODE, node("n1", rv=9))
    cache.take(later)
    assert drain(binder) == [later]
    assert drain(feed)[-1] == later  # the earlier subscriber got it too, once


def test_a_kind_no_subscriber_reads_is_no_longer_watched_nor_kept() -> None:
    """The binder's usage records and the copier's Secrets are watched while the replica
    leads; when its last reader unsubscribes the kind's informer stops, its store goes,
    and a late event of that informer reaches no one."""
    cache = SharedInformers(API)
    feed: queue.Queue[Any] = queue.Queue()
    cache.subscribe(feed, SOURCES)
    binder: queue.Queue[Any] = queue.Queue()
    cache.subscribe(binder, [*SOURCES, source(API, keys.WORKLOAD)])
    assert keys.WORKLOAD.kind in cache.watched()
    stopped = cache.informer(keys.WORKLOAD.kind)
    assert stopped is not None
    cache.take(listed(keys.WORKLOAD))
    cache.unsubscribe(binder)
    assert cache.watched() == {k.kind for k in keys.BINDER_WATCHES}
    # The stopped informer's last event: dropped, not replayed to a later reader.
    cache.take(listed(keys.WORKLOAD), stopped._stop)
    again: queue.Queue[Any] = queue.Queue()
    cache.subscribe(again, [source(API, keys.WORKLOAD)])
    assert drain(again) == []
    assert keys.WORKLOAD.kind not in {e.kind for e in drain(feed)}


POD_NAMES = ("p0", "p1", "p2")
pod_events = st.tuples(
    st.sampled_from(POD_NAMES),
    st.booleans(),  # deleted
    st.sampled_from([None, "vm1", "vm2"]),  # owner
    st.booleans(),  # the owner reference names this VMI's uid
    st.booleans(),  # the claims label
    st.sampled_from([None, "n1", "n2"]),
    st.integers(0, 2),
    st.sampled_from(["Pending", "Running", "Succeeded"]),
)
vmi_events = st.tuples(
    st.sampled_from(["vm1", "vm2"]),
    st.booleans(),
    st.sampled_from(["Scheduling", "Running", "Failed"]),
    st.sampled_from(["n1", "n2"]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(pod_events, vmi_events), max_size=14))
def test_the_feed_and_the_binder_view_give_the_same_answers_for_the_same_events(
    steps: list[tuple[Any, ...]],
) -> None:
    """Launcher pods and VMIs come and go in any order: the claim webhook's snapshot and
    the binder's view, fed by one cache, count the same units on each node, charge the
    tenant the same, and judge the same orders alike."""
    cache = SharedInformers(API)
    feed = SnapshotFeed(API, binder_config("ctl"), clock=lambda: NOW)
    feed_sink: queue.Queue[Any] = queue.Queue()
    cache.subscribe(feed_sink, SOURCES)
    binder_view = ClusterView(binder_config("ctl"), keys.BINDER_WATCHES)
    binder_sink: queue.Queue[Any] = queue.Queue()
    cache.subscribe(binder_sink, SOURCES)
    for event in first_listing():
        cache.take(event)
    for rv, step in enumerate(steps, start=10):
        if len(step) == 8:
            name, deleted, owner, own_uid, labelled, node_name, units, phase = step
            obj = pod(
                name, rv, owner=owner, own_uid=own_uid, labelled=labelled,
                node_name=node_name, units=units, phase=phase,
            )  # fmt: skip
            cache.take(changed(keys.POD, obj, deleted))
        else:
            name, deleted, phase, node_name = step
            cache.take(changed(keys.VMI, vmi(name, phase, node_name, rv), deleted))
    feed.take(drain(feed_sink))
    apply_as_the_binder(binder_view, drain(binder_sink))

    for name in ("n1", "n2"):
        assert feed.view.node_info(name) == binder_view.node_info(name), name
    assert feed.view.namespace_info(TENANT) == binder_view.namespace_info(TENANT)
    snapshot = binder_view.build_snapshot(NOW)
    for count in (1, 2):
        order = ClaimInfo(TENANT, "new", "h100", count)
        assert feed.check_order(order, NOW) == set_placement.check_order(snapshot, order, NOW), (
            count
        )
