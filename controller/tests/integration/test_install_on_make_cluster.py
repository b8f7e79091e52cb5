"""docs/install.md followed on ``make cluster``: its commands, run as a newcomer runs them on
the local cluster with its real node, bring the chart's controller up as pods and the
``gpu_class`` module is answered by their webhook.

What is taken from the doc: the code blocks of its sections 2 (the cluster's side) and 3
(the chart), and the inline ``kubectl`` commands there, run by bash in order. What stands in
for a hoster's own: the release's chart tarball is this tree's chart packaged by ``helm
package`` under the name the doc uses, and the image is this tree's, imported into the
node's containerd with the command ``make cluster`` prints (install.md's ``ctr ... images
import``), named where the doc names the registry's. Sections 1 (a published release), 4
(GPU hosts) and 5 (a VM) need what this machine has not: a registry, GPUs, virt-handler.

Runs before ``test_real_node*.py`` (by name): ``make cluster``'s node and the session's
real node share this machine's one node lock.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes import config as kube_config
from real_node_env import REPO

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, controller_image, node_config, node_host

pytestmark = [pytest.mark.apiserver, pytest.mark.own_plane]

INSTALL_MD = REPO / "docs" / "install.md"
LOCAL_CLUSTER = (sys.executable, "-m", "cozystack_gpu_testkit.local_cluster")
# The doc's names for what a hoster brings.
DOC_REGISTRY_IMAGE = "registry.example.net/gpu/cozystack-gpu-controller"
DOC_CHART_TARBALL = re.compile(r"cozystack-gpu-(\d+\.\d+\.\d+)\.tgz")


def section(text: str, number: int) -> str:
    """The text of the doc's ``## <number>.`` section."""
    match = re.search(rf"^## {number}\. .*?(?=^## )", text, re.S | re.M)
    assert match, f"install.md has no section {number}"
    return match.group(0)


def blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^\s*```{language}\n(.*?)^\s*```", text, re.S | re.M)


