"""The admission webhooks against a real local API server on this machine (issue 10's figures).

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/admission_bench.py [--vmis 1000] [--nodes 100]

Phases:
  webhooks  one fresh control plane and one controller replica (its own process, serving
            its webhooks over HTTPS; the benchmark writes claim status as the binder
            would, so only the webhooks work). Figures:
            - claim create latency, without the webhooks, then through the claim webhook
              (judged against the replica's snapshot);
            - VMI webhook latency: AdmissionReviews for ``--vmis`` VMIs holding 1-4 claims
              each sent straight to the webhook over one kept-alive TLS connection, as the
              API server sends them (the webhook reads the claims, classes, settings and
              writes each attachment and finalizer through the real API server);
            - VMI create latency through the API server, for another ``--vmis`` such VMIs,
              beside the same creates without the reference label (no webhook called);
            - the replica's resident memory at the end.
  memory    in-process: the snapshot every replica keeps, fed ``--claims`` claims (and
            nodes, GPUNodes, namespaces) shaped as the API server sends them;
            Python-allocated memory of the feed with its view and snapshot, and of the same
            objects with the managedFields the feed drops.
"""

from __future__ import annotations

import argparse
import base64
import copy
import gc
import http.client
import json
import os
import queue
import ssl
import statistics
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.admission.feed import SnapshotFeed
from cozystack_gpu.cluster.informer import Event, EventType, SharedInformers, source
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.objects import Kube, binder_config

RESOURCE = "nvidia.com/GH100_H100"
CLASS = "h100"
UNITS_PER_NODE = 64


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def in_parallel(jobs: Iterable[Callable[[], Any]], threads: int = 8) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda job: job(), list(jobs)))


# --- webhooks ------------------------------------------------------------------------------


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def claim_body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": name},
        "spec": {"class": CLASS, "count": 1},
    }


def webhooks(vmis: int, nodes: int, threads: int) -> None:
    # The test kit's helpers, as the admission tests use them (no pytest needed).
    import sys

    sys.path.insert(0, str(cluster.REPO_ROOT / "controller" / "tests" / "integration"))
    from admission_env import serving, vmi_body

    bin_dir = cluster.binary_dir()
    crds = [*sorted(cluster.CRD_DIR.glob("*.yaml")), cluster.kubevirt_crds(bin_dir)]
    with cluster.running(bin_dir=bin_dir, crds=crds) as plane:
        api = plane.api_client()
        kube = Kube(api)
        custom = client.CustomObjectsApi(api)
        tenant = "tenant-bench"
        kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
        node_names = [f"gpu-{i:03d}" for i in range(nodes)]
        in_parallel((lambda n=n: kube.gpu_node(n, RESOURCE, UNITS_PER_NODE)) for n in node_names)
        kube.gpu_class(CLASS, RESOURCE, model="H100")
        # VMI i holds 1 + i % 4 claims, all bound on one node.
        sets = {
            f"{kind}-{i:04d}": [f"{kind}-{i:04d}-c{j}" for j in range(1 + i % 4)]
            for kind in ("review", "create")
            for i in range(vmis)
        }
        claims = [c for members in sets.values() for c in members]
        print(f"  {nodes} nodes x {UNITS_PER_NODE} units, {len(sets)} VMIs, {len(claims)} claims")

        def create(name: str) -> float:
            return timed(
                lambda: custom.create_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS, claim_body(name)
                )
            )

        baseline = [create(f"plain-{i:04d}") for i in range(min(500, len(claims)))]
        print(f"  claim create without webhooks (sequential): {percentiles(baseline)}")

        with serving(plane, kube, Path(tempfile.mkdtemp(prefix="adm-bench-"))) as replica:
            assert replica.process is not None
            judged = [create(name) for name in claims]
            print(
                f"  claim create through the claim webhook (sequential, snapshot of "
                f"{len(baseline)}..{len(baseline) + len(claims)} claims): {percentiles(judged)}"
            )

            def bind(members: list[str], node: str) -> None:
                for name in members:
                    custom.patch_namespaced_custom_object_status(
                        keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS, name,
                        {"status": {"phase": "Bound", "nodeName": node,
                                    "boundAt": "2026-11-30T00:00:00Z"}},
                    )  # fmt: skip

            started = time.perf_counter()
            in_parallel(
                (
                    lambda m=members, n=node_names[i % nodes]: bind(m, n)
                    for i, members in enumerate(sets.values())
                ),
                threads,
            )
            print(f"  (bound {len(claims)} claims as the binder would in "
                  f"{time.perf_counter() - started:.1f} s)")  # fmt: skip

            cpu_before = cpu_seconds(replica.process.proc.pid)
            api_before = cpu_seconds(plane.pids["kube-apiserver"])
            reviews = review_latencies(replica, tenant, sets, vmi_body)
            cpu = cpu_seconds(replica.process.proc.pid) - cpu_before
            api_cpu = cpu_seconds(plane.pids["kube-apiserver"]) - api_before
            print(f"  VMI webhook, AdmissionReview round trip ({vmis} VMIs, 1-4 claims): "
                  f"{percentiles(reviews)}")  # fmt: skip
            print(f"    CPU per review: replica {cpu / vmis * 1000:.1f} ms, "
                  f"kube-apiserver {api_cpu / vmis * 1000:.1f} ms")  # fmt: skip
            by_size: dict[int, list[float]] = {}
            for i, latency in enumerate(reviews):
                by_size.setdefault(1 + i % 4, []).append(latency)
            for size, samples in sorted(by_size.items()):
                print(f"    holding {size}: {percentiles(samples)}")

            plain, webhooked = [], []
            for name, members in sets.items():
                if not name.startswith("create-"):
                    continue
                body = vmi_body(name, {"claims": members})
                bare = vmi_body("bare-" + name, labelled=False)
                for target, samples in ((body, webhooked), (bare, plain)):
                    samples.append(
                        timed(
                            lambda b=target: custom.create_namespaced_custom_object(
                                keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, b
                            )
                        )
                    )
            print(f"  VMI create without the webhook (no label): {percentiles(plain)}")
            print(f"  VMI create through the VMI webhook: {percentiles(webhooked)}")
            print(f"  replica resident memory: {rss_mib(replica.process.proc.pid):.0f} MiB")


