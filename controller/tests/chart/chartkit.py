"""Helpers of the chart tests: `helm template` of controller/chart into Python objects."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "chart"
VERSIONS = Path(__file__).resolve().parents[3] / "tools" / "versions.env"
RELEASE = "cozystack-gpu"
NAMESPACE = "cozy-gpu"


def kube_version() -> str:
    """The Kubernetes version the control plane is built at (the chart requires >= 1.32)."""
    for line in VERSIONS.read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip().strip('"')
    raise AssertionError(f"no KUBERNETES_VERSION in {VERSIONS}")


def helm_template(
    helm: Path,
    values: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with ``values`` (on stdin) over its defaults;
    ``api_versions``: what the API server serves beyond helm's defaults."""
    return subprocess.run(
        [
            str(helm),
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            kube_version(),
            *(f"--api-versions={v}" for v in api_versions),
            "--values",
            "-",
        ],
        input=yaml.safe_dump(values or {}),
        capture_output=True,
        text=True,
        check=False,
    )


def render(
    helm: Path,
    values: dict[str, Any] | None = None,
    namespace: str = NAMESPACE,
    api_versions: tuple[str, ...] = (),
) -> list[Any]:
    """The rendered objects; fails with helm's message when the chart does not render."""
    result = helm_template(helm, values, namespace, api_versions)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} rendered"
    return matches[0]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]
