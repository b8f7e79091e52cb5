"""The agent loop: read, compare, write; plus its health endpoints.

Every ``poll`` seconds the agent reads sysfs and kubelet and builds the status it owns; it
writes when that differs from what it last wrote (a change on the node) and otherwise every
``period`` seconds, so ``updatedAt`` tells the binder the agent is alive. A full read of a
large node takes milliseconds (see BENCHMARKS.md), so polling is cheaper than watching
sysfs, which has no reliable change notification for these attributes.

While kubelet does not answer, nothing is written: a zero allocatable count would read as
every GPU unhealthy, and a stale ``updatedAt`` says more honestly that nobody knows.

No part of the agent stops silently: a refresh loop that died or hangs fails /healthz
(503, with the reason in the body), and a health server that stopped ends the refresh loop
too, so the process exits and kubelet restarts it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import PodResourcesUnavailable, Snapshot
from cozystack_gpu.agent.report import NodeReport, PhaseOf, build_report
from cozystack_gpu.objects.translate import rfc3339

log = logging.getLogger(__name__)


class Kubelet(Protocol):
    reconnects: int

    def snapshot(self) -> Snapshot: ...


class Writer(Protocol):
    node_name: str

    def patch_status(self, fields: dict[str, Any]) -> dict[str, Any]: ...


class Phases(Protocol):
    def refresh(self) -> None: ...

    def phase_of(self, namespace: str, name: str) -> str | None: ...


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        ns = "cozystack_gpu_agent"
        r = self.registry
        self.refreshes = Counter(
            f"{ns}_refreshes", "Refresh passes by result", ["result"], registry=r
        )
        self.refresh_seconds = Histogram(
            f"{ns}_refresh_seconds",
            "Time to read sysfs and kubelet and build the status",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.devices = Gauge(f"{ns}_devices", "GPU functions found in sysfs", registry=r)
        self.device_errors = Gauge(
            f"{ns}_device_errors", "GPU functions with unreadable sysfs attributes", registry=r
        )
        self.allocatable = Gauge(
            f"{ns}_allocatable",
            "Allocatable device-plugin devices per resource name",
            ["resource_name"],
            registry=r,
        )
        self.unresolved = Gauge(
            f"{ns}_unresolved_device_ids",
            "Device IDs kubelet lists that resolve to no GPU function, per resource name",
            ["resource_name"],
            registry=r,
        )
        self.kubelet_up = Gauge(f"{ns}_kubelet_up", "Whether kubelet answered", registry=r)
        self.kubelet_reconnects = Gauge(
            f"{ns}_kubelet_reconnects", "Fresh channels to kubelet after the first", registry=r
        )
        self.last_write = Gauge(
            f"{ns}_last_write_timestamp_seconds",
            "When the GPUNode status was last written",
            registry=r,
        )

    def observe(self, report: NodeReport) -> None:
        self.devices.set(len(report.devices))
        self.device_errors.set(sum(1 for d in report.devices if d.get("error")))
        per_name: dict[str, int] = {}
        for d in report.devices:
            if d.get("resourceName"):
                name = d["resourceName"]
                per_name[name] = per_name.get(name, 0) + int(d["allocatable"])
        self.allocatable.clear()
        for name, count in per_name.items():
            self.allocatable.labels(resource_name=name).set(count)
        self.unresolved.clear()
        for name, ids in report.unresolved.items():
            self.unresolved.labels(resource_name=name).set(len(ids))


@dataclass
class TickResult:
    written: bool
    report: NodeReport | None
    reason: str


class Agent:
    def __init__(
        self,
        *,
        sysfs_root: str,
        kubelet: Kubelet,
        writer: Writer,
        phases: Phases | None = None,
        pci_ids_paths: list[str] | None = None,
        period: float = 60.0,
        poll: float = 5.0,
        version: str = "",
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sysfs_root = sysfs_root
        self.kubelet = kubelet
        self.writer = writer
        self.phases = phases
        self.pci_ids_paths = pci_ids_paths
        self.period = period
        self.poll = poll
        self.version = version
        self.metrics = metrics or Metrics()
        self.clock = clock
        self._last_status: dict[str, Any] | None = None
        self._last_write: float | None = None
        self.last_tick: float | None = None
        # Why the agent stopped working (None while it works), and the threads it needs.
        self.failure: str | None = None
        self._loop: threading.Thread | None = None
        self._needed: list[threading.Thread] = []

    def _phase_of(self, snapshot: Snapshot) -> PhaseOf:
        if self.phases is None or not snapshot.pods:
            return lambda _ns, _name: None
        try:
            self.phases.refresh()
        except Exception as exc:  # the API server may be briefly away; keep every pod
            log.warning("cannot read pod phases: %s", exc)
            return lambda _ns, _name: None
        return self.phases.phase_of

    def build(self) -> NodeReport:
        """Read sysfs and kubelet and build the status; raises PodResourcesUnavailable."""
        inventory = sysfs.read_inventory(self.sysfs_root, self.pci_ids_paths)
        for error in inventory.errors:
            log.warning("sysfs: %s", error)
        snapshot = self.kubelet.snapshot()
        return build_report(
            inventory, snapshot.allocatable, snapshot.pods, self._phase_of(snapshot)
        )

    def tick(self, force: bool = False) -> TickResult:
        started = self.clock()
        self.last_tick = started
        try:
            with self.metrics.refresh_seconds.time():
                report = self.build()
        except PodResourcesUnavailable as exc:
            self.metrics.kubelet_up.set(0)
            self.metrics.kubelet_reconnects.set(self.kubelet.reconnects)
            self.metrics.refreshes.labels(result="kubelet_unavailable").inc()
            log.warning("kubelet pod-resources unavailable: %s", exc)
            return TickResult(False, None, "kubelet unavailable")
        self.metrics.kubelet_up.set(1)
        self.metrics.kubelet_reconnects.set(self.kubelet.reconnects)
        self.metrics.observe(report)
        status = report.status()
        due = self._last_write is None or started - self._last_write >= self.period
        changed = status != self._last_status
        if not force and not due and not changed:
            self.metrics.refreshes.labels(result="unchanged").inc()
            return TickResult(False, report, "unchanged")
        fields = dict(status)
        fields["updatedAt"] = rfc3339(time.time())
        fields["agentVersion"] = self.version
        try:
            self.writer.patch_status(fields)
        except Exception as exc:
            self.metrics.refreshes.labels(result="api_error").inc()
            log.error("cannot write GPUNode %s: %s", self.writer.node_name, exc)
            return TickResult(False, report, f"api error: {exc}")
        self._last_status = status
        self._last_write = started
        self.metrics.last_write.set(time.time())
        self.metrics.refreshes.labels(result="written").inc()
        return TickResult(True, report, "forced" if force else "changed" if changed else "period")

    def needs(self, thread: threading.Thread) -> None:
        """A thread the agent cannot work without: when it ends, the refresh loop ends."""
        self._needed.append(thread)

    def run(self, stop: threading.Event) -> None:
        """Refreshes until ``stop``; returns early, with ``failure`` set, when a needed thread
        ended."""
        self._loop = threading.current_thread()
        try:
            while not stop.is_set():
                ended = [t.name for t in self._needed if not t.is_alive()]
                if ended and not stop.is_set():
                    self.failure = f"thread {', '.join(ended)} ended"
                    log.critical("%s; the agent stops so that it is restarted", self.failure)
                    return
                try:
                    self.tick()
                except Exception:  # one bad pass must not end the agent
                    log.exception("refresh failed")
                    self.metrics.refreshes.labels(result="error").inc()
                stop.wait(self.poll)
        except BaseException as exc:
            self.failure = f"refresh loop died: {type(exc).__name__}: {exc}"
            log.critical("%s", self.failure, exc_info=True)
            raise

    def problem(self) -> str | None:
        """Why the agent is not alive (None when it is): a dead or hung refresh loop."""
        if self.failure is not None:
            return self.failure
        if self._loop is not None and not self._loop.is_alive():
            return "the refresh loop is not running"
        if self.last_tick is None:
            return "no refresh has started yet"
        idle = self.clock() - self.last_tick
        if idle >= 3 * self.poll + 30:
            return f"no refresh started for {idle:.0f} s"
        return None

    def healthy(self) -> bool:
        """The loop is alive: it started a pass recently."""
        return self.problem() is None

    def ready(self) -> bool:
        """The GPUNode was written recently."""
        return self._last_write is not None and self.clock() - self._last_write < 2 * self.period


def serve(agent: Agent, host: str, port: int) -> ThreadingHTTPServer:
    """/healthz and /readyz (kubelet's probes, plain HTTP) on a background thread the agent
    needs. /metrics is not here: it carries the node's inventory, so it is served over
    HTTPS to reviewed tokens only (``cozystack_gpu.metrics_server``, ``--metrics-listen``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                problem = agent.problem()
                if problem is None:
                    self._reply(200, b"ok\n", "text/plain")
                else:
                    self._reply(503, f"not ok: {problem}\n".encode(), "text/plain")
            elif self.path == "/readyz":
                ok = agent.ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ok\n", "text/plain")
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    thread = threading.Thread(target=server.serve_forever, name="agent-http", daemon=True)
    thread.start()
    agent.needs(thread)
    return server
