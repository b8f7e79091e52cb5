"""`make demo CLUSTER=existing` and `make demo-down` on a cluster the demo did not start, with
the hoster's kubeconfig (the plane's admin).

Every object the demo makes there carries its run's mark (the label ``demo.cozystack.io/run``,
the helm release too), and down removes only what carries it: kind by kind, each waited for,
naming what cannot go with the command that removes it by hand. An object of one of the demo's
names without the mark (a hoster's own ``tenant-root``, as docs/install.md makes it, its
GPUClass, its release of the chart) is left as it is and named. Before it writes anything the
demo refuses a cluster that has any of its objects already.

On a plane of its own (with kube-controller-manager, whose namespace controller empties a
deleted namespace), as the demo's names are the story's and other tests use the same ones on
the shared plane."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, tenants
from cozystack_gpu_testkit.demo import existing_cluster, platform, run_state, story
from cozystack_gpu_testkit.demo.__main__ import main as demo_main
from cozystack_gpu_testkit.objects import Kube, unless, wait_for
from cozystack_gpu_testkit.webhook_route import route_service

NAMESPACE = run_state.NAMESPACE  # the chart's release namespace

pytestmark = pytest.mark.apiserver

# The demo's mark, and the id of the run these tests play.
MARK = "demo.cozystack.io/run"
RUN = "t41"
# A tenant namespace as docs/install.md has a hoster make it.
HOSTER_TENANT = {"name": "tenant-root", "labels": {"tenant.cozystack.io/tenant-root": ""}}


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


@pytest.fixture(scope="module")
def small_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chart of one ConfigMap: a release of the demo's name without its weight."""
    chart = tmp_path_factory.mktemp("chart")
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: small\nversion: 0.1.0\n")
    (chart / "templates").mkdir()
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: small}\n"
    )
    return chart


@pytest.fixture(autouse=True)
def clean(foreign: cluster.ControlPlane) -> Iterator[None]:
    """Each test starts on a cluster without any of the demo's names, and leaves it so."""
    yield
    kubectl = [str(cluster.binary_dir() / "kubectl"), "--kubeconfig", str(foreign.kubeconfig)]
    gone = ["--ignore-not-found", "--wait", "--timeout", "60s"]
    _helm(foreign, "uninstall", run_state.RELEASE, "--wait")
    for args in (
        ["delete", "namespace", *existing_cluster.FOREIGN_NAMESPACES],
        ["delete", "gpuclasses.gpu.cozystack.io", *existing_cluster.FOREIGN_CLASSES],
        [
            "-n",
            run_state.NAMESPACE,
            "delete",
            "endpointslice",
            existing_cluster.FOREIGN_ENDPOINT_SLICE,
        ],
        [
            "-n",
            run_state.NAMESPACE,
            "delete",
            "serviceaccount",
            existing_cluster.FOREIGN_SERVICE_ACCOUNT,
        ],
        ["-n", run_state.NAMESPACE, "delete", "secret", existing_cluster.FOREIGN_SECRET],
        ["delete", "node", *existing_cluster.FOREIGN_NODES],
        ["delete", "clusterrole", tenants.KUBEVIRT_ADMIN_STAND_IN],
    ):
        subprocess.run([*kubectl, *args, *gone], capture_output=True, check=True)


def _helm(plane: cluster.ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cluster.binary_dir() / "helm"), *args, "-n", run_state.NAMESPACE,
         "--kubeconfig", str(plane.kubeconfig)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip


def _install(plane: cluster.ControlPlane, chart: Path, *labels: str) -> None:
    """The chart ``chart`` as release cozystack-gpu in cozy-gpu, with release ``labels``."""
    args = ["install", run_state.RELEASE, str(chart), "--create-namespace", "--wait"]
    done = _helm(plane, *args, *(["--labels", ",".join(labels)] if labels else []))
    assert done.returncode == 0, done.stderr


def _release(plane: cluster.ControlPlane) -> dict[str, Any] | None:
    """Release cozystack-gpu as helm lists it (revision, status), or None."""
    done = _helm(plane, "list", "-a", "--filter", f"^{run_state.RELEASE}$", "-o", "json")
    assert done.returncode == 0, done.stderr
    found: list[dict[str, Any]] = json.loads(done.stdout)
    return {k: found[0][k] for k in ("revision", "status", "chart")} if found else None


