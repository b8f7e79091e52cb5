"""The binder against its peers: kube-scheduler binding Pods, kube-scheduler allocating
devices by Dynamic Resource Allocation, and the binder serving a class of those devices, on
the same control plane build, nodes and counts, one after the other in one run (issue 13's
yardstick; DRA from issue 30; the binder's dra source from issue 45, whose goal is
binder-dra's order -> Bound at least twice DRA's own allocation rate: bdra/dra >= 2 on
binds/s).

    make setup binaries
    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python controller/benchmarks/peer_bench.py
    # smaller: --count 2000 --nodes 50 --blocked 2000 --ok 200; one phase: --phases burst
    # where kube-apiserver's CPU goes: --phases throughput --pprof DIR, then
    #   go tool pprof -top -cum DIR/binder-kube-apiserver.pprof
    # some peers: --peers dra,binder (the first is the one the others are divided by)
    # issue 45's line: --peers dra,binder-dra (fewer timed starts: --starts 2000)

Every phase runs once per peer, each time on a fresh control plane (etcd and kube-apiserver
of the test kit, the gpu and KubeVirt CRDs installed, ``--nodes`` Ready nodes of ``--units``
units of one resource name with their GPUNodes, one vGPU class serving them):

  kube-scheduler  the test kit's (client QPS 5,000) binding Pods that request 1 unit of the
                  extended resource;
  binder          the controller as deployed, its own process (``python -m cozystack_gpu``),
                  binding GPUClaims of 1 unit;
  dra             the same kube-scheduler with the same capacity also published through
                  resource.k8s.io/v1: one DeviceClass selecting the bench's driver, one
                  pool per node of ``--units`` devices (one ResourceSlice up to 128
                  devices, the most one may hold); each order is a
                  ResourceClaim for exactly 1 device of that class and a Pod using it (no
                  extended resource requested). Its DynamicResources plugin allocates: it
                  adds the claim's finalizer, writes its status.allocation and reservedFor,
                  then binds the pod (three writes per order, against the others' one).
                  An allocation counts as done when its pod is seen bound (spec.nodeName):
                  the claim is written before the binding, and after each phase every bound
                  pod's claim is checked to hold one device of its node's pool, no device
                  twice. A head-of-line order that fits no node selects a device none has
                  (a claim may count at most 32 devices, fewer than a node's units);
  binder-dra      the controller as for binder, with ``--dra true``, and the devices
                  published as for dra, binding GPUClaims of 1 unit of a passthrough class
                  of the dra source (the bench's DeviceClass, the vGPU class's nodes and
                  maxCount): a node's units are the class's devices in its ResourceSlices.
                  The binder also makes one ResourceClaim per bound claim (after the
                  binds, like its Events). Its head-of-line orders count more units than a
                  node has, as binder's do.

The load generator (8 client threads) and a watch that times binds run in this process,
apart from every decider.

  throughput    --count objects created while no decider runs, then the decider starts:
                binds/s from its start to the last bind seen, and from the first bind seen
                to the last (sustained). binder-dra then times the start step (``start_to_
                allocation``), what a VM's first start on its claim costs: once the binder
                is quiet and every bound claim's ResourceClaim exists, --starts of them
                (default: all) get a Pod naming it, pinned to the claim's node by a required
                node affinity on metadata.name (as the product's gate pins a launcher pod);
                then kube-scheduler starts and allocates each on the pinned node. A pod seen
                bound is its claim allocated; allocations/s from kube-scheduler's start to
                the last and from the first to the last, CPU per allocation (kube-
                scheduler's; the binder's, which reserves each allocated ResourceClaim for
                its claim; kube-apiserver's and etcd's), and every allocation checked to be
                one device of the pinned node's pool, no device twice. Only binder-dra has
                these rows (nan for the others);
  burst         --count objects created at the client's top speed while the decider runs:
                create -> bound p50 and p99 (create as returned to the client, bound as seen
                by the watch; for dra an order's create is its claim's and then its pod's);
  head-of-line  --blocked objects that fit no node (a pod requesting more units than a node
                has; a claim counting more units than a node has; a ResourceClaim selecting
                a device none has), then --ok that fit:
                create -> bound p50 and p99 of those.

CPU per bind: user + system time of the decider, kube-apiserver and etcd from
/proc/<pid>/stat over the measured window (throughput: first to last bind; burst and
head-of-line: first create to last bind, so the creates' cost is in the API server's
figure, alike for both), divided by the binds in it. Throughput also gives kube-apiserver's
from the first bind until the decider has gone quiet ("to quiet"): the binder sends each
bind's Event after the binds waiting, so most of its Events fall after the last bind.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from apiserver_load import (
    DRA_CLASS,
    NO_DEVICE,
    Bench,
    BoundWatcher,
    cpu_seconds,
    create_many,
    percentile,
    print_table,
    wait_until,
)

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.controller_process import ControllerProcess

SCHEDULER = "kube-scheduler"
BINDER = "binder"
DRA = "dra"
BINDER_DRA = "binder-dra"
PEERS = (SCHEDULER, BINDER, DRA, BINDER_DRA)
BINDERS = (BINDER, BINDER_DRA)  # the controller's process decides
SHORT = {SCHEDULER: "sched", BINDER: "binder", DRA: "dra", BINDER_DRA: "bdra"}
WHAT = {
    SCHEDULER: "kube-scheduler on Pods",
    BINDER: "the binder on GPUClaims",
    DRA: "kube-scheduler on ResourceClaims and their Pods (DRA)",
    BINDER_DRA: "the binder on GPUClaims of a dra class, then kube-scheduler on their Pods",
}
WATCHED = ("kube-apiserver", "etcd")
QUIET_CPU_S = 0.05  # a decider using less CPU than this in a second has gone quiet
# --pprof: seconds of kube-apiserver's CPU profile; every peer binds 10,000 for longer.
PROFILE_S = 15


@dataclass
class Figures:
    """One decider's figures in one phase, by name, in printing order."""

    values: dict[str, float] = field(default_factory=dict)

    def put(self, name: str, value: float) -> None:
        self.values[name] = value


