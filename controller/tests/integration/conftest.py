"""Fixtures of the binder tests (see binder_env.py)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import Replica, serving
from binder_env import GRACE_S, Corner, Env
from real_node_env import build_controller_image, start_plane

from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit import cluster, tenants
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit import node as node_kit
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds

_KUBEVIRT_WEBHOOKS: list[contextlib.ExitStack] = []


@pytest.fixture(scope="session")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


@pytest.fixture
def tenant_admin(kube: Kube, namespace: str) -> Kube:
    """The API as the tenant admin of the test's ``namespace`` (the built-in ``admin`` role
    there, the chart's claim roles and KubeVirt's VM rights aggregated into it), for the
    step of a test that is a tenant's attack; the rest is the hoster's, or stands in for
    KubeVirt's and the binder's writes."""
    return tenants.as_tenant_admin(kube.api, f"admin-{namespace}", [namespace])


@pytest.fixture
def corner(kube: Kube) -> Iterator[Corner]:
    """This test's namespaces, nodes and classes, deleted after it; no binder."""
    made = Corner.make(kube)
    try:
        yield made
    finally:
        made.clean_up()


@pytest.fixture
def env(api_client: Any, kube: Kube) -> Iterator[Env]:
    made = Corner.make(kube)
    config = binder_config(made.controller_ns, attachment_grace=GRACE_S)
    binder = Binder(api_client, config)
    binder.start()
    assert binder.synced.wait(30), "the binder did not finish its first listing"
    env = Env(kube, made.id, made.tenant, made.controller_ns, binder)
    try:
        yield env
    finally:
        env.binder.stop()
        env.clean_up()
    # A binder loop that died would make every wait above time out for no visible reason.
    assert env.binder.failure is None, f"the binder loop failed: {env.binder.failure}"


@pytest.fixture(scope="session")
def kubevirt_webhooks(
    kubevirt: kubevirt_kit.VirtController,
    kube: Kube,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replica]:
    """The product's webhooks in front of KubeVirt's virt-controller: one replica (that
    does not lead: each test's own binder does) with the chart's configurations, from the
    first test on virt-controller to the last. Those tests run first, together (see the
    ``kubevirt`` fixture), and the configurations go with virt-controller
    (``pytest_runtest_teardown``): the tests after them write VMIs and pods by hand, as no
    webhook would leave them."""
    with contextlib.ExitStack() as stack:
        replica = stack.enter_context(
            serving(kubevirt.plane, kube, tmp_path_factory.mktemp("kubevirt-webhooks"))
        )
        _KUBEVIRT_WEBHOOKS.append(stack)
        yield replica


def _uses_kubevirt(item: pytest.Item | None) -> bool:
    return item is not None and "kubevirt" in getattr(item, "fixturenames", ())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        # With no next test, the fixture's own teardown has removed them already, before
        # the control plane stopped.
        if _KUBEVIRT_WEBHOOKS and _uses_kubevirt(item) and not _uses_kubevirt(nextitem):
            _KUBEVIRT_WEBHOOKS.pop().close()


@pytest.fixture
def vms(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, env: Env
) -> Iterator[Env]:
    """This test's corner on KubeVirt's virt-controller, with the product's webhooks in
    front of it and this test's binder leading: VirtualMachines it creates become VMIs and
    gated launcher pods as in a cluster. Its VMs are deleted after it, the kit playing
    virt-handler and kubelet until their VMIs are gone (``kubevirt.removes_vms``), before
    its namespaces go."""
    yield env
    kubevirt_kit.removes_vms(env.kube, env.tenant)


@pytest.fixture(scope="session")
def node_plane() -> Iterator[cluster.ControlPlane]:
    """The real node's own control plane (``real_node_env``)."""
    plane = start_plane()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def real_node(node_plane: cluster.ControlPlane) -> Iterator[node_kit.RealNode]:
    """The session's one real node: started by the first test that asks, stopped with the
    session (its host state put back)."""
    started = time.monotonic()
    with node_kit.running(node_plane) as made:
        print(f"[real node] {made.name} Ready in {time.monotonic() - started:.1f} s")
        yield made


@pytest.fixture(scope="session")
def controller_image(real_node: node_kit.RealNode, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The controller image of this tree, in the real node's containerd."""
    return build_controller_image(real_node, tmp_path_factory.mktemp("controller-image"))
