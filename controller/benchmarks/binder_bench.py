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
              Bound elsewhere;
  bookings    (issue 43) with the binder running, 2,000 reservations created as fast as 8
              threads can, windows of 1 to 4 hours over the next two days: create ->
              Booked rate and p99; then 2,000 ordered claims the same way on the same plane,
              beside the bookings: create -> Bound rate and p99, and the two as a ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from apiserver_load import RESOURCE, Bench, BoundWatcher, create_many, percentile, wait_until

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.config import Config
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu.objects.translate import rfc3339
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.controller_process import ControllerProcess


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


def throughput(claims: int, nodes: int, units: int, bin_dir: Path) -> None:
    bench = Bench.start(nodes, units, bin_dir)
    try:
        started = time.perf_counter()
        create_many(bench.claim_creator(), (f"c{i:05d}" for i in range(claims)))
        print(f"  created {claims} claims in {time.perf_counter() - started:.1f} s (no binder)")
        binder = Binder(bench.kube.api, config(bench.controller_ns))
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
        bench.stop()


def burst(claims: int, nodes: int, units: int, bin_dir: Path) -> None:
    bench = Bench.start(nodes, units, bin_dir)
    try:
        binder = Binder(bench.kube.api, config(bench.controller_ns))
        binder.start()
        binder.synced.wait(60)
        watcher = BoundWatcher(bench.kube.api, bench.tenant)
        time.sleep(1)
        started = time.perf_counter()
        created = create_many(bench.claim_creator(), (f"c{i:05d}" for i in range(claims)))
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
        bench.stop()


def controller(bench: Bench, log_dir: str) -> ControllerProcess:
    """The controller as it is deployed: its own process (its own interpreter lock), so the
    benchmark's client threads do not slow the binder down."""
    return ControllerProcess(
        bench.plane, bench.controller_ns, "bench", Path(log_dir),
        "--workload-records", "false", "--webhook-port", "0",
    )  # fmt: skip


def head_of_line(nodes: int, units: int, bin_dir: Path) -> None:
    bench = Bench.start(nodes, units, bin_dir)
    try:
        # A class no node can serve 2 units of: every order of it is unsatisfiable.
        bench.kube.gpu_class(
            "impossible", RESOURCE, mode="vgpu", profile="L40S-6C",
            selector={"bench.cozystack.io/pool": "none"}, maxCount=8,
        )  # fmt: skip
        with tempfile.TemporaryDirectory() as log_dir:
            process = controller(bench, log_dir)
            watcher = BoundWatcher(bench.kube.api, bench.tenant)
            create_many(
                bench.claim_creator(gpu_class="impossible"), (f"x{i:05d}" for i in range(10_000))
            )
            created = create_many(bench.claim_creator(), (f"ok{i:04d}" for i in range(1000)))
            wait_until(lambda: len(watcher.bound_at) >= 1000, 300)
            watcher.stop()
            process.stop()
        latency = [watcher.bound_at[n] - created[n] for n in created]
        print(
            f"  satisfiable create -> Bound behind 10,000 unsatisfiable: "
            f"p50 {statistics.median(latency) * 1000:.0f} ms, "
            f"p99 {percentile(latency, 0.99) * 1000:.0f} ms (goal p99 <= 2 s)"
        )
    finally:
        bench.stop()


def node_lost(nodes: int, bin_dir: Path) -> None:
    bench = Bench.start(nodes, 8, bin_dir)
    try:
        binder = Binder(bench.kube.api, config(bench.controller_ns))
        binder.start()
        binder.synced.wait(60)
        watcher = BoundWatcher(bench.kube.api, bench.tenant)
        # Best fit fills one node with the first 8 single-unit claims.
        create_many(bench.claim_creator(), (f"c{i}" for i in range(8)), threads=1)
        wait_until(lambda: len(watcher.bound_at) >= 8, 60)
        (node,) = set(watcher.nodes.values())
        before = dict(watcher.nodes)
        started = time.perf_counter()
        bench.kube.core.delete_node(node)
        wait_until(lambda: all(watcher.nodes[n] != node for n in before), 60)
        elapsed = time.perf_counter() - started
        watcher.stop()
        binder.stop()
        print(f"  8-GPU node lost -> its 8 claims Bound elsewhere: {elapsed:.2f} s (goal <= 5 s)")
    finally:
        bench.stop()


def bookings(count: int, nodes: int, units: int, bin_dir: Path) -> None:
    bench = Bench.start(nodes, units, bin_dir)
    try:
        binder = Binder(bench.kube.api, config(bench.controller_ns))
        binder.start()
        binder.synced.wait(120)
        first = (int(time.time()) // 3600 + 1) * 3600

        def window(name: str) -> tuple[str, str, int]:
            i = int(name[1:])
            start = first + (i * 7 % 48) * 3600
            return rfc3339(start), rfc3339(start + (1 + i % 4) * 3600), 1 + i % 2

        figures: dict[str, tuple[float, float]] = {}
        for what, kind, create, prefix in (
            ("bookings", "reservations", bench.reservation_creator(window), "r"),
            ("orders", "claims", bench.claim_creator(), "c"),
        ):
            watcher = BoundWatcher(bench.kube.api, bench.tenant, kind)
            time.sleep(1)
            started = time.perf_counter()
            created = create_many(create, (f"{prefix}{i:05d}" for i in range(count)))
            wait_until(lambda w=watcher: len(w.bound_at) >= count, 600)
            watcher.stop()
            latency = [watcher.bound_at[n] - created[n] for n in created]
            total = max(watcher.bound_at.values()) - started
            figures[what] = (count / total, percentile(latency, 0.99))
            print(
                f"  {count} {what}: {count / total:.0f}/s create -> "
                f"{'Booked' if kind == 'reservations' else 'Bound'}, p50 "
                f"{statistics.median(latency) * 1000:.0f} ms, p99 "
                f"{percentile(latency, 0.99) * 1000:.0f} ms"
            )
        binder.stop()
        (rate_b, p99_b), (rate_o, p99_o) = figures["bookings"], figures["orders"]
        print(f"  bookings against orders: rate {rate_b / rate_o:.2f}x, p99 {p99_b / p99_o:.2f}x")
    finally:
        bench.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--units", type=int, default=64, help="units per node (vGPU VFs)")
    parser.add_argument("--bookings", type=int, default=2_000, help="the bookings phase's count")
    parser.add_argument(
        "--phases", default="throughput,burst,head-of-line,node-lost", help="comma-joined"
    )
    args = parser.parse_args()
    bin_dir: Any = cluster.binary_dir()
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
    if "bookings" in phases:
        print("bookings:")
        bookings(args.bookings, args.nodes, args.units, bin_dir)


if __name__ == "__main__":
    main()
