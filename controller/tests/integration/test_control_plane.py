"""The local control plane itself: it starts, serves, stops, and never outlives its owner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cozystack_gpu_testkit import cluster

pytestmark = pytest.mark.apiserver

LOCAL_CLUSTER = (sys.executable, "-m", "cozystack_gpu_testkit.local_cluster")


def test_start_serve_stop(tmp_path: Path) -> None:
    plane = cluster.start(tmp_path / "cp")
    try:
        version = plane.version()
        assert version.startswith("v1.37."), version
        namespaces = plane.get_json("/api/v1/namespaces")
        assert {"default", "kube-system"} <= {n["metadata"]["name"] for n in namespaces["items"]}
        pids = dict(plane.pids)
        assert all(cluster.alive(pid) for pid in pids.values())
    finally:
        plane.stop()
    assert not any(cluster.alive(pid) for pid in pids.values())


def test_a_killed_test_run_leaves_no_server_behind(tmp_path: Path) -> None:
    """SIGKILL skips every cleanup handler; the kernel's parent-death signal still fires, for
    the scheduler and the controller-manager as for etcd and the API server."""
    pid_file = tmp_path / "pids"
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from cozystack_gpu_testkit import cluster
        plane = cluster.start(
            {str(tmp_path / "cp")!r}, scheduler=True, controller_manager=True
        )
        Path({str(pid_file)!r}).write_text(" ".join(str(p) for p in plane.pids.values()))
        time.sleep(600)
        """
    )
    owner = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy())
    try:
        deadline = time.monotonic() + 90
        while not pid_file.exists() or not pid_file.read_text():
            assert owner.poll() is None, "the owner died before the servers were ready"
            assert time.monotonic() < deadline, "the control plane did not start"
            time.sleep(0.2)
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids) == 4 and all(cluster.alive(pid) for pid in pids)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 10
    while any(cluster.alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(cluster.alive(pid) for pid in pids), "a control plane process outlived its owner"


def test_command_line_up_prints_kubeconfig_and_down_stops(tmp_path: Path) -> None:
    state = tmp_path / "dev"
    # The plane alone: the real node's path is test_install_on_make_cluster's, and one node
    # per machine is the session's (an `auto` node here would take the machine's lock).
    up = subprocess.run(
        [*LOCAL_CLUSTER, "--dir", str(state), "up", "--node=no"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    try:
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in up.stdout.splitlines()
        assert "ready at https://127.0.0.1:" in up.stderr
        status = subprocess.run(
            [*LOCAL_CLUSTER, "--dir", str(state), "status"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 0, status.stdout
        alive = json.loads(status.stdout)["alive"]
        assert alive == {
            "etcd": True,
            "kube-apiserver": True,
            "kube-scheduler": True,
            "kube-controller-manager": True,
            "virt-api": True,
            "virt-controller": True,
        }
        pids = json.loads((state / "state.json").read_text())["pids"]
        kubectl = Path(up.stdout.splitlines()[1].split("=", 1)[1].split(":")[0]) / "kubectl"
        crds = subprocess.run(
            [str(kubectl), "--kubeconfig", str(state / "kubeconfig"), "get", "crds", "-o", "name"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert "customresourcedefinition.apiextensions.k8s.io/gpuclaims.gpu.cozystack.io" in crds
        vmis = "customresourcedefinition.apiextensions.k8s.io/virtualmachineinstances.kubevirt.io"
        assert vmis in crds
        # The chart can be installed into this plane: its CRDs are handed to the release.
        owner = subprocess.run(
            [str(kubectl), "--kubeconfig", str(state / "kubeconfig"), "get", "crd",
             "gpuclaims.gpu.cozystack.io", "-o", "jsonpath={.metadata.annotations}"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert json.loads(owner)["meta.helm.sh/release-name"] == "cozystack-gpu"
    finally:
        subprocess.run(
            [*LOCAL_CLUSTER, "--dir", str(state), "down"],
            check=True,
            timeout=60,
        )
    assert not state.exists()
    assert not any(cluster.alive(pid) for pid in pids.values())
