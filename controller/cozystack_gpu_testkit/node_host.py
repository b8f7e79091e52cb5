"""The host-global state a real node (``node``) touches, recorded before it starts and put
back after it stops.

kubelet and containerd keep some state where no flag moves it: the device-plugin directory
(``/var/lib/kubelet/device-plugins``, always), ``/var/log/containers``, the shims' sockets
under ``/run/containerd``; kubelet sets kernel sysctls at start; the node's cgroups live at
the top of each cgroup hierarchy, and its pods' bridge in the host's network namespace. So
there is one real node per machine at a time (``NodeLock``), and its stop removes exactly
what appeared during its life (``HostPaths``), restores the sysctls (``Sysctls``), removes
its cgroups and its bridge, and unmounts what it mounted.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

LOCK_FILE = Path("/run/lock/cozystack-gpu-real-node.lock")
# What a running node recorded (``HostRecord``), removed by its stop: found by the next start,
# it is the record of a node whose process was killed, and that start puts the host back.
RECORD_FILE = Path("/run/lock/cozystack-gpu-real-node.json")
# Directories kubelet or containerd write whatever their flags say: entries that appear in
# them during the node's life are the node's.
HOST_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/containerd"),
)
# kubelet's setupKernelTunables sets these when protectKernelDefaults is false.
SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
)
CGROUP_FS = Path("/sys/fs/cgroup")
# The iptables chains kubelet makes to probe which iptables the host uses.
KUBELET_CHAINS = (
    ("mangle", "KUBE-IPTABLES-HINT"),
    ("mangle", "KUBE-KUBELET-CANARY"),
    ("nat", "KUBE-KUBELET-CANARY"),
    ("filter", "KUBE-KUBELET-CANARY"),
)


DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def other_kubelet() -> bool:
    """Whether a kubelet not started by the kit serves the fixed device-plugin socket (this
    machine is a cluster's node): a real node would take that socket over."""
    if not DEVICE_PLUGIN_SOCKET.exists():
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(DEVICE_PLUGIN_SOCKET))
        except OSError:
            return False
    return True


class NodeBusy(RuntimeError):
    """Another real node runs on this machine (its lock is held)."""


class NodeLock:
    """One real node per machine: an exclusive ``flock`` on ``LOCK_FILE``, released by
    ``release`` or by the kernel when the holding process dies (even on SIGKILL)."""

    def __init__(self, path: Path = LOCK_FILE) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self, timeout: float) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise NodeBusy(
                        f"another real node holds {self.path} (one per machine: kubelet's "
                        f"device-plugin directory is fixed); waited {timeout:.0f} s"
                    ) from None
                time.sleep(0.5)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    @property
    def fd(self) -> int:
        """The locked descriptor: a process given it (``pass_fds``) holds the lock as long
        as it lives, after this one has gone (a node that outlives ``make cluster``)."""
        if self._fd is None:
            raise NodeBusy("the lock is not held")
        return self._fd

    def hand_over(self) -> None:
        """Closes this process's descriptor without unlocking: the process given ``fd``
        keeps the lock."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


@dataclass
class Sysctls:
    """The values of ``SYSCTLS`` before kubelet changed them."""

    before: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def _path(name: str) -> Path:
        return Path("/proc/sys") / name.replace(".", "/")

    def record(self) -> None:
        for name in SYSCTLS:
            with contextlib.suppress(OSError):
                self.before[name] = self._path(name).read_text().strip()

    def restore(self) -> list[str]:
        """Writes back every recorded value that changed; the names it could not write."""
        failed = []
        for name, value in self.before.items():
            path = self._path(name)
            try:
                if path.read_text().strip() != value:
                    path.write_text(value)
            except OSError:
                failed.append(name)
        return failed


@dataclass
class HostPaths:
    """What each of ``HOST_PATHS`` held before the node started (None: it did not exist)."""

    before: dict[Path, frozenset[str] | None] = field(default_factory=dict)

    def record(self) -> None:
        for path in HOST_PATHS:
            self.before[path] = frozenset(os.listdir(path)) if path.is_dir() else None

    def remove_new(self) -> None:
        """Removes each path the node made, and each entry that appeared in one it found."""
        for path, entries in self.before.items():
            if not path.exists():
                continue
            if entries is None:
                unmount_under(path)
                shutil.rmtree(path, ignore_errors=True)
                continue
            for name in set(os.listdir(path)) - entries:
                unmount_under(path / name)
                target = path / name
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        target.unlink()


def _mounts_under(path: Path) -> list[str]:
    """Mount points at or below ``path``, deepest first (from /proc/self/mountinfo)."""
    prefix = str(path.resolve()) if path.exists() else str(path)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(found, key=lambda p: p.count("/"), reverse=True)


def unmount_under(path: Path) -> None:
    """Unmounts everything mounted at or below ``path`` (overlay roots, pods' tmpfs volumes
    and shm, network namespaces); lazily when a mount is still busy."""
    for point in _mounts_under(path):
        done = subprocess.run(["umount", point], capture_output=True, check=False)
        if done.returncode != 0:
            subprocess.run(["umount", "--lazy", point], capture_output=True, check=False)


def cgroup_hierarchies() -> list[Path]:
    """The mounted cgroup v1 hierarchies (and the v2 one of a hybrid host)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        fstype = parts[parts.index("-") + 1]
        if fstype in ("cgroup", "cgroup2") and parts[4].startswith(str(CGROUP_FS)):
            found.append(Path(parts[4]))
    return found


