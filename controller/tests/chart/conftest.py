"""Fixtures of the chart tests: the `helm` built with the control plane's binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from cozystack_gpu_testkit import cluster


@pytest.fixture(scope="session")
def helm() -> Path:
    path = cluster.binary_dir() / "helm"
    assert path.exists(), f"no helm in {path.parent}: run `make binaries`"
    return path
