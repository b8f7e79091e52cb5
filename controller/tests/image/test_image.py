"""The controller image (controller/Containerfile), built with podman and run against the
real local control plane: the containerised controller takes the Lease and binds a claim;
the containerised agent reports a fixture sysfs tree, mounted read-only, into its GPUNode.

The image is built once per machine for a given tree (tools/build-image.sh keys it by its
inputs). Building needs root and podman, which tools/build-image.sh installs: where it cannot,
these tests fail with its message; they never skip.
"""

from __future__ import annotations

import shutil
import subprocess
import tomllib
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_scenarios
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for
from cozystack_gpu_testkit.ports import free_port

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "tools" / "build-image.sh"
KUBECONFIG_IN_CONTAINER = "/etc/cozystack-gpu/kubeconfig"
# What the chart's securityContext gives both workloads, and what containerd and CRI-O do
# that podman by default does not: no passwd entry is added for the container's user.
RESTRICTED = (
    "--read-only",
    "--cap-drop=ALL",
    "--security-opt=no-new-privileges",
    "--passwd=false",
)
# A uid the image names in no passwd entry, as OpenShift's restricted profile picks one.
FOREIGN_UID = "1000770000"


@pytest.fixture(scope="session")
def image() -> str:
    result = subprocess.run(["bash", str(BUILD)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{BUILD} failed:\n{result.stderr[-4000:]}"
    return result.stdout.strip().splitlines()[-1]


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    podman_bin = shutil.which("podman")
    assert podman_bin, "podman is not installed (tools/build-image.sh installs it as root)"
    result = subprocess.run(
        [podman_bin, *args], capture_output=True, text=True, check=False, timeout=timeout
    )
    if check:
        assert result.returncode == 0, f"podman {' '.join(args)}:\n{result.stderr}"
    return result


@pytest.fixture
def kubeconfig(control_plane: ControlPlane, tmp_path: Path) -> Path:
    """The admin kubeconfig, readable by the image's non-root user."""
    copy = tmp_path / "kubeconfig"
    copy.write_bytes(control_plane.kubeconfig.read_bytes())
    copy.chmod(0o644)
    return copy


def test_the_image_is_one_non_root_image_without_build_tools(image: str) -> None:
    version = tomllib.loads((REPO / "controller" / "pyproject.toml").read_text())["project"][
        "version"
    ]
    # The entry point is the controller: arguments go to it, as a pod's args do.
    assert podman("run", "--rm", image, "--version").stdout == (f"{version}\n")
    assert podman("run", "--rm", "--entrypoint=id", image, "-u").stdout.strip() == "65532"
    # Both entry points are there; the pod-resources protos were compiled in the build.
    podman("run", "--rm", "--entrypoint=python", image, "-m", "cozystack_gpu.agent", "--help")
    podman(
        "run",
        "--rm",
        "--entrypoint=python",
        image,
        "-c",
        "import cozystack_gpu.agent.podresources.api_pb2_grpc",
    )
    probe = podman(
        "run",
        "--rm",
        "--entrypoint=sh",
        image,
        "-c",
        "for tool in gcc cc c++ make protoc; do command -v $tool; done;"
        " python -c 'import grpc_tools' 2>/dev/null && echo grpc_tools;"
        " python -m pip --version 2>/dev/null && echo pip;"
        " python -c 'import setuptools' 2>/dev/null && echo setuptools;"
        " ls /opt/build 2>/dev/null; true",
    )
    assert probe.stdout == "", f"build tools left in the image:\n{probe.stdout}"


def test_the_image_names_its_user_without_the_runtime_adding_an_entry(image: str) -> None:
    # containerd runs the image's USER as it is: Python's getpass (kopf's default identity)
    # and ~ must find it in the image's own passwd database (0.2.0 crashed on it).
    found = podman(
        "run",
        "--rm",
        *RESTRICTED,
        "--entrypoint=python",
        image,
        "-c",
        "import getpass, os; print(getpass.getuser(), os.getuid(), os.path.expanduser('~'))",
        check=False,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.split() == ["nonroot", "65532", "/nonexistent"]


@pytest.fixture
def container_names() -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    for name in names:
        podman("rm", "--force", name, check=False)


def test_the_containerised_controller_takes_the_lease_and_binds(
    image: str,
    api_client: Any,
    kubeconfig: Path,
    container_names: list[str],
) -> None:
    install_extra_crds(api_client)
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    namespace, tenant = f"img-{test_id}", f"tenant-{test_id}"
    kube.namespace(namespace)
    kube.namespace(tenant, {f"{keys.TENANT_LABEL_PREFIX}{tenant}": ""})
    resource = f"nvidia.com/IMAGE_{test_id}"
    selector = {"test.cozystack.io/id": test_id}
    kube.gpu_node(f"n-{test_id}", resource, 2, labels=selector)
    kube.gpu_class(f"c-{test_id}", resource, selector=selector)

    health = free_port()
    name = f"cozystack-gpu-controller-{test_id}"
    container_names.append(name)
    podman(
        "run",
        "--detach",
        "--name",
        name,
        "--network=host",
        *RESTRICTED,
        # A uid with no passwd entry at all: the replica names itself to kopf.
        f"--user={FOREIGN_UID}:0",
        "--volume",
        f"{kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
        # kopf logs in on its own, from $KUBECONFIG (in a pod: the service account).
        f"--env=KUBECONFIG={KUBECONFIG_IN_CONTAINER}",
        image,  # the entry point: python -m cozystack_gpu
        f"--kubeconfig={KUBECONFIG_IN_CONTAINER}",
        f"--namespace={namespace}",
        "--identity=in-a-container",
        f"--health-port={health}",
        f"--metrics-port={free_port()}",
        "--lease-duration=4",
        "--renew-deadline=3",
        "--retry-period=0.5",
        "--log-format=text",
    )
    coordination = client.CoordinationV1Api(api_client)
    try:

        def holder() -> str | None:
            try:
                lease = coordination.read_namespaced_lease(keys.LEASE_NAME_BINDER, namespace)
            except client.ApiException:
                return None
            return str(lease.spec.holder_identity or "") or None

        assert wait_for(holder, timeout=60, what="the container to take the Lease") == (
            "in-a-container"
        )
        kube.claim(tenant, "vm-gpu", f"c-{test_id}", 2)

        def bound() -> dict[str, Any] | None:
            claim = kube.get_claim(tenant, "vm-gpu")
            return claim if (claim.get("status") or {}).get("phase") == "Bound" else None

        claim = wait_for(bound, timeout=30, what="a bind by the containerised binder")
        assert claim["status"]["nodeName"] == f"n-{test_id}"

        # The binder starts before kopf is imported, so a bind may come before the liveness
        # endpoint (kopf's) listens: the probe is waited for, and must answer 200.
        def healthz() -> int | None:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{health}/healthz", timeout=5
                ) as answer:
                    return int(answer.status)
            except OSError:
                return None

        assert wait_for(healthz, timeout=30, what="/healthz", interval=0.5) == 200
    except BaseException:
        print(podman("logs", name, check=False).stderr[-4000:])
        raise


def test_the_containerised_agent_reports_a_read_only_sysfs_tree(
    image: str, api_client: Any, kubeconfig: Path, tmp_path: Path
) -> None:
    tree = sysfs_scenarios.mixed(tmp_path / "host")
    inventory = sysfs.read_inventory(str(tree.root))
    advertised = plugin_devices(inventory)
    socket_dir = tmp_path / "pod-resources"
    kubelet = FakeKubelet(str(socket_dir / "kubelet.sock"))
    kubelet.set(allocatable=advertised)
    kubelet.start()
    node = f"gpu-{uuid.uuid4().hex[:8]}"
    created = client.CoreV1Api(api_client).create_node({"metadata": {"name": node}})
    try:
        # Root without capabilities, as the chart's DaemonSet runs it (kubelet's socket is
        # root's); the host tree and the socket directory read-only.
        result = podman(
            "run",
            "--rm",
            "--network=host",
            "--user=0",
            *RESTRICTED,
            "--volume",
            f"{tree.root}:/host:ro",
            "--volume",
            f"{socket_dir}:/var/lib/kubelet/pod-resources:ro",
            "--volume",
            f"{kubeconfig}:{KUBECONFIG_IN_CONTAINER}:ro",
            "--entrypoint=python",
            image,
            "-m",
            "cozystack_gpu.agent",
            f"--node={node}",
            "--sysfs-root=/host",
            "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock",
            f"--kubeconfig={KUBECONFIG_IN_CONTAINER}",
            "--listen=127.0.0.1:0",
            "--once",
            check=False,
        )
    finally:
        kubelet.stop()
    assert result.returncode == 0, result.stderr[-4000:]
    gpunode = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node
    )
    assert gpunode["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": node, "uid": created.metadata.uid}
    ]
    status = gpunode["status"]
    assert status["resourceNames"] == sorted(advertised)
    reported = {d["pciAddress"] for d in status["devices"]}
    assert reported == {f.address for f in inventory.functions}
    assert sum(d["allocatable"] for d in status["devices"]) == sum(
        len(ids) for ids in advertised.values()
    )
