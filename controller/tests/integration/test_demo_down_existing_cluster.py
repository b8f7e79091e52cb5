"""`make demo-down` after `make demo CLUSTER=existing`: what the demo made in a cluster it did
not start goes, kind by kind and each waited for, and what cannot go is named with the command
that removes it by hand. On a plane of its own (with kube-controller-manager, whose namespace
controller empties a deleted namespace), as the demo's names are the story's and other tests
use the same ones on the shared plane."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, tenants
from cozystack_gpu_testkit.demo import platform
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

pytestmark = pytest.mark.apiserver


@pytest.fixture(scope="module")
def foreign(tmp_path_factory: pytest.TempPathFactory) -> Iterator[cluster.ControlPlane]:
    """A cluster the demo did not start: our CRDs, a namespace controller, nothing else."""
    plane = cluster.start(
        tmp_path_factory.mktemp("foreign"),
        controller_manager=True,
        crds=sorted(cluster.CRD_DIR.glob("*.yaml")),
    )
    try:
        yield plane
    finally:
        plane.stop()


def _what_the_demo_made(api: client.ApiClient) -> None:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    for namespace in (*platform.FOREIGN_NAMESPACES, platform.NAMESPACE):
        unless(409, lambda n=namespace: core.create_namespace({"metadata": {"name": n}}))
    # KubeVirt's VM rights stood in for (the cluster has no KubeVirt), as the demo does.
    stand_in = {"metadata": {"name": tenants.KUBEVIRT_ADMIN_STAND_IN}, "rules": []}
    unless(409, lambda: rbac.create_cluster_role(stand_in))
    for name in platform.FOREIGN_CLASSES:
        Kube(api).gpu_class(name, f"nvidia.com/{name}", model=name)
    secret = {"metadata": {"name": platform.FOREIGN_SECRET}, "stringData": {"t": "stand-in"}}
    core.create_namespaced_secret(platform.NAMESPACE, secret)
    for name in platform.FOREIGN_NODES:
        core.create_node({"metadata": {"name": name}})


def _left(api: client.ApiClient) -> list[str]:
    """The demo's objects still in the cluster, by kind and name."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    custom = client.CustomObjectsApi(api)
    names, secret = platform.FOREIGN_NAMESPACES, platform.FOREIGN_SECRET
    reads = [
        *((f"namespace {n}", lambda n=n: core.read_namespace(n)) for n in names),
        *(
            (f"gpuclass {n}", lambda n=n: custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, n))
            for n in platform.FOREIGN_CLASSES
        ),
        *((f"node {n}", lambda n=n: core.read_node(n)) for n in platform.FOREIGN_NODES),
        ("secret", lambda: core.read_namespaced_secret(secret, platform.NAMESPACE)),
        ("clusterrole", lambda: rbac.read_cluster_role(tenants.KUBEVIRT_ADMIN_STAND_IN)),
    ]  # fmt: skip
    return [what for what, read in reads if unless(404, read) is not None]


def _foreign_state(directory: Path, plane: cluster.ControlPlane) -> platform.State:
    directory.mkdir(parents=True, exist_ok=True)
    state = platform.State(
        dir=str(directory),
        kubeconfig=str(plane.kubeconfig),
        bin_dir=str(cluster.binary_dir()),
        own_plane=False,
    )
    state.save()
    return state


def test_demo_down_removes_what_the_demo_made_in_a_cluster_it_did_not_start(
    foreign: cluster.ControlPlane, tmp_path: Path
) -> None:
    api = platform.admin_client(str(foreign.kubeconfig))
    _what_the_demo_made(api)
    state = _foreign_state(tmp_path / "demo", foreign)
    # One of the demo's processes (the controller, in a demo): it outlives the removals.
    process = subprocess.Popen(["sleep", "600"])
    state.processes["pod/cozystack-gpu-controller-0"] = process.pid
    state.save()
    said: list[str] = []

    assert platform.down(tmp_path / "demo", say=said.append) == 0, said

    assert _left(api) == [], said
    assert process.wait(timeout=10) is not None
    assert not state.path.exists()
    removed = [line for line in said if line.startswith("# removed: ")]
    assert (
        removed[0] == f"# removed: kubectl delete namespace {' '.join(platform.FOREIGN_NAMESPACES)}"
    )
    assert len(removed) == 6, said
    assert said[-1].startswith("# demo stopped: its processes, and what it made in the cluster")


def test_demo_down_names_what_it_could_not_remove_and_the_command_that_does(
    foreign: cluster.ControlPlane, tmp_path: Path
) -> None:
    api = platform.admin_client(str(foreign.kubeconfig))
    _what_the_demo_made(api)
    core = client.CoreV1Api(api)
    # Something in a tenant namespace that nothing will release: the namespace cannot go.
    stuck = {"metadata": {"name": "held", "finalizers": ["example.com/held"]}}
    core.create_namespaced_config_map(platform.FOREIGN_NAMESPACES[0], stuck)
    state = _foreign_state(tmp_path / "demo", foreign)
    try:
        left = platform.remove_foreign(state, say=lambda _line: None, timeout=3)
        # Only the namespaces' command is left, named as a person would run it, with
        # kubectl's own words for why (it timed out waiting for tenant-root to go).
        (only,) = left
        command = f"kubectl delete namespace {' '.join(platform.FOREIGN_NAMESPACES)}  # "
        assert only.startswith(command) and "tenant-root" in only[len(command) :], left
        # The rest goes all the same (the other namespaces once their controller is done).
        only_stuck = [f"namespace {platform.FOREIGN_NAMESPACES[0]}"]
        wait_for(lambda: _left(api) == only_stuck, 60, f"only {only_stuck} left")
    finally:
        core.patch_namespaced_config_map(
            "held", platform.FOREIGN_NAMESPACES[0], {"metadata": {"finalizers": None}}
        )
