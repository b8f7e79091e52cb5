"""Shared fixtures. The control plane is real: etcd + kube-apiserver built from source.

It starts lazily, once per session, the first time a test asks for `control_plane` (unit
tests never pay for it), and it dies with the test process even on SIGKILL.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet

_STARTED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say in the run's output which API server the integration tests ran against."""
    for line in _STARTED:
        terminalreporter.write_line(f"[control plane] {line}")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[cluster.ControlPlane]:
    plane = cluster.start()
    try:
        cluster.install_crds(plane.api_client())
        _STARTED.append(f"real kube-apiserver {plane.version()} at {plane.server}")
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def api_client(control_plane: cluster.ControlPlane) -> Any:
    """A kubernetes.client.ApiClient with the admin identity."""
    return control_plane.api_client()


@pytest.fixture
def namespace(api_client: Any) -> str:
    """A fresh namespace per test (namespaces never finish deleting without a controller)."""
    from kubernetes import client

    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api_client).create_namespace({"metadata": {"name": name}})
    return name


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    """A fake kubelet serving the real pod-resources API on a unix socket."""
    # A short path: unix socket paths are limited to about 100 bytes.
    fake = FakeKubelet(str(tmp_path / "kubelet.sock"))
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for cluster-scoped object names."""
    return uuid.uuid4().hex[:8]