def _what_the_demo_made(api: client.ApiClient, run: str, *, but: Collection[str] = ()) -> None:
    """The demo's objects as a run ``run`` marks them, but those named in ``but`` (as
    :func:`_left` names them)."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    mark = {MARK: run}
    for namespace in existing_cluster.FOREIGN_NAMESPACES:
        if f"namespace {namespace}" not in but:
            core.create_namespace({"metadata": {"name": namespace, "labels": mark}})
    # The chart's namespace is helm's (--create-namespace) and is never removed.
    unless(409, lambda: core.create_namespace({"metadata": {"name": run_state.NAMESPACE}}))
    # KubeVirt's VM rights stood in for (the cluster has no KubeVirt), as the demo does.
    if "clusterrole" not in but:
        stand_in = {"metadata": {"name": tenants.KUBEVIRT_ADMIN_STAND_IN, "labels": mark}}
        rbac.create_cluster_role({**stand_in, "rules": []})
    for name in existing_cluster.FOREIGN_CLASSES:
        if f"gpuclass {name}" not in but:
            Kube(api).gpu_class(name, f"nvidia.com/{name}", model=name)
            _label_class(api, name, mark)
    if "secret" not in but:
        metadata = {"name": existing_cluster.FOREIGN_SECRET, "labels": mark}
        core.create_namespaced_secret(
            run_state.NAMESPACE, {"metadata": metadata, "stringData": {"t": "stand-in"}}
        )
    if "serviceaccount" not in but:
        metadata = {"name": existing_cluster.FOREIGN_SERVICE_ACCOUNT, "labels": mark}
        core.create_namespaced_service_account(run_state.NAMESPACE, {"metadata": metadata})
    if "endpointslice" not in but:  # at a TEST-NET address: the API server refuses loopback
        route_service(api, run_state.NAMESPACE, "cozystack-gpu-webhook", "192.0.2.1", 1,
                      labels=mark)  # fmt: skip
    for name in existing_cluster.FOREIGN_NODES:
        if f"node {name}" not in but:
            core.create_node({"metadata": {"name": name, "labels": mark}})


def _label_class(api: client.ApiClient, name: str, labels: dict[str, str]) -> None:
    client.CustomObjectsApi(api).patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, {"metadata": {"labels": labels}}
    )


def _left(api: client.ApiClient) -> list[str]:
    """The demo's objects still in the cluster, by kind and name."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    custom = client.CustomObjectsApi(api)
    names, secret = existing_cluster.FOREIGN_NAMESPACES, existing_cluster.FOREIGN_SECRET
    reads = [
        *((f"namespace {n}", lambda n=n: core.read_namespace(n)) for n in names),
        *(
            (f"gpuclass {n}", lambda n=n: custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, n))
            for n in existing_cluster.FOREIGN_CLASSES
        ),
        *((f"node {n}", lambda n=n: core.read_node(n)) for n in existing_cluster.FOREIGN_NODES),
        ("secret", lambda: core.read_namespaced_secret(secret, run_state.NAMESPACE)),
        ("serviceaccount", lambda: core.read_namespaced_service_account(
            existing_cluster.FOREIGN_SERVICE_ACCOUNT, run_state.NAMESPACE)),
        ("endpointslice", lambda: client.DiscoveryV1Api(api).read_namespaced_endpoint_slice(
            existing_cluster.FOREIGN_ENDPOINT_SLICE, run_state.NAMESPACE)),
        ("clusterrole", lambda: rbac.read_cluster_role(tenants.KUBEVIRT_ADMIN_STAND_IN)),
    ]  # fmt: skip
    return [what for what, read in reads if unless(404, read) is not None]


def _foreign_state(directory: Path, plane: cluster.ControlPlane, run: str) -> run_state.State:
    directory.mkdir(parents=True, exist_ok=True)
    state = run_state.State(
        dir=str(directory),
        kubeconfig=str(plane.kubeconfig),
        bin_dir=str(cluster.binary_dir()),
        own_plane=False,
    )
    state.run = run
    state.save()
    return state