def make_cgroup_root(name: str) -> list[Path]:
    """kubelet's ``cgroupRoot`` (``/<name>``) in every hierarchy: kubelet refuses a root that
    does not exist. cpuset's needs CPUs and memory nodes before any task may join it: the
    top's values, copied."""
    made = []
    for hierarchy in cgroup_hierarchies():
        path = hierarchy / name
        path.mkdir(exist_ok=True)
        made.append(path)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / knob).exists():
                (path / knob).write_text((hierarchy / knob).read_text())
    return made


def remove_cgroups(roots: list[Path], timeout: float = 10.0) -> list[Path]:
    """Removes each root and the cgroups kubelet made under it, deepest first, killing any
    process still in one; the cgroups it could not remove."""
    left = []
    for root in roots:
        if not root.exists():
            continue
        dirs = sorted(
            (p for p in root.rglob("*") if p.is_dir()),
            key=lambda p: len(p.parts),
            reverse=True,
        )
        for path in [*dirs, root]:
            if not _rmdir_cgroup(path, timeout):
                left.append(path)
    return left


def _rmdir_cgroup(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
        with contextlib.suppress(OSError):
            for pid in (path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.1)


def pids_with_argument(argument: str) -> list[int]:
    """Processes with ``argument`` (a whole word) on their command line: the node's containerd
    shims (``-address <the node's socket>``), which leave containerd's process tree (they run
    as their own session leaders) and outlive it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in cmdline:
            found.append(int(entry.name))
    return found


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class IptablesChains:
    """Which of ``KUBELET_CHAINS`` existed before kubelet started."""

    before: set[tuple[str, str, str]] = field(default_factory=set)

    @staticmethod
    def _exists(program: str, table: str, chain: str) -> bool:
        if shutil.which(program) is None:
            return False
        done = subprocess.run(
            [program, "-w", "5", "-t", table, "-S", chain], capture_output=True, check=False
        )
        return done.returncode == 0

    def record(self) -> None:
        for program in ("iptables", "ip6tables"):
            for table, chain in KUBELET_CHAINS:
                if self._exists(program, table, chain):
                    self.before.add((program, table, chain))

    def remove_new(self) -> None:
        for program in ("iptables", "ip6tables"):
            for table, chain in KUBELET_CHAINS:
                if (program, table, chain) in self.before:
                    continue
                if self._exists(program, table, chain):
                    for op in ("-F", "-X"):
                        subprocess.run(
                            [program, "-w", "5", "-t", table, op, chain],
                            capture_output=True,
                            check=False,
                        )


def make_bridge(name: str, address: str) -> None:
    """A bridge in the host's network namespace with ``address`` (``a.b.c.d/len``), up: the
    CNI bridge plugin takes it as it finds it and adds the pods' ends to it."""
    if not Path("/sys/class/net", name).exists():
        subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True)
    subprocess.run(["ip", "address", "replace", address, "dev", name], check=True)
    subprocess.run(["ip", "link", "set", name, "up"], check=True)


# The node's own nat chain: kube-proxy's work for the one Service its pods need.
SERVICE_CHAIN = "CGPU-NODE-SERVICES"


def _nat(*args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["iptables", "-w", "5", "-t", "nat", *args], capture_output=True, check=check
    )


def route_service(bridge: str, cluster_ip: str, port: int, target: str) -> None:
    """Pods on ``bridge`` reach ``cluster_ip:port`` at ``target`` (``address:port``), as
    kube-proxy would route a Service; no kube-proxy runs here. The target may be loopback
    (kube-apiserver of the test plane listens there): the bridge then accepts packets
    rewritten to 127.0.0.1 (``route_localnet``, a setting of the bridge that goes with it)."""
    remove_service_routes(bridge)
    _nat("-N", SERVICE_CHAIN)
    _nat(
        "-A", SERVICE_CHAIN, "-d", f"{cluster_ip}/32", "-p", "tcp", "--dport", str(port),
        "-j", "DNAT", "--to-destination", target,
    )  # fmt: skip
    _nat("-I", "PREROUTING", "-i", bridge, "-j", SERVICE_CHAIN)
    if target.startswith("127."):
        Path("/proc/sys/net/ipv4/conf", bridge, "route_localnet").write_text("1\n")


