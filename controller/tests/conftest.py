"""Shared fixtures. The control plane is real: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager (garbage collector, namespace and service-account controllers),
built from source.

It starts lazily, once per session, the first time a test asks for `control_plane` (unit
tests never pay for it), and it dies with the test process even on SIGKILL. The scheduler
and the controller-manager run for the whole session, as in a cluster: pods are admitted
with the ServiceAccount plugin on, owned objects are garbage-collected, deleted namespaces
go away. Tests that rely on them ask for `full_control_plane`, which says so.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet

_STARTED: list[str] = []


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Say in the run's output which API server the integration tests ran against."""
    for line in _STARTED:
        terminalreporter.write_line(f"[control plane] {line}")


@pytest.fixture(scope="session")
def control_plane(request: pytest.FixtureRequest) -> Iterator[cluster.ControlPlane]:
    # Imported here: objects imports the product's modules, which unit tests import alone.
    from cozystack_gpu_testkit.objects import WORKLOAD_CRD

    bin_dir = cluster.binary_dir()
    # Every CRD before the controller-manager, so its garbage collector knows every kind
    # (VMIs owning claims, claims owning usage records) from its first moment.
    crds = [*sorted(cluster.CRD_DIR.glob("*.yaml")), WORKLOAD_CRD, cluster.kubevirt_crds(bin_dir)]
    plane = cluster.start(bin_dir=bin_dir, scheduler=True, controller_manager=True, crds=crds)
    try:
        _STARTED.append(
            f"real kube-apiserver {plane.version()} at {plane.server}, with kube-scheduler "
            f"and kube-controller-manager ({', '.join(cluster.CONTROLLERS)})"
        )
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def full_control_plane(control_plane: cluster.ControlPlane) -> cluster.ControlPlane:
    """The session's plane with its kube-scheduler and kube-controller-manager running
    (started here should the session plane ever run without them)."""
    control_plane.start_scheduler()
    control_plane.start_controller_manager()
    return control_plane


_VIRT_CONTROLLER: list[kubevirt_kit.VirtController] = []
# Fixtures of the machine's one real node and of podman: their tests run in the own_plane lane.
OWN_PLANE_FIXTURES = frozenset({"node_plane", "real_node", "controller_image", "podman"})


def _uses_kubevirt(item: pytest.Item | None) -> bool:
    return item is not None and "kubevirt" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests on KubeVirt's virt-controller run first, together: it acts on every VMI of the
    cluster (it would render launcher pods for the VMIs other tests write by hand, or fail
    them for lacking one), and virt-api's webhooks would default and judge those VMIs, so
    both run before any of those exist and stop after the last test that uses them
    (``pytest_runtest_teardown``).

    A test on the real node or podman must be marked ``own_plane``: make test runs those in
    a pytest of their own beside the rest (tools/pytest-lanes.sh), and there is one real
    node a machine."""
    items.sort(key=lambda item: not _uses_kubevirt(item))
    unmarked = [
        item.nodeid
        for item in items
        if OWN_PLANE_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("own_plane") is None
    ]
    if unmarked:
        fixtures = ", ".join(sorted(OWN_PLANE_FIXTURES))
        raise pytest.UsageError(
            f"{', '.join(unmarked)} use the real node or podman ({fixtures}) but are not "
            "marked own_plane: add pytest.mark.own_plane to their pytestmark"
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        if _VIRT_CONTROLLER and _uses_kubevirt(item) and not _uses_kubevirt(nextitem):
            _VIRT_CONTROLLER.pop().stop()


@pytest.fixture(scope="session")
def kubevirt(full_control_plane: cluster.ControlPlane) -> kubevirt_kit.VirtController:
    """KubeVirt's own virt-api (its webhooks registered) and virt-controller on the
    session's plane (with what virt-operator would install for them), started once, the
    first time a test asks, and stopped after the last (these tests run first), virt-api's
    webhooks removed: VirtualMachines pass virt-api's webhooks and become VMIs and launcher
    pods as in a cluster. Tests that write their own VMIs and pods never pay for it nor
    meet it."""
    controller = kubevirt_kit.start(full_control_plane)
    _VIRT_CONTROLLER.append(controller)
    _STARTED.append(
        f"KubeVirt's virt-api as {kubevirt_kit.API_USER} with its webhooks and "
        f"virt-controller as {kubevirt_kit.USER} (launcher image "
        f"{kubevirt_kit.LAUNCHER_IMAGE}), for the tests that ask for it, run first"
    )
    return controller


@pytest.fixture(scope="session")
def api_client(control_plane: cluster.ControlPlane) -> Any:
    """A kubernetes.client.ApiClient with the admin identity."""
    return control_plane.api_client()


@pytest.fixture
def namespace(api_client: Any) -> str:
    """A fresh namespace per test, ready for pods (its default ServiceAccount exists). It is
    left in place after the test, for a failing test's objects to be looked at."""
    from cozystack_gpu_testkit.objects import Kube

    name = f"t-{uuid.uuid4().hex[:10]}"
    Kube(api_client).namespace(name)
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