class Peer:
    """kube-scheduler on Pods, the binder on GPUClaims (of the vGPU class or of the dra
    class) or kube-scheduler on ResourceClaims, started on demand in a bench."""

    def __init__(self, name: str, bench: Bench, log_dir: Path) -> None:
        self.name = name
        self.bench = bench
        self.log_dir = log_dir
        self.process: ControllerProcess | None = None
        self.pid = 0

    @property
    def kind(self) -> str:
        # DRA: the pod bound is the allocation done (its claim is written first).
        return "claims" if self.name in BINDERS else "pods"

    def creator(self, units: int = 1) -> Callable[[str], None]:
        if self.name == SCHEDULER:
            return self.bench.pod_creator(units)
        if self.name == DRA:
            # Orders are of one device; a larger one stands for an order fitting no node.
            return self.bench.dra_creator(NO_DEVICE if units > 1 else None)
        if self.name == BINDER_DRA:
            return self.bench.claim_creator(units, gpu_class=DRA_CLASS)
        return self.bench.claim_creator(units)

    def start(self) -> None:
        if self.name in BINDERS:
            dra = ("--dra", "true") if self.name == BINDER_DRA else ()
            self.process = ControllerProcess(
                self.bench.plane, self.bench.controller_ns, "bench", self.log_dir,
                "--workload-records", "false", "--webhook-port", "0", *dra,
            )  # fmt: skip
            self.pid = self.process.proc.pid
        else:
            self.bench.plane.start_scheduler()
            self.pid = self.bench.pid(SCHEDULER)

    def check(self, watcher: BoundWatcher, prefix: str) -> None:
        """DRA: every pod named ``prefix``... seen bound has its claim allocated one device
        of its node's pool, no claim is allocated without its pod bound, no device twice."""
        if self.name != DRA:
            return
        allocated = self.bench.allocated_devices(prefix)
        bound = {
            name: node for name, node in tuple(watcher.nodes.items()) if name.startswith(prefix)
        }
        wrong = sorted(
            name
            for name in bound.keys() | allocated.keys()
            if [pool for pool, _device in allocated.get(name, ())] != [bound.get(name)]
        )
        devices = [device for pairs in allocated.values() for device in pairs]
        if wrong or len(set(devices)) != len(devices):
            raise AssertionError(
                f"dra: {len(wrong)} claims not allocated on their pod's node (first: "
                f"{wrong[:3]}), {len(devices) - len(set(devices))} devices allocated twice"
            )

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

    def start_cpu(self) -> dict[str, float]:
        """binder-dra's start step: kube-scheduler's CPU as the decider's, the binder's
        (it reserves each allocated ResourceClaim for its claim) beside it."""
        used = {name: cpu_seconds(self.bench.pid(name)) for name in (SCHEDULER, *WATCHED)}
        used["binder"] = cpu_seconds(self.pid)
        return used