def remove_service_routes(bridge: str) -> None:
    """Removes what ``route_service`` added (no-op when it is not there)."""
    while _nat("-D", "PREROUTING", "-i", bridge, "-j", SERVICE_CHAIN, check=False).returncode == 0:
        pass
    _nat("-F", SERVICE_CHAIN, check=False)
    _nat("-X", SERVICE_CHAIN, check=False)


def delete_link(name: str) -> None:
    """Deletes a network interface of the host's namespace (the node's pod bridge)."""
    if Path("/sys/class/net", name).exists():
        subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)


def remove_cni_results(
    network: str, sandboxes: set[str], cache: Path = Path("/var/lib/cni/results")
) -> None:
    """libcni's cached results (``<network>-<sandbox id>-<interface>``) of the node's network
    and of containerd's own loopback network for the node's sandboxes, left when a sandbox
    went without a CNI DEL: the cache directory is libcni's default, shared with podman, so
    only the node's entries go."""
    if not cache.is_dir():
        return
    for entry in cache.iterdir():
        ours = entry.name.startswith(f"{network}-") or any(
            f"-{s}-" in entry.name for s in sandboxes
        )
        if ours:
            with contextlib.suppress(OSError):
                entry.unlink()


@dataclass
class HostRecord:
    """Everything a node changes on the host, recorded before it changes it, and how to put it
    back (``put_back``). Kept in ``RECORD_FILE`` while the node runs (``save``), so a start
    after a killed run can put the host back first (``recover``)."""

    workdir: Path
    socket: Path
    sysctls: Sysctls = field(default_factory=Sysctls)
    paths: HostPaths = field(default_factory=HostPaths)
    chains: IptablesChains = field(default_factory=IptablesChains)
    cgroups: list[Path] = field(default_factory=list)
    bridge: str = ""
    network: str = ""
    # Set once the node routes a Service for its pods (``route_service``).
    routes_services: bool = False

    def record(self) -> None:
        self.sysctls.record()
        self.paths.record()
        self.chains.record()

    def save(self, path: Path = RECORD_FILE) -> None:
        body = {
            "workdir": str(self.workdir),
            "socket": str(self.socket),
            "sysctls": self.sysctls.before,
            "paths": {
                str(p): None if e is None else sorted(e) for p, e in self.paths.before.items()
            },
            "chains": sorted(list(c) for c in self.chains.before),
            "cgroups": [str(p) for p in self.cgroups],
            "bridge": self.bridge,
            "network": self.network,
            "routes_services": self.routes_services,
        }
        path.write_text(json.dumps(body, indent=1))

    @classmethod
    def load(cls, path: Path = RECORD_FILE) -> HostRecord:
        body = json.loads(path.read_text())
        paths = {Path(p): None if e is None else frozenset(e) for p, e in body["paths"].items()}
        return cls(
            workdir=Path(body["workdir"]),
            socket=Path(body["socket"]),
            sysctls=Sysctls(dict(body["sysctls"])),
            paths=HostPaths(paths),
            chains=IptablesChains({(c[0], c[1], c[2]) for c in body["chains"]}),
            cgroups=[Path(p) for p in body["cgroups"]],
            bridge=body["bridge"],
            network=body["network"],
            routes_services=bool(body.get("routes_services", False)),
        )

    def put_back(self, containers: set[str], *, remove_workdir: bool) -> list[str]:
        """Kills the shims still serving the node's socket, unmounts everything under its
        work directory, removes its cgroups (killing what is left in them), its Service
        routes, its bridge and CNI results, new host-path entries and iptables chains,
        restores the sysctls; what could not be put back."""
        problems = []
        # containerd keeps each task's bundle under its state directory (the socket's), named
        # by the container's id: the sandboxes whose CNI results may be left.
        tasks = self.socket.parent / "io.containerd.runtime.v2.task"
        containers = containers | {p.name for p in tasks.glob("*/*") if p.is_dir()}
        kill_all(pids_with_argument(str(self.socket)))
        unmount_under(self.workdir)
        left = remove_cgroups(self.cgroups)
        if left:
            problems.append(f"cgroups left: {', '.join(map(str, left))}")
        if self.routes_services:
            remove_service_routes(self.bridge)
        if self.bridge:
            delete_link(self.bridge)
        if self.network:
            remove_cni_results(self.network, containers)
        self.paths.remove_new()
        self.chains.remove_new()
        failed = self.sysctls.restore()
        if failed:
            problems.append(f"sysctls not restored: {', '.join(failed)}")
        if remove_workdir:
            unmount_under(self.workdir)
            shutil.rmtree(self.workdir, ignore_errors=True)
        return problems


def recover(path: Path = RECORD_FILE) -> list[str]:
    """Puts the host back after a node whose process died without its stop (the caller
    holds the lock, so that node is gone); what could not be put back. No record: nothing."""
    if not path.exists():
        return []
    problems = HostRecord.load(path).put_back(set(), remove_workdir=True)
    path.unlink()
    return problems
