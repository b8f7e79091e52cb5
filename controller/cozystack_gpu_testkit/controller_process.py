"""The controller as its own process (`python -m cozystack_gpu`) against the test kit's
control plane: what a pod would run, with ports picked free and the log in a file."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from cozystack_gpu_testkit.cluster import ControlPlane


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ControllerProcess:
    """One replica; ``metrics`` and ``health`` fetch its HTTP endpoints."""

    def __init__(
        self,
        plane: ControlPlane,
        namespace: str,
        identity: str,
        log_dir: Path,
        *extra: str,
        metrics: bool = False,
    ) -> None:
        self.identity = identity
        self.log = log_dir / f"{identity}.log"
        self.health_port = free_port()
        self.metrics_port = free_port() if metrics else 0
        args = [
            sys.executable, "-m", "cozystack_gpu",
            "--kubeconfig", str(plane.kubeconfig),
            "--namespace", namespace,
            "--identity", identity,
            "--metrics-port", str(self.metrics_port),
            "--health-port", str(self.health_port),
            "--log-format", "text",
            *extra,
        ]  # fmt: skip
        env = {**os.environ, "KUBECONFIG": str(plane.kubeconfig)}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)

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