def inline_kubectl(text: str) -> list[str]:
    """The ``kubectl ...`` commands written inline (outside code blocks)."""
    outside = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`(kubectl [^`]+)`", outside)


class LockWaiter(threading.Thread):
    """Polls the node lock much faster than ``NodeLock.acquire`` does, as another node
    would wait for it; once it holds it, records what of the last node's host state is
    still there, and lets it go."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.saw: dict[str, bool] = {}

    def run(self) -> None:
        fd = os.open(node_host.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + 170
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    time.sleep(0.01)
                    continue
                self.saw = {
                    "record": node_host.RECORD_FILE.exists(),
                    "bridge": Path("/sys/class/net", node_config.BRIDGE).exists(),
                }
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
        finally:
            os.close(fd)


@pytest.fixture(scope="module")
def make_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``make cluster`` (``local_cluster up``) asked for its real node, and ``make
    cluster-down`` after the module, which must put the host back."""
    state_dir = tmp_path_factory.mktemp("make-cluster") / "cluster"
    env = {**os.environ, "COZYSTACK_GPU_BIN_DIR": str(cluster.binary_dir())}
    up = subprocess.run(
        [*LOCAL_CLUSTER, "--dir", str(state_dir), "up", "--node=yes"],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
        env=env,
    )
    assert up.returncode == 0, up.stderr[-4000:]
    try:
        exports = dict(
            line.removeprefix("export ").split("=", 1)
            for line in up.stdout.splitlines()
            if line.startswith("export ")
        )
        state = json.loads((state_dir / "state.json").read_text())
        yield {"stderr": up.stderr, "exports": exports, "state": state, "dir": state_dir}
    finally:
        # A node waiting for the lock meanwhile (a test session's) gets it only once the
        # host is put back: it once took the lock between kubelet's exit and the rest of
        # cluster-down, which then waited for that node's whole session.
        waiter = LockWaiter()
        waiter.start()
        down = subprocess.run(
            [*LOCAL_CLUSTER, "--dir", str(state_dir), "down"],
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
            env=env,
        )
        waiter.join(30)
        assert down.returncode == 0, down.stderr
        assert waiter.saw == {"record": False, "bridge": False}, (
            f"a node waiting for the lock got it before cluster-down had put the host back: "
            f"{waiter.saw}"
        )
        # The node is gone and the host put back: its bridge, its record, its lock.
        assert not Path("/sys/class/net", node_config.BRIDGE).exists()
        assert not node_host.RECORD_FILE.exists()
        lock = node_host.NodeLock()
        lock.acquire(5)
        lock.release()


def run(script: str, env: dict[str, str], cwd: Path) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
        env=env,
        cwd=cwd,
    )
    failed = f"{done.stdout[-2000:]}{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{script}\n--- failed:\n{failed}"
    return done.stdout


def test_install_md_brings_the_chart_up_as_pods_on_make_clusters_node(
    make_cluster: dict[str, Any], tmp_path: Path
) -> None:
    state, exports = make_cluster["state"], make_cluster["exports"]
    # make cluster says how images get onto its node.
    importing = r"Images: (\S+ --address \S+ -n k8s\.io images import) "
    (hint,) = re.findall(importing, make_cluster["stderr"])
    assert state["node"] and state["node"]["name"] == "local-node"
    env = {
        **os.environ,
        "KUBECONFIG": exports["KUBECONFIG"],
        "PATH": exports["PATH"].replace("$PATH", os.environ["PATH"]),
    }

    # The release's image: this tree's, imported as install.md's ctr line does.
    image = controller_image.build()
    archive = tmp_path / "controller.oci.tar"
    run(f"podman save --quiet --format oci-archive --output {archive} {image}", env, tmp_path)
    run(f"{hint} {archive}", env, tmp_path)
    repository, tag = image.rsplit(":", 1)

    doc = INSTALL_MD.read_text()
    cluster_side, chart = section(doc, 2), section(doc, 3)
    # Section 2: namespaces, budgets, entitlement, in the doc's order.
    for script in blocks(cluster_side, "bash"):
        run(script, env, tmp_path)
    for manifest in blocks(cluster_side, "yaml"):
        run(f"kubectl apply -f - <<'EOF'\n{manifest}EOF", env, tmp_path)
    for command in inline_kubectl(cluster_side):
        run(command, env, tmp_path)

    # Section 3: the chart, from a tarball of the doc's name, with the image named as the
    # doc names its registry's.
    (script,) = blocks(chart, "bash")
    version = DOC_CHART_TARBALL.search(script)
    assert version, "install.md's helm install names no chart tarball"
    packaged = run(
        f"helm package {REPO / 'controller' / 'chart'} --version {version.group(1)} "
        f"--destination {tmp_path}",
        env,
        tmp_path,
    )
    assert version.group(0) in packaged
    assert DOC_REGISTRY_IMAGE in script
    script = script.replace(DOC_REGISTRY_IMAGE, repository).replace(
        "helm install ", f"helm install --set image.tag={tag} --wait --timeout 300s ", 1
    )
    run(script, env, tmp_path)

    config = client.Configuration()
    kube_config.load_kube_config(config_file=exports["KUBECONFIG"], client_configuration=config)
    api = client.ApiClient(config)
    # "kubectl -n cozy-gpu get pods shows the controller replicas Ready"
    deployment = client.AppsV1Api(api).read_namespaced_deployment(
        "cozystack-gpu-controller", "cozy-gpu"
    )
    assert deployment.status.ready_replicas == 2
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod("cozy-gpu", label_selector="app.kubernetes.io/component=controller")
        .items
    )
    assert {p.spec.node_name for p in pods} == {"local-node"}

    # The gpu_class module, as a hoster's pipeline runs it, answered by the replicas'
    # class webhook: a class is created, and a second one refused with the webhook's
    # reason (its resource name is the first's).
    collections = tmp_path / "collections" / "ansible_collections" / "cozystack"
    collections.mkdir(parents=True)
    (collections / "gpu").symlink_to(REPO, target_is_directory=True)
    ansible_env = {
        **env,
        "ANSIBLE_COLLECTIONS_PATH": str(tmp_path / "collections"),
        "ANSIBLE_PYTHON_INTERPRETER": sys.executable,
        "ANSIBLE_LOCALHOST_WARNING": "False",
        "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
    }
    ansible = shutil.which("ansible", path=str(Path(sys.executable).parent))
    assert ansible, "ansible is installed in the venv (requirements/dev.txt)"

    def gpu_class(name: str) -> subprocess.CompletedProcess[str]:
        # The module's own first example (ansible-doc cozystack.gpu.gpu_class).
        args = {
            "name": name,
            "spec": {
                "vendor": "NVIDIA",
                "model": "H100 SXM5 80GB",
                "mode": "passthrough",
                "source": {"devicePlugin": {"resourceName": "nvidia.com/GH100_H100_SXM5_80GB"}},
            },
        }
        return subprocess.run(
            [ansible, "localhost", "-m", "cozystack.gpu.gpu_class", "-a", json.dumps(args)],
            capture_output=True,
            text=True,
            check=False,
            timeout=180,
            env=ansible_env,
        )

    made = gpu_class("h100")
    assert made.returncode == 0, made.stdout + made.stderr
    classes = client.CustomObjectsApi(api).list_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES
    )["items"]
    assert [c["metadata"]["name"] for c in classes] == ["h100"]
    # The create went through the class webhook: it fails closed (failurePolicy Fail), so
    # with no replica answering the module would have failed.
    (webhook,) = [
        w
        for c in client.AdmissionregistrationV1Api(api)
        .list_validating_webhook_configuration()
        .items
        for w in c.webhooks
        if w.name == "gpuclass.gpu.cozystack.io"
    ]
    assert webhook.failure_policy == "Fail"
    # The module refuses a class its rules refuse before it writes, naming the fix...
    refused = gpu_class("h100-again")
    assert refused.returncode != 0
    assert "nodeSelectors do not overlap" in refused.stdout, refused.stdout
    # ...and the replicas' webhook refuses the same class written past the module.
    conflicting = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLASS,
        "metadata": {"name": "h100-again"},
        "spec": classes[0]["spec"],
    }
    with pytest.raises(client.ApiException) as denied:
        client.CustomObjectsApi(api).create_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, conflicting
        )
    message = json.loads(denied.value.body)["message"]
    assert message.startswith('admission webhook "gpuclass.gpu.cozystack.io" denied'), message


def test_make_cluster_says_its_node_is_no_gpu_host(make_cluster: dict[str, Any]) -> None:
    assert "it is no GPU host" in make_cluster["stderr"]
    nodes = yaml.safe_load(
        subprocess.run(
            [
                str(cluster.binary_dir() / "kubectl"),
                "--kubeconfig",
                make_cluster["exports"]["KUBECONFIG"],
                "get",
                "nodes",
                "-o",
                "yaml",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["items"]
    (node,) = nodes
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"
    # Untainted: the chart's pods need no toleration of the kit's own.
    assert not node["spec"].get("taints")
