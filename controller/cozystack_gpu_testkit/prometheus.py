"""A real Prometheus (built by tools/build-binaries.sh) as a process on loopback: it scrapes
the targets a test names, evaluates the rule files it is given, and answers PromQL over its
HTTP API (``/api/v1/query``, ``/api/v1/alerts``)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit.ports import free_port


@dataclass(frozen=True)
class Target:
    """One scrape target: a job name, ``host:port``, and the labels Prometheus adds to its
    series (what Prometheus Operator's relabelling would add in a cluster, e.g. ``pod``)."""

    job: str
    address: str
    labels: Mapping[str, str]
    # HTTPS as the chart's ServiceMonitor scrapes: a bearer token from a file, the serving
    # certificate checked against ``ca_file`` (one job's targets share these).
    scheme: str = "http"
    token_file: Path | None = None
    ca_file: Path | None = None
    # A self-signed serving certificate (the node agent's), not verified.
    insecure: bool = False


class PrometheusError(Exception):
    pass


class PrometheusProcess:
    """Started on construction, with scrape and rule evaluation every ``interval``."""

    def __init__(
        self,
        binary: Path,
        work_dir: Path,
        targets: Sequence[Target],
        rule_files: Sequence[Path] = (),
        interval: str = "1s",
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        work_dir.mkdir(parents=True, exist_ok=True)
        self.log = work_dir / "prometheus.log"
        jobs: dict[str, list[dict[str, Any]]] = {}
        scrape: dict[str, dict[str, Any]] = {}
        for target in targets:
            jobs.setdefault(target.job, []).append(
                {"targets": [target.address], "labels": dict(target.labels)}
            )
            job = scrape.setdefault(target.job, {"scheme": target.scheme})
            if target.token_file is not None:
                job["authorization"] = {
                    "type": "Bearer",
                    "credentials_file": str(target.token_file),
                }
            if target.ca_file is not None:
                job["tls_config"] = {"ca_file": str(target.ca_file)}
            if target.insecure:
                job["tls_config"] = {"insecure_skip_verify": True}
        config = {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {"job_name": job, "static_configs": static, **scrape[job]}
                for job, static in jobs.items()
            ],
        }
        config_file = work_dir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        args = [
            str(binary),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self._wait_ready(30.0)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise PrometheusError(f"prometheus exited {self.proc.returncode}: {self.tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise PrometheusError(f"prometheus not ready within {timeout} s: {self.tail()}")

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        try:
            with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as exc:
            raise PrometheusError(f"{path} {params}: {exc.code} {exc.read().decode()}") from exc
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: ``[{"metric": {...}, "value": [t, "v"]}, ...]``."""
        data = self._api("/api/v1/query", {"query": expr})
        if data["resultType"] != "vector":
            raise PrometheusError(f"{expr}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), each with ``labels`` and ``state``."""
        alerts: list[dict[str, Any]] = self._api("/api/v1/alerts")["alerts"]
        return alerts

    def targets_up(self) -> dict[str, str]:
        """Each active target's scrape URL and its health (up, down, unknown)."""
        data = self._api("/api/v1/targets")
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
