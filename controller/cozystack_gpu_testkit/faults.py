"""Faults injected into the test kit's real control plane: components stopped, killed and
started again exactly as they ran.

A component is restarted with the command line the kernel holds for it
(``/proc/<pid>/cmdline``), so it comes back on the same port and the same etcd data, and it
still dies with the test process. The fault suite and the failure tests of the binder use
these; nothing here mocks the API.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cozystack_gpu_testkit import cluster

APISERVER = "kube-apiserver"
ETCD = "etcd"


@dataclass(frozen=True)
class Outage:
    """How long one component was away: ``down_s`` from the stop until it was started
    again, ``ready_s`` from then until the API server answered /readyz again."""

    component: str
    down_s: float
    ready_s: float


def command_line(pid: int) -> list[str]:
    """The arguments a running process was started with."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [part.decode() for part in raw.split(b"\0") if part]


def stop(plane: cluster.ControlPlane, name: str, sig: signal.Signals = signal.SIGKILL) -> list[str]:
    """Stops one component (SIGKILL: a crash; SIGTERM: a clean shutdown) and returns its
    command line for ``start``."""
    pid = plane.pids.get(name)
    if pid is None or not plane.running(name):
        raise cluster.ControlPlaneError(f"{name} is not running")
    args = command_line(pid)
    proc = plane._procs.get(name)
    if sig is signal.SIGKILL:
        os.kill(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait()
        deadline = time.monotonic() + 10
        while plane.running(name) and time.monotonic() < deadline:
            time.sleep(0.01)
    else:
        cluster.terminate(pid, proc, 30.0)
    return args


def start(plane: cluster.ControlPlane, name: str, args: list[str]) -> None:
    """Starts a component again with ``args``, logging after its earlier runs; like every
    component of the kit it dies with the test process, even on SIGKILL."""
    with (plane.workdir / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=cluster._die_with_parent,
        )
    plane.pids[name] = proc.pid
    plane._procs[name] = proc


@contextmanager
def stopped(
    plane: cluster.ControlPlane,
    name: str = APISERVER,
    sig: signal.Signals = signal.SIGKILL,
    outages: list[Outage] | None = None,
) -> Iterator[None]:
    """Holds one component down for the body of the ``with``, then starts it as it ran and
    waits until the API server is ready; appends the figures to ``outages`` if given."""
    args = stop(plane, name, sig)
    stopped_at = time.monotonic()
    try:
        yield
    finally:
        started_at = time.monotonic()
        start(plane, name, args)
        plane.wait_ready()
        if outages is not None:
            outages.append(Outage(name, started_at - stopped_at, time.monotonic() - started_at))


def restart(
    plane: cluster.ControlPlane,
    name: str = APISERVER,
    down_s: float = 5.0,
    sig: signal.Signals = signal.SIGKILL,
) -> Outage:
    """Stops a component, keeps it down ``down_s`` seconds, and starts it again."""
    outages: list[Outage] = []
    with stopped(plane, name, sig, outages):
        time.sleep(down_s)
    return outages[0]


# --- etcd: revisions and compaction ----------------------------------------------------


def etcd_url(plane: cluster.ControlPlane) -> str:
    """The client URL etcd listens on (from its command line)."""
    for arg in command_line(plane.pids[ETCD]):
        if arg.startswith("--listen-client-urls="):
            return arg.split("=", 1)[1].split(",")[0]
    raise cluster.ControlPlaneError("etcd runs without --listen-client-urls")


def _etcd(plane: cluster.ControlPlane, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call of etcd's v3 JSON gateway."""
    request = urllib.request.Request(
        etcd_url(plane) + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def etcd_revision(plane: cluster.ControlPlane) -> int:
    """etcd's current revision: every write to any key raises it."""
    answer = _etcd(plane, "/v3/kv/range", {"key": base64.b64encode(b"/").decode()})
    return int(answer["header"]["revision"])


def compact(plane: cluster.ControlPlane, revision: int | None = None) -> int:
    """Compacts etcd's history up to ``revision`` (default: the current one) and returns
    it: a watch from an older resourceVersion then fails with 410 Gone, as after the API
    server's own periodic compaction."""
    revision = etcd_revision(plane) if revision is None else revision
    try:
        _etcd(plane, "/v3/kv/compaction", {"revision": str(revision), "physical": True})
    except urllib.error.HTTPError as exc:
        # Compacted already (by the API server, or a look before this one): that is fine.
        if b"compacted" not in exc.read():
            raise
    return revision
