"""The binder against its peer: kube-scheduler binding Pods on the same control plane build,
nodes and counts, one after the other in one run (issue 13's yardstick).

    make setup binaries
    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python controller/benchmarks/peer_bench.py
    # smaller: --count 2000 --nodes 50 --blocked 2000 --ok 200; one phase: --phases burst

Every phase runs twice, each time on a fresh control plane (etcd and kube-apiserver of the
test kit, the gpu and KubeVirt CRDs installed, ``--nodes`` Ready nodes of ``--units`` units
of one resource name with their GPUNodes, one vGPU class serving them): first kube-scheduler
(the test kit's, client QPS 5,000) binding Pods that request 1 unit, then the binder (the
controller as deployed, its own process: ``python -m cozystack_gpu``) binding GPUClaims of 1
unit. The load generator (8 client threads) and a watch that times binds run in this
process, apart from both deciders.

  throughput    --count objects created while no decider runs, then the decider starts:
                binds/s from its start to the last bind seen, and from the first bind seen
                to the last (sustained);
  burst         --count objects created at the client's top speed while the decider runs:
                create -> bound p50 and p99 (create as returned to the client, bound as seen
                by the watch);
  head-of-line  --blocked objects that fit no node (a pod requesting more units than a node
                has; a claim counting more units than a node has), then --ok that fit:
                create -> bound p50 and p99 of those.

CPU per bind: user + system time of the decider, kube-apiserver and etcd from
/proc/<pid>/stat over the measured window (throughput: first to last bind; burst and
head-of-line: first create to last bind, so the creates' cost is in the API server's
figure, alike for both), divided by the binds in it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from apiserver_load import Bench, BoundWatcher, cpu_seconds, create_many, percentile

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.controller_process import ControllerProcess

SCHEDULER = "kube-scheduler"
BINDER = "binder"
WATCHED = ("kube-apiserver", "etcd")


@dataclass
class Figures:
    """One decider's figures in one phase, by name, in printing order."""

    values: dict[str, float] = field(default_factory=dict)

    def put(self, name: str, value: float) -> None:
        self.values[name] = value


class Peer:
    """kube-scheduler on Pods or the binder on GPUClaims, started on demand in a bench."""

    def __init__(self, name: str, bench: Bench, log_dir: Path) -> None:
        self.name = name
        self.bench = bench
        self.log_dir = log_dir
        self.process: ControllerProcess | None = None
        self.pid = 0

    @property
    def kind(self) -> str:
        return "pods" if self.name == SCHEDULER else "claims"

    def creator(self, units: int = 1) -> Callable[[str], None]:
        if self.name == SCHEDULER:
            return self.bench.pod_creator(units)
        return self.bench.claim_creator(units)

    def start(self) -> None:
        if self.name == SCHEDULER:
            self.bench.plane.start_scheduler()
            self.pid = self.bench.pid(SCHEDULER)
        else:
            self.process = ControllerProcess(
                self.bench.plane, self.bench.controller_ns, "bench", self.log_dir,
                "--workload-records", "false", "--webhook-port", "0",
            )  # fmt: skip
            self.pid = self.process.proc.pid

    def cpu(self) -> dict[str, float]:
        used = {name: cpu_seconds(self.bench.pid(name)) for name in WATCHED}
        used["decider"] = cpu_seconds(self.pid)
        return used

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def failed(self) -> str:
        if self.process is not None:
            return self.process.log_tail()
        return str(self.bench.plane.log_tail(SCHEDULER))


