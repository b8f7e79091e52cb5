"""The controller as its own process (`python -m cozystack_gpu`) against the test kit's
control plane: what a pod would run, with ports picked free and the log in a file.

/metrics is HTTPS with the replica's serving certificate (``--webhook-cert-dir``): one the
caller names, or one issued here for 127.0.0.1 by a throw-away CA."""

from __future__ import annotations

import compileall
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path

from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.metrics_scrape import scrape
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port


@cache
def compile_package() -> None:
    """Compile the controller's modules once, as the image's install does. A checkout
    installed in editable mode on a machine with PYTHONDONTWRITEBYTECODE (this one) caches
    none, so every replica started here compiled its ~80 modules again: 0.07 s of its CPU
    before its first bind that no pod spends (BENCHMARKS.md, the start)."""
    import cozystack_gpu  # pylint: disable=import-outside-toplevel

    compileall.compile_dir(Path(cozystack_gpu.__file__).parent, quiet=1)


class ControllerProcess:
    """One replica; ``metrics`` (HTTPS, with a reader's token), ``health`` and ``ready``
    fetch its endpoints.

    ``kubeconfig`` replaces the plane's (e.g. one whose server is a ``proxy.Proxy``); it is
    passed as ``--kubeconfig`` and, unless ``kubeconfig_in_env`` is False, also as
    ``KUBECONFIG``.
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
        kubeconfig_in_env: bool = True,
    ) -> None:
        self.identity = identity
        self.log = log_dir / f"{identity}.log"
        self.health_port = free_port()
        self.ready_port = free_port()
        self.metrics_port = free_port() if metrics else 0
        config = str(kubeconfig or plane.kubeconfig)
        if "--webhook-cert-dir" in extra:
            self.cert_dir = Path(extra[list(extra).index("--webhook-cert-dir") + 1])
        else:
            self.cert_dir = log_dir / f"{identity}-certs"
            if metrics:
                _serving_certificate(self.cert_dir)
                # The key pair is for /metrics: no webhook server on the default port
                # (before, one waited for a key pair that never came).
                webhook = () if "--webhook-port" in extra else ("--webhook-port", "0")
                extra = ("--webhook-cert-dir", str(self.cert_dir), *webhook, *extra)
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
        compile_package()
        self._env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        if kubeconfig_in_env:
            self._env["KUBECONFIG"] = config
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
        return rss_bytes(self.proc.pid)

    def get(self, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(HTTP status, body) of a GET on one of the replica's ports."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    @property
    def metrics_ca(self) -> bytes:
        """The CA that signed the serving certificate (``ca.crt`` beside it)."""
        return (self.cert_dir / "ca.crt").read_bytes()

    def scrape(self, token: str | None) -> tuple[int, str]:
        """(HTTP status, body) of /metrics over HTTPS with ``token`` (None: no token)."""
        return scrape(self.metrics_port, token, self.metrics_ca)

    def metrics(self, token: str) -> str:
        status, body = self.scrape(token)
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}: {body}")
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


def _serving_certificate(cert_dir: Path) -> None:
    """A key pair for 127.0.0.1 in a cert-manager Secret's layout."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority()
    pair = ca.issue("cozystack-gpu-webhook", ip_addresses=("127.0.0.1",), server=True)
    pair.write(cert_dir / "tls.crt", cert_dir / "tls.key")
    (cert_dir / "ca.crt").write_bytes(ca.cert_pem)


def rss_bytes(pid: int) -> int:
    """Resident memory of a process from /proc/<pid>/status (0 once it has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