def _snapshot(api: client.ApiClient, plane: cluster.ControlPlane) -> dict[str, Any]:
    """What a start of the demo could write to, by kind: names and resource versions."""
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    ext, custom = client.ApiextensionsV1Api(api), client.CustomObjectsApi(api)

    def versions(items: list[Any]) -> list[tuple[str, str]]:
        return sorted((o.metadata.name, o.metadata.resource_version) for o in items)

    classes = custom.list_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES)
    return {
        "namespaces": versions(core.list_namespace().items),
        "nodes": versions(core.list_node().items),
        "secrets": versions(core.list_namespaced_secret(run_state.NAMESPACE).items),
        "gpuclasses": sorted(c["metadata"]["name"] for c in classes["items"]),
        # Names only: the aggregation controller rewrites admin, edit and view.
        "clusterroles": sorted(r.metadata.name for r in rbac.list_cluster_role().items),
        "crds": versions(ext.list_custom_resource_definition().items),
        "release": _release(plane),
    }


def test_demo_down_removes_what_the_demo_made_in_a_cluster_it_did_not_start(
    foreign: cluster.ControlPlane, small_chart: Path, tmp_path: Path
) -> None:
    api = run_state.admin_client(str(foreign.kubeconfig))
    _what_the_demo_made(api, RUN)
    _install(foreign, small_chart, f"{MARK}={RUN}")
    state = _foreign_state(tmp_path / "demo", foreign, RUN)
    # One of the demo's processes (the controller, in a demo): it outlives the removals.
    process = subprocess.Popen(["sleep", "600"])
    state.processes["pod/cozystack-gpu-controller-0"] = process.pid
    state.save()
    said: list[str] = []

    assert platform.down(tmp_path / "demo", say=said.append) == 0, said

    assert _left(api) == [], said
    assert _release(foreign) is None, said
    assert process.wait(timeout=10) is not None
    assert not state.path.exists()
    removed = [line for line in said if line.startswith("# removed: ")]
    assert removed[0] == f"# removed: namespace {' '.join(existing_cluster.FOREIGN_NAMESPACES)}", (
        said
    )
    assert f"# removed: helm release {run_state.NAMESPACE}/{run_state.RELEASE}" in removed, said
    assert len(removed) == 8, said
    assert not [line for line in said if "left alone" in line], said
    assert said[-1].startswith("# demo stopped: its processes, and what it made in the cluster")


def test_demo_down_names_what_it_could_not_remove_and_the_command_that_does(
    foreign: cluster.ControlPlane, tmp_path: Path
) -> None:
    api = run_state.admin_client(str(foreign.kubeconfig))
    _what_the_demo_made(api, RUN)
    core = client.CoreV1Api(api)
    # Something in a tenant namespace that nothing will release: the namespace cannot go.
    stuck = {"metadata": {"name": "held", "finalizers": ["example.com/held"]}}
    core.create_namespaced_config_map(existing_cluster.FOREIGN_NAMESPACES[0], stuck)
    state = _foreign_state(tmp_path / "demo", foreign, RUN)
    try:
        left = existing_cluster.remove_foreign(state, say=lambda _line: None, timeout=3)
        # Only the namespaces' command is left (the others may not be gone within 3 s either),
        # named as a person would run it, with why: tenant-root is still there.
        (only,) = left
        command = f"kubectl delete namespace {existing_cluster.FOREIGN_NAMESPACES[0]}"
        assert only.startswith(command), left
        assert "  # still there after 3 s: namespace tenant-root" in only, left
        # The rest goes all the same (the other namespaces once their controller is done).
        only_stuck = [f"namespace {existing_cluster.FOREIGN_NAMESPACES[0]}"]
        wait_for(lambda: _left(api) == only_stuck, 60, f"only {only_stuck} left")
    finally:
        core.patch_namespaced_config_map(
            "held", existing_cluster.FOREIGN_NAMESPACES[0], {"metadata": {"finalizers": None}}
        )


