"""The session's real node (``cozystack_gpu_testkit.node``) and what its tests share: its own
control plane, the controller image imported into its containerd, pods bound to it.

One node serves every test that needs one (``test_real_node``, ``test_real_node_chart``):
it starts when the first of them asks and stops with the session. Its plane is not the
session's: a Ready node there would be seen by every test that lists Nodes, and the
scheduler could place other tests' pods on it. This plane runs what a chart's pods need
(``cluster.WORKLOAD_CONTROLLERS``, the scheduler, aggregator routing for the webhooks).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes import client

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit import node as real_node

REPO = Path(__file__).resolve().parents[3]
BUILD_IMAGE = REPO / "tools" / "build-image.sh"
RUNNING_TIMEOUT_S = 60.0
NODE_TOLERATION = {"key": real_node.NODE_TAINT["key"], "operator": "Exists"}


def start_plane() -> cluster.ControlPlane:
    return cluster.start(
        bin_dir=cluster.binary_dir(),
        scheduler=True,
        controller_manager=True,
        controllers=cluster.WORKLOAD_CONTROLLERS,
        extra_apiserver_args=("--enable-aggregator-routing=true",),
    )


def build_controller_image(node: real_node.RealNode, scratch: Path) -> str:
    """The controller image as tools/build-image.sh builds it (once per tree), saved as an
    OCI archive and imported into the node's containerd. Other builds are kept: another
    checkout's tests may be running theirs."""
    built = subprocess.run(
        ["bash", str(BUILD_IMAGE)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COZYSTACK_GPU_IMAGE_KEEP_OTHERS": "1"},
    )
    assert built.returncode == 0, f"{BUILD_IMAGE} failed:\n{built.stderr[-4000:]}"
    image = built.stdout.strip().splitlines()[-1]
    archive = scratch / "controller.oci.tar"
    saved = subprocess.run(
        ["podman", "save", "--quiet", "--format", "oci-archive", "--output", str(archive), image],
        capture_output=True,
        text=True,
        check=False,
    )
    assert saved.returncode == 0, saved.stderr
    node.import_image(archive)
    archive.unlink()
    return image


def fresh_namespace(core: client.CoreV1Api, labels: dict[str, str] | None = None) -> str:
    """A new namespace whose default ServiceAccount exists (pods need it)."""
    name = f"rn-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name, "labels": dict(labels or {})}})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if core.list_namespaced_service_account(name).items:
            return name
        time.sleep(0.1)
    raise AssertionError(f"no default ServiceAccount in {name}")


def delete_namespace(core: client.CoreV1Api, name: str) -> None:
    """Deletes a test's namespace and waits until it is gone: its pods must not outlive the
    test (a controller pod left running would bind the next test's claims)."""
    core.delete_namespace(name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            core.read_namespace(name)
        except client.ApiException as exc:
            if exc.status == 404:
                return
            raise
        time.sleep(0.2)
    raise AssertionError(f"namespace {name} still there after 60 s")


def pause_pod(node: real_node.RealNode, name: str, *, host_network: bool) -> dict[str, Any]:
    """A pod of the locally built pause image, bound to the real node by ``nodeName``."""
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node.name,
            "hostNetwork": host_network,
            "tolerations": [NODE_TOLERATION],
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "pause", "image": node.pause_image, "imagePullPolicy": "Never"}
            ],
        },
    }


def wait_running(core: client.CoreV1Api, ns: str, name: str) -> Any:
    deadline = time.monotonic() + RUNNING_TIMEOUT_S
    pod = None
    while time.monotonic() < deadline:
        pod = core.read_namespaced_pod(name, ns)
        statuses = pod.status.container_statuses or []
        if pod.status.phase == "Running" and statuses and all(s.ready for s in statuses):
            return pod
        assert pod.status.phase not in ("Failed", "Succeeded"), pod.status
        time.sleep(0.2)
    raise AssertionError(f"pod {ns}/{name} not Running in {RUNNING_TIMEOUT_S:.0f} s: {pod}")
