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
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from cozystack_gpu_testkit import cluster, controller_image, releases, sysfs_tree
from cozystack_gpu_testkit import node as real_node
from cozystack_gpu_testkit.objects import Kube

REPO = Path(__file__).resolve().parents[3]
RUNNING_TIMEOUT_S = 60.0
NODE_TOLERATION = {"key": real_node.NODE_TAINT["key"], "operator": "Exists"}
# The chart's release as docs/install.md installs it.
RELEASE = "cozystack-gpu"
NAMESPACE = "cozy-gpu"
DEPLOYMENT = "cozystack-gpu-controller"
DAEMONSET = "cozystack-gpu-agent"
WEBHOOK_SERVICE = "cozystack-gpu-webhook"
HELM_TIMEOUT = "300s"


def start_plane() -> cluster.ControlPlane:
    return cluster.start(
        bin_dir=cluster.binary_dir(),
        scheduler=True,
        controller_manager=True,
        controllers=cluster.WORKLOAD_CONTROLLERS,
        extra_apiserver_args=("--enable-aggregator-routing=true",),
    )


def build_controller_image(node: real_node.RealNode, scratch: Path) -> str:
    """The controller image as tools/build-image.sh builds it, in the node's containerd."""
    return controller_image.build_into(node, scratch)


RELEASE_IMAGES = "localhost/cozystack-gpu-controller-release"


def _dangling_images() -> set[str]:
    done = subprocess.run(
        ["podman", "images", "--quiet", "--no-trunc", "--filter", "dangling=true"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return set(done.stdout.split())


def released_image(node: real_node.RealNode, release: releases.Release, scratch: Path) -> str:
    """The image of a recorded release, built by that release's own tools/build-image.sh from
    a worktree of its commit (as ``tools/release.py rebuild`` builds it), tagged
    ``RELEASE_IMAGES:<version>-<commit>`` and kept there by commit, and imported into the
    node's containerd. A tree's own builds prune other builds of the test image's name, never
    this one's."""
    reference = f"{RELEASE_IMAGES}:{release.version}-{release.commit[:12]}"
    exists = subprocess.run(["podman", "image", "exists", reference], check=False)
    if exists.returncode != 0:
        dangling = _dangling_images()
        tree = scratch / f"release-{release.version}"
        releases.git(REPO, "worktree", "add", "--detach", str(tree), release.commit)
        try:
            built = subprocess.run(
                ["bash", str(tree / "tools" / "build-image.sh")],
                cwd=tree, capture_output=True, text=True, check=False,
                env={
                    **os.environ,
                    "COZYSTACK_GPU_IMAGE_KEEP_OTHERS": "1",
                    "COZYSTACK_GPU_PYTHON": sys.executable,
                },
            )  # fmt: skip
            assert built.returncode == 0, (
                f"release {release.version}'s build-image.sh failed:\n{built.stderr[-4000:]}"
            )
            image = built.stdout.strip().splitlines()[-1]
            subprocess.run(["podman", "tag", image, reference], check=True)
            # Its builder stage (about 435 MB), which releases before 0.3 leave untagged.
            for left in _dangling_images() - dangling:
                subprocess.run(["podman", "rmi", left], capture_output=True, check=False)
        finally:
            releases.git(REPO, "worktree", "remove", "--force", str(tree))
    controller_image.hand_to(node, reference, scratch)
    return reference


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


def helm(plane: cluster.ControlPlane, *args: str, values: dict[str, Any] | None = None) -> str:
    done = subprocess.run(
        [
            str(plane.bin_dir / "helm"),
            f"--kubeconfig={plane.kubeconfig}",
            *args,
            *(("--values", "-") if values is not None else ()),
        ],
        input=yaml.safe_dump(values) if values is not None else None,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr[-4000:]}"
    return done.stdout


def chart_values(
    image: str, tree: sysfs_tree.SysfsTree, node: real_node.RealNode
) -> dict[str, Any]:
    """The values a hoster gives (docs/install.md), with the node's own paths: the image
    imported into its containerd, the fixture tree as the host's /sys and pci.ids, and
    kubelet's pod-resources directory under the node's work directory."""
    repository, tag = image.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        # The node is tainted for tests of its own; a hoster's GPU nodes are tainted too.
        "controller": {"tolerations": [NODE_TOLERATION]},
        "agent": {
            "hostPaths": {
                "sys": str(tree.root / "sys"),
                "podResources": str(node.pod_resources_socket.parent),
                "pciIds": str(tree.pci_ids.parent),
            },
            "pollSeconds": 1,
        },
    }


def pods_of(kube: Kube, selector: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def launcher_pod(vmi: dict[str, Any], image: str) -> dict[str, Any]:
    """The virt-launcher pod virt-controller renders for ``vmi`` (owned by it, its labels,
    one extended-resource request per gpus entry), with the pause image as its container:
    the pod webhook gates it, the leader pins it, the scheduler binds it, kubelet runs it."""
    requests: dict[str, int] = {}
    for gpu in vmi["spec"]["domain"]["devices"].get("gpus", []):
        requests[gpu["deviceName"]] = requests.get(gpu["deviceName"], 0) + 1
    resources = {k: str(v) for k, v in requests.items()}
    return {
        "metadata": {
            "name": f"virt-launcher-{vmi['metadata']['name']}",
            "labels": {
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": vmi["metadata"]["uid"],
                **vmi["metadata"].get("labels", {}),
            },
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": vmi["metadata"]["name"],
                    "uid": vmi["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "compute",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }
