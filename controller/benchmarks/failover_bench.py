"""Failover: a leader SIGKILLed -> the first bind by the new leader, for kube-scheduler and the
binder on the same control plane build, with orders waiting and holds bound (issue 30).

    make setup binaries
    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) \
        .venv/bin/python controller/benchmarks/failover_bench.py
    # smaller: --waiting 500 --held 2000 --nodes 20; one peer: --peers binder

Each peer runs on a fresh control plane (etcd and kube-apiserver of the test kit, the gpu and
KubeVirt CRDs, ``--nodes`` Ready nodes of ``--units`` units of one resource name with their
GPUNodes, one vGPU class serving them), two deciders of the same kind on it, campaigning for
one Lease with the same timing (the controller's defaults, ``leader.LeaseTiming``: 15 s
duration, 10 s renew deadline, 2 s retry period, passed explicitly to both):

  kube-scheduler  two processes of the test kit's binary, ``leaderElection.leaderElect``
                  on (Lease kube-system/kube-scheduler), binding Pods of 1 unit of the
                  extended resource;
  binder          two replicas of the controller as deployed (``python -m cozystack_gpu``,
                  usage records off, no webhook server), Lease ``cozystack-gpu-binder`` in
                  the controller's namespace, binding GPUClaims of 1 unit.

The procedure isolates the takeover:

  1. start one decider, wait until it holds the Lease, start the other (the standby: it
     lists and watches, kube-scheduler's informers and the replica's cache alike);
  2. create ``--held`` objects and wait until all are bound (the holds the new leader must
     take into account);
  3. read the Lease's holder and SIGSTOP that process: it keeps the Lease but does nothing.
     From here this process renews the Lease in the stopped leader's name every retry period,
     as the leader would, so the standby does not take over while it is merely stopped;
  4. create ``--waiting`` objects (nothing binds them; the standby watches them arrive);
  5. stop renewing, SIGKILL the stopped leader right after a last renewal: t0. So the
     standby waits a whole lease duration from when it saw that renewal, as after a crash
     just after a renewal (a real crash comes up to one retry period later: add 0-2 s);
  6. time from t0: the Lease's holderIdentity turning to another identity (a watch on the
     Lease), the first waiting object seen bound (a watch on the objects), all of them
     bound.

The standby's CPU (user + system, /proc/<pid>/stat) and RSS (VmRSS, /proc/<pid>/status) are
read before the waiting creates, just before the kill, when the Lease is seen taken and when
the first bind is seen. The load average (as ``uptime`` prints it) goes with each peer's
figures: the cores are shared, so the ratio within a run is the figure to read.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from apiserver_load import (
    RESOURCE,
    Bench,
    BoundWatcher,
    cpu_seconds,
    create_many,
    node_name,
    print_table,
)
from kubernetes import client, watch

from cozystack_gpu import keys
from cozystack_gpu.leader import LeaseTiming
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.controller_process import ControllerProcess, rss_bytes

SCHEDULER = "kube-scheduler"
BINDER = "binder"
PEERS = (SCHEDULER, BINDER)
SHORT = {SCHEDULER: "sched", BINDER: "binder"}
WHAT = {SCHEDULER: "two kube-schedulers on Pods", BINDER: "two binder replicas on GPUClaims"}
# The controller's defaults; both peers get them explicitly.
TIMING = LeaseTiming()
SCHEDULER_LEASE = ("kube-system", "kube-scheduler")
NODE_PODS = 110  # the test kit's nodes' pods allocatable
MAX_UNITS = 240  # the test kit's GPUNodes number functions 0000:10:00.0 ... 0000:ff:00.0
MIB = 1024 * 1024
_PR_SET_PDEATHSIG = 1


def load_average() -> str:
    one, five, fifteen = os.getloadavg()  # what uptime prints, from /proc/loadavg
    return f"load average: {one:.2f}, {five:.2f}, {fifteen:.2f}"


def resume(pid: int) -> None:
    """SIGCONT, so that a leader left stopped by a failed run ends on SIGTERM at once."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _micro_time(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _die_with_parent() -> None:
    # A benchmark killed mid-run must not leave a kube-scheduler campaigning.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Sample:
    """A process's CPU seconds and RSS at one moment, and when."""

    at: float
    cpu: float
    rss: int

    @classmethod
    def of(cls, pid: int) -> Sample:
        return cls(time.perf_counter(), cpu_seconds(pid), rss_bytes(pid))


class LeaseWatcher:
    """Records each change of a Lease's holderIdentity and when it was seen, by a watch."""

    def __init__(self, api: Any, namespace: str, name: str) -> None:
        self._coordination = client.CoordinationV1Api(api)
        self._namespace, self._name = namespace, name
        self.changes: list[tuple[float, str]] = []
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def holder(self) -> str:
        return self.changes[-1][1] if self.changes else ""

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop:
                raise

    def _watch(self) -> None:
        version: str | None = None
        while not self._stop:
            kwargs: dict[str, Any] = {
                "field_selector": f"metadata.name={self._name}",
                "timeout_seconds": 60,
                "deserialize": False,
            }
            if version:
                kwargs["resource_version"] = version
            stream = watch.Watch().stream(
                self._coordination.list_namespaced_lease, self._namespace, **kwargs
            )
            for event in stream:
                if event["type"] == "ERROR":  # expired version: list again
                    version = None
                    break
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion") or version
                holder = (obj.get("spec") or {}).get("holderIdentity") or ""
                if holder != self.holder:
                    self.changes.append((time.perf_counter(), holder))
                if self._stop:
                    return

    def taken_from(self, leader: str, since: float) -> tuple[float, str] | None:
        """When, after ``since``, the Lease was first seen held by someone not ``leader``."""
        for at, holder in tuple(self.changes):
            if at >= since and holder and holder != leader:
                return at, holder
        return None

    def wait_held(self, timeout: float, failed: Callable[[], str]) -> str:
        deadline = time.monotonic() + timeout
        while not self.holder:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nobody took the Lease in {timeout:.0f} s\n{failed()}")
            time.sleep(0.05)
        return self.holder

    def stop(self) -> None:
        self._stop = True


class LeaseKeeper:
    """Renews a Lease in its holder's name every retry period while the holder is stopped:
    a live leader's renewals, without the leader's work. Each renewal is a compare-and-swap
    (resourceVersion), and a Lease found with another holder fails the benchmark."""

    def __init__(self, api: Any, namespace: str, name: str, holder: str) -> None:
        self._coordination = client.CoordinationV1Api(api)
        self._namespace, self._name, self.holder = namespace, name, holder
        self.failure: str | None = None
        self.last = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.renew()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(TIMING.retry_period):
            try:
                self.renew()
            except Exception as exc:  # reported by the measuring thread
                self.failure = f"{type(exc).__name__}: {exc}"
                return

    def renew(self) -> None:
        lease = self._coordination.read_namespaced_lease(self._name, self._namespace)
        if lease.spec.holder_identity != self.holder:
            raise RuntimeError(
                f"the Lease moved to {lease.spec.holder_identity!r} while its leader was stopped"
            )
        body = {
            "metadata": {"resourceVersion": lease.metadata.resource_version},
            "spec": {"renewTime": _micro_time(datetime.datetime.now(datetime.UTC))},
        }
        self._coordination.patch_namespaced_lease(self._name, self._namespace, body)
        self.last = time.perf_counter()

    def check(self) -> None:
        if self.failure is not None:
            raise RuntimeError(f"renewing the stopped leader's Lease failed: {self.failure}")

    def stop_after_renewal(self) -> None:
        """Stops the renewals with one last one, done when this returns."""
        self._stop.set()
        self._thread.join()
        self.check()
        # client-go compares records at whole seconds: a renewal in the second of the one
        # before would not count as one for kube-scheduler.
        time.sleep(max(0.0, self.last + 1.0 - time.perf_counter()))
        self.renew()


