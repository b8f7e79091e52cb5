"""The binder against a real local API server on this machine (issue 3's figures).

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/binder_bench.py [--claims 10000] [--nodes 200]

Phases, each on a fresh control plane:
  throughput  N claims created while no binder runs, then the binder starts: binds/s from
              its first listing to the last bind, and claim status writes per bind;
  burst       N claims created as fast as 8 threads can while the binder runs: create →
              Bound latency p50/p99 (create as returned to the client, Bound as seen by a
              watch);
  head-of-line  10,000 unsatisfiable orders, then 1,000 satisfiable ones: p99 create →
              Bound of the satisfiable ones;
  node-lost   an 8-GPU node holding 8 unattached claims is deleted: time until all 8 are
              Bound elsewhere.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, watch

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.config import Config
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.objects import Kube, install_extra_crds

RESOURCE = "nvidia.com/NVIDIA_L40S-6C"


def config(namespace: str) -> Config:
    return Config(
        namespace=namespace,
        identity="bench",
        attachment_grace=120.0,
        rejection_ttl=600.0,
        raw_resource_names=RawNamesPolicy.ALLOWED,
        extra_resource_names=frozenset(),
        lease_duration=15.0,
        renew_deadline=10.0,
        retry_period=2.0,
        write_workers=8,
        metrics_port=0,
        workload_records=False,  # billing records are measured apart; they double the writes
    )


class BoundWatcher:
    """Records when each claim is first seen Bound (a watch, like any client would)."""

    def __init__(self, api: Any, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.bound_at: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop:
                raise  # a broken watch while measuring is a failed benchmark

    def _watch(self) -> None:
        custom = client.CustomObjectsApi(self.api)
        while not self._stop:
            stream = watch.Watch().stream(
                custom.list_namespaced_custom_object,
                keys.GROUP,
                keys.VERSION,
                self.namespace,
                keys.PLURAL_CLAIMS,
                timeout_seconds=60,
                deserialize=False,
            )
            for event in stream:
                obj = event["object"]
                status = obj.get("status") or {}
                name = obj["metadata"]["name"]
                node = status.get("nodeName")
                if status.get("phase") == "Bound" and self.nodes.get(name) != node:
                    self.bound_at[name] = time.perf_counter()
                    self.nodes[name] = node
                if self._stop:
                    return

    def stop(self) -> None:
        self._stop = True


def create_claims(
    kube: Kube, namespace: str, gpu_class: str, names: Iterable[str], threads: int = 8
) -> dict[str, float]:
    created: dict[str, float] = {}

    def create(name: str) -> None:
        kube.claim(namespace, name, gpu_class, 1)
        created[name] = time.perf_counter()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, names))
    return created


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark phase did not finish")
        time.sleep(0.05)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def fresh_cluster(nodes: int, units: int, bin_dir: Any) -> tuple[Any, Kube, str, str, str]:
    plane = cluster.start(bin_dir=bin_dir)
    api = plane.api_client()
    cluster.install_crds(api)
    install_extra_crds(api)
    kube = Kube(api)
    test_id = uuid.uuid4().hex[:6]
    controller_ns, tenant = f"ctl-{test_id}", f"tenant-{test_id}"
    kube.namespace(controller_ns)
    kube.namespace(
        tenant, {f"tenant.cozystack.io/{tenant}": "", keys.LABEL_VGPU_ENTITLEMENT: "true"}
    )
    selector = {"bench.cozystack.io/pool": "l40s"}
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: kube.gpu_node(f"gpu-{i:04d}", RESOURCE, units, labels=selector),
                range(nodes),
            )
        )
    kube.gpu_class(
        "l40s-6c", RESOURCE, mode="vgpu", profile="L40S-6C", selector=selector, maxCount=8
    )
    return plane, kube, controller_ns, tenant, "l40s-6c"


def throughput(claims: int, nodes: int, units: int, bin_dir: Any) -> None:
    plane, kube, controller_ns, tenant, gpu_class = fresh_cluster(nodes, units, bin_dir)
    try:
        started = time.perf_counter()
        create_claims(kube, tenant, gpu_class, (f"c{i:05d}" for i in range(claims)))
        print(f"  created {claims} claims in {time.perf_counter() - started:.1f} s (no binder)")
        binder = Binder(kube.api, config(controller_ns))
        t0 = time.perf_counter()
        binder.start()
        binder.synced.wait(120)
        synced = time.perf_counter()
        wait_until(lambda: binder.stats.binds >= claims, 600)
        done = time.perf_counter()
        writes = binder.status_writes
        binder.stop()
        print(f"  first listing and snapshot: {synced - t0:.2f} s")
        print(f"  sustained binds/s: {claims / (done - synced):.0f} (goal >= 150)")
        print(f"  claim status writes per bind: {writes / claims:.3f} (goal exactly 1)")
    finally:
        plane.stop()


def burst(claims: int, nodes: int, units: int, bin_dir: Any) -> None:
    plane, kube, controller_ns, tenant, gpu_class = fresh_cluster(nodes, units, bin_dir)
    try:
        binder = Binder(kube.api, config(controller_ns))
        binder.start()
        binder.synced.wait(60)
        watcher = BoundWatcher(kube.api, tenant)
        time.sleep(1)
        started = time.perf_counter()
        created = create_claims(kube, tenant, gpu_class, (f"c{i:05d}" for i in range(claims)))
        create_s = time.perf_counter() - started
        wait_until(lambda: len(watcher.bound_at) >= claims, 600)
        watcher.stop()
        binder.stop()
        latency = [watcher.bound_at[n] - created[n] for n in created]
        total = max(watcher.bound_at.values()) - started
        print(f"  {claims} creates took {create_s:.1f} s ({claims / create_s:.0f}/s)")
        print(f"  all bound {total:.1f} s after the first create ({claims / total:.0f} binds/s)")
        print(
            f"  create -> Bound: p50 {statistics.median(latency) * 1000:.0f} ms, "
            f"p99 {percentile(latency, 0.99) * 1000:.0f} ms (goal p99 <= 1 s)"
        )
    finally:
        plane.stop()


class ControllerProcess:
    """The controller as it is deployed: its own process (its own interpreter lock), so the
    benchmark's client threads do not slow the binder down."""

    def __init__(self, plane: Any, namespace: str) -> None:
        import os
        import subprocess
        import sys

        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "cozystack_gpu",
                "--kubeconfig", str(plane.kubeconfig), "--namespace", namespace,
                "--metrics-port", "0", "--health-port", "0", "--workload-records", "false",
                "--log-format", "text",
            ],
            env={**os.environ, "KUBECONFIG": str(plane.kubeconfig)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def head_of_line(nodes: int, units: int, bin_dir: Any) -> None:
    plane, kube, controller_ns, tenant, gpu_class = fresh_cluster(nodes, units, bin_dir)
    try:
        # A class no node can serve 2 units of: every order of it is unsatisfiable.
        kube.gpu_class(
            "impossible", RESOURCE, mode="vgpu", profile="L40S-6C",
            selector={"bench.cozystack.io/pool": "none"}, maxCount=8,
        )  # fmt: skip
        controller = ControllerProcess(plane, controller_ns)
        watcher = BoundWatcher(kube.api, tenant)
        create_claims(kube, tenant, "impossible", (f"x{i:05d}" for i in range(10_000)))
        created = create_claims(kube, tenant, gpu_class, (f"ok{i:04d}" for i in range(1000)))
        wait_until(lambda: len(watcher.bound_at) >= 1000, 300)
        watcher.stop()
        controller.stop()
        latency = [watcher.bound_at[n] - created[n] for n in created]
        print(
            f"  satisfiable create -> Bound behind 10,000 unsatisfiable: "
            f"p50 {statistics.median(latency) * 1000:.0f} ms, "
            f"p99 {percentile(latency, 0.99) * 1000:.0f} ms (goal p99 <= 2 s)"
        )
    finally:
        plane.stop()


def node_lost(nodes: int, bin_dir: Any) -> None:
    plane, kube, controller_ns, tenant, gpu_class = fresh_cluster(nodes, 8, bin_dir)
    try:
        binder = Binder(kube.api, config(controller_ns))
        binder.start()
        binder.synced.wait(60)
        watcher = BoundWatcher(kube.api, tenant)
        # Best fit fills one node with the first 8 single-unit claims.
        create_claims(kube, tenant, gpu_class, (f"c{i}" for i in range(8)), threads=1)
        wait_until(lambda: len(watcher.bound_at) >= 8, 60)
        (node,) = set(watcher.nodes.values())
        before = dict(watcher.nodes)
        started = time.perf_counter()
        kube.core.delete_node(node)
        wait_until(lambda: all(watcher.nodes[n] != node for n in before), 60)
        elapsed = time.perf_counter() - started
        watcher.stop()
        binder.stop()
        print(f"  8-GPU node lost -> its 8 claims Bound elsewhere: {elapsed:.2f} s (goal <= 5 s)")
    finally:
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--units", type=int, default=64, help="units per node (vGPU VFs)")
    parser.add_argument(
        "--phases", default="throughput,burst,head-of-line,node-lost", help="comma-joined"
    )
    args = parser.parse_args()
    bin_dir = cluster.binary_dir()
    phases = args.phases.split(",")
    print(f"{args.nodes} nodes x {args.units} units, {args.claims} claims, 2-core machine")
    if "throughput" in phases:
        print("throughput:")
        throughput(args.claims, args.nodes, args.units, bin_dir)
    if "burst" in phases:
        print("burst:")
        burst(args.claims, args.nodes, args.units, bin_dir)
    if "head-of-line" in phases:
        print("head-of-line:")
        head_of_line(args.nodes, args.units, bin_dir)
    if "node-lost" in phases:
        print("node-lost:")
        node_lost(args.nodes, bin_dir)


if __name__ == "__main__":
    main()