def review_latencies(
    replica: Any, tenant: str, sets: dict[str, list[str]], vmi_body: Callable[..., Any]
) -> list[float]:
    """Send each review VMI's AdmissionReview to /mutate-vmi over one kept-alive TLS
    connection; every answer must allow and patch."""
    context = ssl.create_default_context(cadata=replica.ca_pem.decode())
    connection = http.client.HTTPSConnection("127.0.0.1", replica.port, context=context)
    latencies = []
    for name, members in sets.items():
        if not name.startswith("review-"):
            continue
        body = vmi_body(name, {"claims": members})
        body["metadata"]["namespace"] = tenant
        review = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": str(uuid.uuid4()),
                    "kind": {"group": "kubevirt.io", "version": "v1",
                             "kind": "VirtualMachineInstance"},
                    "resource": {"group": "kubevirt.io", "version": "v1",
                                 "resource": keys.VMI.plural},
                    "namespace": tenant, "name": name, "operation": "CREATE",
                    "userInfo": {"username": "bench"}, "object": body, "dryRun": False,
                },
            }
        )  # fmt: skip
        started = time.perf_counter()
        connection.request(
            "POST", "/mutate-vmi", body=review, headers={"Content-Type": "application/json"}
        )
        answer = json.loads(connection.getresponse().read())["response"]
        latencies.append(time.perf_counter() - started)
        if not answer.get("allowed") or not answer.get("patch"):
            raise RuntimeError(f"{name}: {answer}")
        ops = json.loads(base64.b64decode(answer["patch"]))
        if not any(op["path"].startswith("/spec/domain/devices/gpus") for op in ops):
            raise RuntimeError(f"{name}: no gpus added")
    connection.close()
    return latencies


# --- memory --------------------------------------------------------------------------------