class Pair:
    """Two deciders of one kind on one bench; ``pids`` by Lease identity once known."""

    kind = ""
    lease: tuple[str, str] = ("", "")

    def __init__(self, bench: Bench, log_dir: Path) -> None:
        self.bench = bench
        self.log_dir = log_dir
        self.pids: dict[str, int] = {}

    def start_leader(self, leases: LeaseWatcher) -> str:
        """Starts the first decider and waits until it holds the Lease; its identity."""
        raise NotImplementedError

    def start_standby(self) -> int:
        """Starts the second decider and waits until it campaigns; its pid."""
        raise NotImplementedError

    def creator(self) -> Callable[[str], None]:
        raise NotImplementedError

    def kill(self, pid: int) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def failed(self) -> str:
        raise NotImplementedError


class SchedulerPair(Pair):
    kind = "pods"
    lease = SCHEDULER_LEASE

    def __init__(self, bench: Bench, log_dir: Path) -> None:
        super().__init__(bench, log_dir)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.config = log_dir / "kube-scheduler.yaml"
        namespace, name = self.lease
        self.config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(bench.plane.kubeconfig),
                        "qps": cluster.CLIENT_QPS,
                        "burst": cluster.CLIENT_BURST,
                    },
                    "leaderElection": {
                        "leaderElect": True,
                        "leaseDuration": f"{TIMING.lease_duration:g}s",
                        "renewDeadline": f"{TIMING.renew_deadline:g}s",
                        "retryPeriod": f"{TIMING.retry_period:g}s",
                        "resourceLock": "leases",
                        "resourceNamespace": namespace,
                        "resourceName": name,
                    },
                }
            )
        )

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = self.log_dir / f"{SCHEDULER}-{len(self.procs)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(self.bench.plane.bin_dir / SCHEDULER),
                    f"--config={self.config}",
                    "--secure-port=0",
                    "--v=1",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        self.procs.append(proc)
        return proc

    def start_leader(self, leases: LeaseWatcher) -> str:
        proc = self._spawn()
        # kube-scheduler names itself hostname_<uuid>: the first holder is the first process.
        identity = leases.wait_held(120, self.failed)
        self.pids[identity] = proc.pid
        return identity

    def start_standby(self) -> int:
        proc = self._spawn()
        log = self.log_dir / f"{SCHEDULER}-1.log"
        # Logged when it starts campaigning (its informers run while it stands by).
        deadline = time.monotonic() + 120
        while b"attempting to acquire leader lease" not in log.read_bytes().lower():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the standby kube-scheduler did not campaign\n{self.failed()}")
            time.sleep(0.1)
        return proc.pid

    def creator(self) -> Callable[[str], None]:
        return self.bench.pod_creator(1)

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        for proc in self.procs:
            if proc.pid == pid:
                proc.wait()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:  # never signal a pid already reaped
                resume(proc.pid)
                cluster.terminate(proc.pid, proc, 10)

    def failed(self) -> str:
        return "\n".join(
            f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            for log in sorted(self.log_dir.glob(f"{SCHEDULER}-*.log"))
        )


class BinderPair(Pair):
    kind = "claims"

    def __init__(self, bench: Bench, log_dir: Path) -> None:
        super().__init__(bench, log_dir)
        self.lease = (bench.controller_ns, keys.LEASE_NAME_BINDER)
        self.replicas: dict[int, ControllerProcess] = {}

    def _spawn(self, identity: str) -> ControllerProcess:
        replica = ControllerProcess(
            self.bench.plane, self.bench.controller_ns, identity, self.log_dir,
            "--workload-records", "false", "--webhook-port", "0",
            # No node agents run here: their GPUNodes must not go stale mid-run.
            "--inventory-stale-after", "0",
            "--lease-duration", f"{TIMING.lease_duration:g}",
            "--renew-deadline", f"{TIMING.renew_deadline:g}",
            "--retry-period", f"{TIMING.retry_period:g}",
        )  # fmt: skip
        self.replicas[replica.proc.pid] = replica
        self.pids[identity] = replica.proc.pid
        return replica

    def start_leader(self, leases: LeaseWatcher) -> str:
        self._spawn("bench-a")
        return leases.wait_held(120, self.failed)

    def start_standby(self) -> int:
        replica = self._spawn("bench-b")
        # Ready once its admission feed, on the process's one cache, has read the cluster.
        deadline = time.monotonic() + 120
        while replica.ready(timeout=2)[0] != 200:
            if replica.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the standby replica did not get ready\n{self.failed()}")
            time.sleep(0.2)
        return replica.proc.pid

    def creator(self) -> Callable[[str], None]:
        return self.bench.claim_creator(1)

    def kill(self, pid: int) -> None:
        self.replicas[pid].kill()

    def stop(self) -> None:
        for replica in self.replicas.values():
            if replica.proc.poll() is None:
                resume(replica.proc.pid)
            replica.stop()

    def failed(self) -> str:
        return "\n".join(
            f"--- {replica.identity}\n{replica.log_tail(20)}" for replica in self.replicas.values()
        )


@dataclass
class Figures:
    """One peer's figures by name, in printing order, and the load at the kill."""

    values: dict[str, float] = field(default_factory=dict)
    load: str = ""

    def put(self, name: str, value: float) -> None:
        self.values[name] = value


def roomy_nodes(bench: Bench, nodes: int, units: int) -> None:
    """More pods allowed per node than the kit's 110 when a node has more units, so the
    pods fit as the claims do."""
    if units <= NODE_PODS:
        return
    allocatable = {RESOURCE: units, "pods": units}
    with ThreadPoolExecutor(8) as pool:
        list(
            pool.map(
                lambda i: bench.kube.node_status(node_name(i), allocatable=allocatable),
                range(nodes),
            )
        )


def wait_bound(pair: Pair, watcher: BoundWatcher, prefix: str, want: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (bound := watcher.count(prefix)) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"{bound} of {want} {prefix}... bound after {timeout:.0f} s\n{pair.failed()}"
            )
        time.sleep(0.05)


def failover(pair: Pair, held: int, waiting: int) -> Figures:
    figures = Figures()
    namespace, name = pair.lease
    api = pair.bench.kube.api
    leases = LeaseWatcher(api, namespace, name)
    watcher = BoundWatcher(api, pair.bench.tenant, pair.kind)
    try:
        first = pair.start_leader(leases)
        standby_pid = pair.start_standby()

        started = time.perf_counter()
        create_many(pair.creator(), (f"h{i:06d}" for i in range(held)))
        wait_bound(pair, watcher, "h", held, 300 + held / 20)
        print(f"  {held} held bound in {time.perf_counter() - started:.1f} s; {load_average()}")

        leader = leases.holder
        leader_pid = pair.pids.get(leader)
        if leader != first or leader_pid is None or leader_pid == standby_pid:
            raise RuntimeError(f"the Lease moved from {first!r} to {leader!r} before the kill")
        os.kill(leader_pid, signal.SIGSTOP)
        keeper = LeaseKeeper(api, namespace, name, leader)
        keeper.start()
        stood = Sample.of(standby_pid)

        seen = watcher.seen
        started = time.perf_counter()
        create_many(pair.creator(), (f"w{i:06d}" for i in range(waiting)))
        figures.put("waiting creates, s", time.perf_counter() - started)
        # The standby's watch gets what ours does; a moment more for it to digest them.
        deadline = time.monotonic() + 60
        while watcher.seen < seen + waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2 * TIMING.retry_period)
        keeper.check()
        if watcher.count("w"):
            raise RuntimeError(f"{watcher.count('w')} waiting bound while the leader was stopped")

        before = Sample.of(standby_pid)
        figures.load = load_average()
        keeper.stop_after_renewal()
        pair.kill(leader_pid)
        killed = time.perf_counter()

        taken: tuple[float, str] | None = None
        at_lease: Sample | None = None
        at_bind: Sample | None = None
        deadline = time.monotonic() + 300 + waiting / 10
        while watcher.count("w") < waiting:
            if taken is None and (taken := leases.taken_from(leader, killed)):
                at_lease = Sample.of(standby_pid)
            if at_bind is None and watcher.count("w"):
                at_bind = Sample.of(standby_pid)
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{watcher.count('w')} of {waiting} waiting bound after the kill\n"
                    f"{pair.failed()}"
                )
            time.sleep(0.02)
        taken = taken or leases.taken_from(leader, killed)
        if taken is None:
            raise RuntimeError(f"waiting orders bound but the Lease never left {leader!r}")
        at_lease = at_lease or Sample.of(standby_pid)
        at_bind = at_bind or Sample.of(standby_pid)

        waits = sorted(watcher.bound_at[f"w{i:06d}"] for i in range(waiting))
        figures.put("last renewal -> kill, s", killed - keeper.last)
        figures.put("kill -> Lease taken, s", taken[0] - killed)
        figures.put("Lease taken -> first bind, s", waits[0] - taken[0])
        figures.put("kill -> first bind, s", waits[0] - killed)
        figures.put("kill -> all waiting bound, s", waits[-1] - killed)
        if waiting > 1:
            figures.put("binds/s, first -> last", (waiting - 1) / (waits[-1] - waits[0]))
        figures.put("standby CPU standing by (creates), s", before.cpu - stood.cpu)
        figures.put("standby CPU before the kill, s", before.cpu)
        figures.put("standby CPU kill -> Lease taken, s", at_lease.cpu - before.cpu)
        figures.put("standby CPU kill -> first bind, s", at_bind.cpu - before.cpu)
        figures.put("standby CPU at first bind, s", at_bind.cpu)
        figures.put("standby RSS before the kill, MiB", before.rss / MIB)
        figures.put("standby RSS at first bind, MiB", at_bind.rss / MIB)
        return figures
    finally:
        watcher.stop()
        leases.stop()