def follow(
    peer: Peer,
    watcher: BoundWatcher,
    want: int,
    prefix: str,
    timeout: float,
    cpu: Callable[[], dict[str, float]] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Poll until ``want`` objects named ``prefix``... are bound; the CPU used (``cpu``,
    by default ``peer.cpu``) when the first of them was seen bound and when the last was."""
    cpu = cpu or peer.cpu
    first: dict[str, float] | None = None
    deadline = time.monotonic() + timeout
    while True:
        bound = watcher.count(prefix)
        if first is None and bound:
            first = cpu()
        if bound >= want:
            return first or cpu(), cpu()
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{peer.name}: {bound} of {want} bound after {timeout:.0f} s\n{peer.failed()}"
            )
        time.sleep(0.02)


def settle(peer: Peer, timeout: float = 120.0) -> dict[str, float]:
    """The CPU used once the decider has gone quiet after its last bind (under
    ``QUIET_CPU_S`` of its CPU in a second): writes queued behind the binds, such as their
    Events, are sent by then."""
    deadline = time.monotonic() + timeout
    before = peer.cpu()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = peer.cpu()
        if now["decider"] - before["decider"] < QUIET_CPU_S:
            return now
        before = now
    raise TimeoutError(f"{peer.name}: not quiet {timeout:.0f} s after its last bind")


def cpu_per_bind(
    figures: Figures, start: dict[str, float], end: dict[str, float], binds: int
) -> None:
    for name in ("decider", *WATCHED):
        figures.put(f"{name} CPU ms/bind", (end[name] - start[name]) / binds * 1000)


def warm_up(peer: Peer, watcher: BoundWatcher) -> None:
    """One object bound before measuring, so the decider has listed and synced; the
    controller also ready (its /readyz: kopf's part started and the webhooks' feed built),
    so the burst meets a replica whose start is over, as kube-scheduler's is by its first
    bind."""
    peer.creator()("warm")
    follow(peer, watcher, 1, "warm", 120)
    process = peer.process
    if process is not None:
        wait_until(lambda: process.ready(timeout=1.0)[0] == 200, 60)


def profile_from_first_bind(
    peer: Peer, watcher: BoundWatcher, seconds: int, into: Path
) -> threading.Thread:
    """kube-apiserver's CPU profile over ``seconds`` from the first bind seen, in a thread."""

    def run() -> None:
        wait_until(lambda: watcher.count("t") > 0, 300)
        peer.bench.cpu_profile(seconds, into)

    thread = threading.Thread(target=run, name="pprof", daemon=True)
    thread.start()
    return thread


def throughput(
    peer: Peer, count: int, pprof: Path | None = None, starts: int | None = None
) -> Figures:
    figures = Figures()
    names = [f"t{i:05d}" for i in range(count)]
    create_many(peer.creator(), names)
    watcher = BoundWatcher(peer.bench.kube.api, peer.bench.tenant, peer.kind)
    deadline = time.monotonic() + 120
    while watcher.seen < count and time.monotonic() < deadline:
        time.sleep(0.05)  # the watch's first listing is read before the decider starts
    profiling = None
    if pprof is not None:
        profiling = profile_from_first_bind(
            peer, watcher, PROFILE_S, pprof / f"{peer.name}-kube-apiserver.pprof"
        )
    started = time.perf_counter()
    peer.start()
    first, last = follow(peer, watcher, count, "t", 900)
    quiet = settle(peer)
    watcher.stop()
    if profiling is not None:
        profiling.join()
    peer.check(watcher, "t")
    times = [watcher.bound_at[n] for n in names]
    figures.put("binds/s, start -> last bind", count / (max(times) - started))
    figures.put("binds/s, first -> last bind", (count - 1) / (max(times) - min(times)))
    figures.put("first bind after start, s", min(times) - started)
    cpu_per_bind(figures, first, last, count - 1)
    # What the binds cost when writes that trail them (Events, notes) are counted too.
    figures.put(
        "kube-apiserver CPU ms/bind, to quiet",
        (quiet["kube-apiserver"] - first["kube-apiserver"]) / (count - 1) * 1000,
    )
    figures.put("decider CPU at first bind, s", first["decider"])
    if peer.name == BINDER_DRA:
        bound = {name: watcher.nodes[name] for name in names}
        start_to_allocation(peer, figures, bound, count if starts is None else starts)
    return figures


def start_to_allocation(peer: Peer, figures: Figures, bound: dict[str, str], starts: int) -> None:
    """binder-dra, after its binds: ``starts`` of the bound claims started as the product
    starts a VM on one, and timed until kube-scheduler has allocated their ResourceClaims.

    Once every bound claim's ResourceClaim exists, one Pod per claim names it and is pinned
    to the claim's node (what the product's gate does to a launcher pod); then kube-
    scheduler starts. A pod seen bound is its claim allocated (kube-scheduler writes the
    allocation before the binding); each allocation is then checked to be one device of the
    pinned node's pool, no device twice, and no claim left unstarted allocated."""
    bench = peer.bench
    deadline = time.monotonic() + 120
    while len(made := bench.resource_claim_names("t")) < len(bound):
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{peer.name}: {len(made)} of {len(bound)} ResourceClaims made after 120 s\n"
                + peer.failed()
            )
        time.sleep(1.0)
    names = sorted(bound)[:starts]
    create_many(bench.pinned_pod_creator(bound), names)
    pods = BoundWatcher(bench.kube.api, bench.tenant, "pods")
    wait_until(lambda: pods.seen >= len(names), 120)  # listed before kube-scheduler starts
    started = time.perf_counter()
    bench.plane.start_scheduler()
    try:
        first, last = follow(peer, pods, len(names), "t", 900, peer.start_cpu)
    except TimeoutError as error:
        raise TimeoutError(f"{error}\n{bench.plane.log_tail(SCHEDULER)}") from error
    pods.stop()
    allocated = bench.allocated_devices("t")
    wrong = sorted(
        name
        for name in allocated.keys() | set(names)
        if name not in names
        or pods.nodes.get(name) != bound[name]
        or [pool for pool, _device in allocated.get(name, ())] != [bound[name]]
    )
    devices = [device for pairs in allocated.values() for device in pairs]
    if wrong or len(set(devices)) != len(devices):
        raise AssertionError(
            f"{peer.name}: {len(wrong)} claims not allocated on their pinned node (first: "
            f"{wrong[:3]}), {len(devices) - len(set(devices))} devices allocated twice"
        )
    times = [pods.bound_at[name] for name in names]
    figures.put("starts timed", len(names))
    figures.put("allocations/s, start -> last", len(names) / (max(times) - started))
    figures.put("allocations/s, first -> last", (len(names) - 1) / (max(times) - min(times)))
    figures.put("first allocation after start, s", min(times) - started)
    for name in (SCHEDULER, "binder", *WATCHED):
        figures.put(
            f"{name} CPU ms/allocation", (last[name] - first[name]) / (len(names) - 1) * 1000
        )


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
    peer.check(watcher, "b")
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
    peer.check(watcher, "x")
    peer.check(watcher, "ok")
    latency(figures, created, watcher)
    cpu_per_bind(figures, start, last, ok)
    return figures