def api_claim(i: int, node: str) -> dict[str, Any]:
    """A bound claim as a watch delivers it: created by a tenant's client, bound by the
    binder (two managedFields entries), with its conditions."""
    name = f"claim-{i:06d}"
    stamp = "2026-11-30T10:00:00Z"
    return {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {
            "name": name,
            "namespace": f"tenant-{i % 500:03d}",
            "uid": str(uuid.UUID(int=i)),
            "resourceVersion": str(1000 + i),
            "generation": 1,
            "creationTimestamp": stamp,
            "finalizers": [keys.FINALIZER_CLAIM] if i % 2 else [],
            "managedFields": [
                {
                    "apiVersion": keys.API_VERSION,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {".": {}, "f:class": {}, "f:count": {}}},
                    "manager": "kubectl-client-side-apply",
                    "operation": "Update",
                    "time": stamp,
                },
                {
                    "apiVersion": keys.API_VERSION,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:status": {
                            ".": {}, "f:boundAt": {}, "f:nodeName": {}, "f:phase": {},
                            "f:conditions": {".": {}, 'k:{"type":"Bound"}': {
                                ".": {}, "f:lastTransitionTime": {}, "f:message": {},
                                "f:reason": {}, "f:status": {}, "f:type": {}}},
                        }
                    },
                    "manager": keys.FIELD_MANAGER_BINDER,
                    "operation": "Update",
                    "subresource": "status",
                    "time": stamp,
                },
            ],
        },
        "spec": {"class": f"class-{i % 4}", "count": 1 + i % 2},
        "status": {
            "phase": "Bound",
            "nodeName": node,
            "boundAt": stamp,
            "conditions": [
                {
                    "type": "Bound", "status": "True", "reason": "Bound",
                    "message": f"bound to node {node}", "lastTransitionTime": stamp,
                }
            ],
        },
    }  # fmt: skip