def run_peer(peer: str, args: argparse.Namespace, bin_dir: Path) -> Figures:
    bench = Bench.start(args.nodes, args.units, bin_dir)
    try:
        roomy_nodes(bench, args.nodes, args.units)
        with contextlib.ExitStack() as stack:
            if args.log_dir:  # kept for reading afterwards
                log_dir = Path(args.log_dir) / peer
                log_dir.mkdir(parents=True, exist_ok=True)
            else:
                log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            pair_type = SchedulerPair if peer == SCHEDULER else BinderPair
            pair = pair_type(bench, log_dir)
            try:
                return failover(pair, args.held, args.waiting)
            finally:
                pair.stop()
    finally:
        bench.stop()


def report(results: dict[str, Figures]) -> None:
    """Each peer's figures in a column, each later peer's divided by the first's, and the load
    at each kill."""
    print_table({name: figures.values for name, figures in results.items()}, SHORT)
    for name in results:
        print(f"  {name} at the kill: {results[name].load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waiting", type=int, default=10_000, help="created while stopped")
    parser.add_argument("--held", type=int, default=50_000, help="bound before the stop")
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--units", type=int, default=128, help="units of the resource per node")
    parser.add_argument(
        "--peers", default=",".join(PEERS), help=f"comma-joined, of {', '.join(PEERS)}"
    )
    parser.add_argument("--log-dir", default="", help="keep the deciders' logs here, by peer")
    args = parser.parse_args()
    peers = args.peers.split(",")
    if not set(peers) <= set(PEERS) or len(set(peers)) != len(peers):
        parser.error(f"--peers {args.peers}: each once, of {', '.join(PEERS)}")
    if args.waiting < 1 or args.held < 0:
        parser.error("--waiting must be at least 1 and --held not negative")
    if not 1 <= args.units <= MAX_UNITS:
        parser.error(f"--units must be 1 to {MAX_UNITS} (the GPUNodes' PCI addresses)")
    if args.nodes * args.units < args.held + args.waiting:
        parser.error(
            f"--nodes x --units = {args.nodes * args.units} units, fewer than "
            f"--held + --waiting = {args.held + args.waiting}"
        )
    bin_dir = cluster.binary_dir()
    print(
        f"{args.nodes} nodes x {args.units} units, {args.held} held, {args.waiting} waiting; "
        f"Lease {TIMING.lease_duration:g} s / renew {TIMING.renew_deadline:g} s / "
        f"retry {TIMING.retry_period:g} s; "
        + ", then ".join(WHAT[name] for name in peers)
        + ", each on a fresh control plane"
    )
    print(f"  {load_average()}")
    results: dict[str, Figures] = {}
    for peer in peers:
        started = time.perf_counter()
        print(f"{peer}:")
        results[peer] = run_peer(peer, args, bin_dir)
        print(f"  done in {time.perf_counter() - started:.0f} s; {load_average()}")
    report(results)


if __name__ == "__main__":
    main()
