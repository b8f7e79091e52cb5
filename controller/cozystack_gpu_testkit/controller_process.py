"""The controller as its own process (`python -m cozystack_gpu`) against the test kit's
control plane: what a pod would run, with ports picked free and the log in a file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.ports import free_port


class ControllerProcess:
    """One replica; ``metrics``, ``health`` and ``ready`` fetch its HTTP endpoints.

    ``kubeconfig`` replaces the plane's (e.g. one whose server is a ``proxy.Proxy``).
    ``restart`` starts the same replica again, on the same ports, logging after its
    earlier runs.
    """

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        identity: str,
        log_dir: Path,
        *extra: str,
        metrics: bool = False,
        kubeconfig: Path | None = None,
    ) -> None:
        self.identity = identity
        self.log = log_dir / f"{identity}.log"
        self.health_port = free_port()
        self.ready_port = free_port()
        self.metrics_port = free_port() if metrics else 0
        config = str(kubeconfig or plane.kubeconfig)
        self._args = [
            sys.executable, "-m", "cozystack_gpu",
            "--kubeconfig", config,
            "--namespace", namespace,
            "--identity", identity,
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--ready-port", str(self.ready_port),
            "--log-format", "text",
            *extra,
        ]  # fmt: skip
        self._env = {**os.environ, "KUBECONFIG": config}
        self.proc = self._spawn("wb")

    def _spawn(self, mode: str) -> subprocess.Popen[bytes]:
        with self.log.open(mode) as out:
            return subprocess.Popen(self._args, stdout=out, stderr=subprocess.STDOUT, env=self._env)

    def restart(self) -> None:
        """Start again after ``kill`` or ``stop`` (no-op while it runs)."""
        if self.proc.poll() is None:
            return
        self.proc = self._spawn("ab")

    def health(self, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status, body) of /healthz; (0, reason) when nothing answers."""
        try:
            return self.get(self.health_port, "/healthz", timeout)
        except OSError as exc:
            return 0, str(exc)

    def ready(self, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status, body) of /readyz, kubelet's readiness probe; (0, reason) when
        nothing answers."""
        try:
            return self.get(self.ready_port, "/readyz", timeout)
        except OSError as exc:
            return 0, str(exc)

    def rss_bytes(self) -> int:
        """The process's resident memory now (0 once it has ended)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def get(self, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status, body) of a GET on one of the replica's ports."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def metrics(self) -> str:
        status, body = self.get(self.metrics_port, "/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        return body

    def log_tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()