def follow(
    peer: Peer, watcher: BoundWatcher, want: int, prefix: str, timeout: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Poll until ``want`` objects named ``prefix``... are bound; the CPU used when the first
    of them was seen bound and when the last was."""
    first: dict[str, float] | None = None
    deadline = time.monotonic() + timeout
    while True:
        bound = watcher.count(prefix)
        if first is None and bound:
            first = peer.cpu()
        if bound >= want:
            return first or peer.cpu(), peer.cpu()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{peer.name}: {bound} of {want} bound after {timeout:.0f} s\n{peer.failed()}"
            )
        time.sleep(0.02)


def cpu_per_bind(
    figures: Figures, start: dict[str, float], end: dict[str, float], binds: int
) -> None:
    for name in ("decider", *WATCHED):
        figures.put(f"{name} CPU ms/bind", (end[name] - start[name]) / binds * 1000)


def warm_up(peer: Peer, watcher: BoundWatcher) -> None:
    """One object bound before measuring, so the decider has listed and synced."""
    peer.creator()("warm")
    follow(peer, watcher, 1, "warm", 120)


def throughput(peer: Peer, count: int) -> Figures:
    figures = Figures()
    names = [f"t{i:05d}" for i in range(count)]
    create_many(peer.creator(), names)
    watcher = BoundWatcher(peer.bench.kube.api, peer.bench.tenant, peer.kind)
    deadline = time.monotonic() + 120
    while watcher.seen < count and time.monotonic() < deadline:
        time.sleep(0.05)  # the watch's first listing is read before the decider starts
    started = time.perf_counter()
    peer.start()
    first, last = follow(peer, watcher, count, "t", 900)
    watcher.stop()
    times = [watcher.bound_at[n] for n in names]
    figures.put("binds/s, start -> last bind", count / (max(times) - started))
    figures.put("binds/s, first -> last bind", (count - 1) / (max(times) - min(times)))
    figures.put("first bind after start, s", min(times) - started)
    cpu_per_bind(figures, first, last, count - 1)
    figures.put("decider CPU at first bind, s", first["decider"])
    return figures


def latency(figures: Figures, created: dict[str, float], watcher: BoundWatcher) -> None:
    waits = [watcher.bound_at[n] - created[n] for n in created]
    figures.put("create -> bound p50, ms", statistics.median(waits) * 1000)
    figures.put("create -> bound p99, ms", percentile(waits, 0.99) * 1000)


def burst(peer: Peer, count: int) -> Figures:
    figures = Figures()
    watcher = BoundWatcher(peer.bench.kube.api, peer.bench.tenant, peer.kind)
    peer.start()
    warm_up(peer, watcher)
    start = peer.cpu()
    started = time.perf_counter()
    created = create_many(peer.creator(), (f"b{i:05d}" for i in range(count)))
    create_s = time.perf_counter() - started
    _first, last = follow(peer, watcher, count, "b", 900)
    watcher.stop()
    figures.put("creates/s", count / create_s)
    last_bind = max(watcher.bound_at[n] for n in created)
    figures.put("binds/s, first create -> last bind", count / (last_bind - started))
    latency(figures, created, watcher)
    cpu_per_bind(figures, start, last, count)
    return figures


def head_of_line(peer: Peer, blocked: int, ok: int, units: int) -> Figures:
    figures = Figures()
    watcher = BoundWatcher(peer.bench.kube.api, peer.bench.tenant, peer.kind)
    peer.start()
    warm_up(peer, watcher)
    start = peer.cpu()
    create_many(peer.creator(units + 1), (f"x{i:05d}" for i in range(blocked)))
    created = create_many(peer.creator(), (f"ok{i:04d}" for i in range(ok)))
    _first, last = follow(peer, watcher, ok, "ok", 900)
    watcher.stop()
    if watcher.count("x"):
        raise AssertionError(f"{peer.name} bound objects that fit no node")
    latency(figures, created, watcher)
    cpu_per_bind(figures, start, last, ok)
    return figures


def run_phase(phase: str, args: argparse.Namespace, bin_dir: Path) -> dict[str, Figures]:
    results: dict[str, Figures] = {}
    for name in (SCHEDULER, BINDER):
        # maxCount above a node's units: a claim larger than any node waits for capacity,
        # as a pod does, rather than being refused by its class.
        bench = Bench.start(args.nodes, args.units, bin_dir, max_count=2 * args.units)
        with tempfile.TemporaryDirectory() as log_dir:
            peer = Peer(name, bench, Path(log_dir))
            try:
                if phase == "throughput":
                    results[name] = throughput(peer, args.count)
                elif phase == "burst":
                    results[name] = burst(peer, args.count)
                else:
                    results[name] = head_of_line(peer, args.blocked, args.ok, args.units)
            finally:
                peer.stop()
                bench.stop()
    return results


def report(phase: str, results: dict[str, Figures]) -> None:
    sched, binder = results[SCHEDULER].values, results[BINDER].values
    print(f"  {'':38} {SCHEDULER:>15} {BINDER:>10} {'binder/sched':>13}")
    for name, value in sched.items():
        other = binder[name]
        ratio = other / value if value else float("nan")
        print(f"  {name:38} {value:15.2f} {other:10.2f} {ratio:13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="objects in throughput and burst")
    parser.add_argument("--blocked", type=int, default=10_000, help="head-of-line: fit no node")
    parser.add_argument("--ok", type=int, default=1000, help="head-of-line: fit, after them")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--units", type=int, default=64, help="units of the resource per node")
    parser.add_argument("--phases", default="throughput,burst,head-of-line", help="comma-joined")
    args = parser.parse_args()
    bin_dir = cluster.binary_dir()
    print(
        f"{args.nodes} nodes x {args.units} units; kube-scheduler on Pods, then the binder on "
        f"GPUClaims, each on a fresh control plane"
    )
    for phase in args.phases.split(","):
        started = time.perf_counter()
        results = run_phase(phase, args, bin_dir)
        print(f"{phase} ({time.perf_counter() - started:.0f} s):")
        report(phase, results)


if __name__ == "__main__":
    main()