def test_demo_down_leaves_alone_what_does_not_carry_its_mark(
    foreign: cluster.ControlPlane, small_chart: Path, tmp_path: Path
) -> None:
    """A hoster's own tenant-root (docs/install.md), GPUClass h100 and release cozystack-gpu
    carry no mark, and a Node an earlier demo made carries another run's: down leaves each
    as it was and names it; what this run made goes."""
    api = run_state.admin_client(str(foreign.kubeconfig))
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespace({"metadata": HOSTER_TENANT})
    Kube(api).gpu_class("h100", "nvidia.com/GH100_H100_SXM5_80GB", model="H100")
    _install(foreign, small_chart)
    core.create_node({"metadata": {"name": "worker-01", "labels": {MARK: "earlier"}}})
    theirs = ["namespace tenant-root", "gpuclass h100", "node worker-01"]
    _what_the_demo_made(api, RUN, but=theirs)
    uids = {
        "namespace tenant-root": core.read_namespace("tenant-root").metadata.uid,
        "gpuclass h100": custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, "h100"
        )["metadata"]["uid"],
        "node worker-01": core.read_node("worker-01").metadata.uid,
    }
    release = _release(foreign)
    _foreign_state(tmp_path / "demo", foreign, RUN)
    said: list[str] = []

    assert platform.down(tmp_path / "demo", say=said.append) == 0, said

    assert _left(api) == theirs, said
    namespace = core.read_namespace("tenant-root")
    assert namespace.metadata.uid == uids["namespace tenant-root"], said
    assert namespace.metadata.deletion_timestamp is None, said
    assert namespace.metadata.labels == {
        **HOSTER_TENANT["labels"], "kubernetes.io/metadata.name": "tenant-root"
    }  # fmt: skip
    h100 = custom.get_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, "h100")
    assert h100["metadata"]["uid"] == uids["gpuclass h100"], said
    assert core.read_node("worker-01").metadata.uid == uids["node worker-01"], said
    assert _release(foreign) == release == {"revision": "1", "status": "deployed",
                                            "chart": "small-0.1.0"}, said  # fmt: skip
    # Each one left alone is named, with why.
    alone = [line for line in said if "left alone" in line]
    for what in (*theirs, f"helm release {run_state.NAMESPACE}/{run_state.RELEASE}"):
        assert [line for line in alone if line.endswith(f": {what}")], (what, said)
    assert [line for line in alone if line.endswith(": node worker-01")] == [
        f"# left alone, not made by this demo (its {MARK} is earlier, not {RUN}): node worker-01"
    ], said


def test_the_demo_refuses_a_cluster_that_has_its_objects_before_it_writes_anything(
    foreign: cluster.ControlPlane,
    small_chart: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A hoster followed docs/install.md: tenant-root, labelled, and the chart's release
    cozystack-gpu in cozy-gpu. `make demo CLUSTER=existing` there names both, says what to
    do, and stops with a non-zero exit and no traceback, having written nothing."""
    api = run_state.admin_client(str(foreign.kubeconfig))
    client.CoreV1Api(api).create_namespace({"metadata": HOSTER_TENANT})
    _install(foreign, small_chart)

    def started(*_args: object) -> NoReturn:
        pytest.fail("the demo went on to start on a cluster that has its objects", pytrace=False)

    # The story is not played here: its first act writes (the CRDs, the release).
    monkeypatch.setattr(story, "prepare", started)
    monkeypatch.setenv("KUBECONFIG", str(foreign.kubeconfig))
    before = _snapshot(api, foreign)

    code = demo_main(["--dir", str(tmp_path / "demo"), "up", "--quiet", "--existing-cluster"])

    out = capsys.readouterr()
    told = out.out + out.err
    assert code != 0, told
    assert "Traceback" not in told
    for what in (
        "namespace tenant-root",
        f"helm release {run_state.NAMESPACE}/{run_state.RELEASE}",
    ):
        assert what in out.err, told
    # Only what is there is named, and what to do about it.
    assert "tenant-acme" not in out.err, told
    assert "`make demo` without CLUSTER=existing" in out.err, told
    assert _snapshot(api, foreign) == before
    assert not (tmp_path / "demo" / run_state.STATE_FILE).exists()