def run_phase(
    phase: str, args: argparse.Namespace, bin_dir: Path, peers: list[str]
) -> dict[str, Figures]:
    results: dict[str, Figures] = {}
    for name in peers:
        # maxCount above a node's units: a claim larger than any node waits for capacity,
        # as a pod does, rather than being refused by its class.
        bench = Bench.start(
            args.nodes, args.units, bin_dir, max_count=2 * args.units, profiling=bool(args.pprof)
        )
        with tempfile.TemporaryDirectory() as log_dir:
            peer = Peer(name, bench, Path(log_dir))
            try:
                if name in (DRA, BINDER_DRA):
                    bench.publish_devices(args.nodes, args.units)
                if name == BINDER_DRA:
                    bench.dra_class(max_count=2 * args.units)
                if phase == "throughput":
                    results[name] = throughput(peer, args.count, args.pprof, args.starts)
                elif phase == "burst":
                    results[name] = burst(peer, args.count)
                else:
                    results[name] = head_of_line(peer, args.blocked, args.ok, args.units)
            finally:
                peer.stop()
                bench.stop()
    return results


def report(results: dict[str, Figures]) -> None:
    """Each peer's figures in a column, then each later peer's divided by the first's."""
    print_table({name: figures.values for name, figures in results.items()}, SHORT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=10_000, help="objects in throughput and burst")
    parser.add_argument("--blocked", type=int, default=10_000, help="head-of-line: fit no node")
    parser.add_argument("--ok", type=int, default=1000, help="head-of-line: fit, after them")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--units", type=int, default=64, help="units of the resource per node")
    parser.add_argument(
        "--starts",
        type=int,
        default=None,
        help="binder-dra, throughput: bound claims started to time allocations (default: all)",
    )
    parser.add_argument("--phases", default="throughput,burst,head-of-line", help="comma-joined")
    parser.add_argument(
        "--pprof",
        type=Path,
        default=None,
        help=f"throughput: write kube-apiserver's CPU profile over {PROFILE_S} s from the first "
        "bind to DIR/<peer>-kube-apiserver.pprof (go tool pprof -top)",
    )
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-joined, of {', '.join(PEERS)}"
    )
    args = parser.parse_args()
    peers = args.peers.split(",")
    if not set(peers) <= set(PEERS) or len(set(peers)) != len(peers):
        parser.error(f"--peers {args.peers}: each once, of {', '.join(PEERS)}")
    if args.starts is not None and args.starts < 2:
        parser.error("--starts: at least 2 (a rate from the first allocation to the last)")
    bin_dir = cluster.binary_dir()
    if args.pprof is not None:
        args.pprof.mkdir(parents=True, exist_ok=True)
    print(
        f"{args.nodes} nodes x {args.units} units; "
        + ", then ".join(WHAT[name] for name in peers)
        + ", each on a fresh control plane"
    )
    for phase in args.phases.split(","):
        started = time.perf_counter()
        results = run_phase(phase, args, bin_dir, peers)
        print(f"{phase} ({time.perf_counter() - started:.0f} s):")
        report(results)


if __name__ == "__main__":
    main()