def api_node(i: int) -> tuple[dict[str, Any], dict[str, Any]]:
    name = f"gpu-{i:04d}"
    node = {
        "metadata": {"name": name, "resourceVersion": "1", "labels": {"pool": f"p{i % 4}"}},
        "status": {
            "allocatable": {f"nvidia.com/GPU_{c}": "64" for c in range(4)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    gpunode = {
        "metadata": {"name": name, "resourceVersion": "1"},
        "status": {
            "devices": [
                {"pciAddress": f"0000:{d:02x}:00.0", "resourceName": f"nvidia.com/GPU_{c}",
                 "allocatable": 8}
                for c in range(4) for d in range(8 * c, 8 * c + 8)
            ],
            "resourceNames": [f"nvidia.com/GPU_{c}" for c in range(4)],
        },
    }  # fmt: skip
    return node, gpunode


def memory(claims: int, nodes: int) -> None:
    node_objs = [api_node(i) for i in range(nodes)]
    classes = tuple(
        {
            "metadata": {"name": f"class-{c}", "resourceVersion": "1"},
            "spec": {
                "mode": "passthrough",
                "source": {"devicePlugin": {"resourceName": f"nvidia.com/GPU_{c}"}},
                "nodeSelector": {"pool": f"p{c}"},
            },
        }
        for c in range(4)
    )
    namespaces = tuple(
        {"metadata": {"name": f"tenant-{t:03d}", "resourceVersion": "1",
                      "labels": {f"tenant.cozystack.io/tenant-{t:03d}": ""}}}
        for t in range(500)
    )  # fmt: skip
    # Spread so no node holds more than it has: class c's claims go to nodes of pool c.
    per_class = [[n for n, _g in node_objs if n["metadata"]["labels"]["pool"] == f"p{c}"]
                 for c in range(4)]  # fmt: skip

    def claim_objects() -> list[dict[str, Any]]:
        return [
            json.loads(json.dumps(api_claim(i, pool[(i // 4) % len(pool)]["metadata"]["name"])))
            for i in range(claims)
            for pool in (per_class[i % 4],)
        ]

    def listing(with_claims: bool = True) -> list[Event]:
        given = {
            keys.NODE.kind: tuple(copy.deepcopy(n) for n, _g in node_objs),
            keys.GPU_NODE.kind: tuple(copy.deepcopy(g) for _n, g in node_objs),
            keys.GPU_CLASS.kind: classes,
            keys.GPU_CLAIM.kind: tuple(claim_objects()) if with_claims else (),
            keys.NAMESPACE.kind: namespaces,
        }
        return [
            Event(k.kind, EventType.LISTED, objects=given.get(k.kind, ()))
            for k in keys.BINDER_WATCHES
        ]

    def fed(events: list[Event]) -> tuple[SnapshotFeed, float]:
        """A standby replica: the process's cache and the feed on it."""
        feed, took, _cache = cached(events, leader=False)
        return feed, took

    def cached(events: list[Event], leader: bool) -> tuple[Any, float, Any]:
        """The events through the process's one cache (as its informers hand them over),
        into the feed and, in a leader, the binder's view and snapshot too."""
        api = client.ApiClient()
        cache = SharedInformers(api)
        sources = [source(api, kind) for kind in keys.BINDER_WATCHES]
        feed = SnapshotFeed(client.ApiClient(), binder_config("bench"), clock=time.time)
        feed_sink: queue.Queue[Any] = queue.Queue()
        cache.subscribe(feed_sink, sources)
        binder_sink: queue.Queue[Any] = queue.Queue()
        if leader:
            cache.subscribe(binder_sink, sources)
        started = time.perf_counter()
        for event in events:
            cache.take(event)
        feed.take(drained(feed_sink))
        took = time.perf_counter() - started
        assert feed.synced.is_set()
        binder: tuple[Any, ...] = ()
        if leader:
            view = ClusterView(binder_config("bench"), keys.BINDER_WATCHES)
            for event in drained(binder_sink):
                view.relist(event.kind, event.objects)
            binder = (view, view.build_snapshot(time.time()))
        return feed, took, (cache, binder)

    # Time without tracing (tracemalloc slows every allocation several times).
    events = listing()
    feed, took = fed(events)
    del feed, events
    gc.collect()

    def held(make: Callable[[], Any]) -> tuple[Any, int]:
        """What ``make`` builds and the bytes it holds once its inputs are dropped."""
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        made = make()
        gc.collect()
        return made, tracemalloc.get_traced_memory()[0] - base

    tracemalloc.start()
    _raw, with_managed = held(claim_objects)
    del _raw
    standby, kept = held(lambda: fed(listing())[0])
    del standby
    leading, leader = held(lambda: cached(listing(), leader=True))
    del leading
    feed, empty = held(lambda: fed(listing(with_claims=False))[0])
    tracemalloc.stop()
    print(f"  {claims} claims, {nodes} nodes (+ GPUNodes), 4 classes, 500 tenants")
    print(f"  the claims as a watch delivers them (managedFields, conditions): "
          f"{with_managed / 2**20:.0f} MiB")  # fmt: skip
    print(f"  a standby: the cache and the feed after the first listing (view + snapshot): "
          f"{kept / 2**20:.0f} MiB, {kept / claims / 1024:.2f} KiB per claim; "
          f"listing to snapshot {took:.1f} s")  # fmt: skip
    print(f"  the leader: the cache, the feed, the binder's view and snapshot: "
          f"{leader / 2**20:.0f} MiB")  # fmt: skip
    print(f"  of which the nodes, GPUNodes, classes and tenants alone: {empty / 2**20:.0f} MiB; "
          f"per claim without them: {(kept - empty) / claims / 1024:.2f} KiB")  # fmt: skip
    assert feed.synced.is_set()


def drained(sink: queue.Queue[Any]) -> list[Event]:
    events: list[Event] = []
    while not sink.empty():
        events.append(sink.get_nowait())
    return events


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vmis", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--claims", type=int, default=50_000, help="for the memory phase")
    parser.add_argument("--memory-nodes", type=int, default=1200, help="for the memory phase")
    parser.add_argument("--threads", type=int, default=8, help="for the setup writes")
    parser.add_argument("--phases", default="webhooks,memory", help="comma-joined")
    args = parser.parse_args()
    phases = args.phases.split(",")
    if "webhooks" in phases:
        print("webhooks:")
        webhooks(args.vmis, args.nodes, args.threads)
    if "memory" in phases:
        print("memory:")
        memory(args.claims, args.memory_nodes)


if __name__ == "__main__":
    main()
