"""The demo's local kubelet against the real API server: a local pod follows its
Deployment's pod template as a cluster would roll it (``helm upgrade`` on ``make demo``),
stops when the Deployment goes (``helm uninstall``) and starts again when it comes back
(``helm install`` of the same release).

The Deployment's container is a plain ``python`` that sleeps; no Deployment controller runs
in the test plane, so only the local kubelet acts on it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.demo import local_pods, run_state

pytestmark = pytest.mark.apiserver

NAME = "sleeper"


def _deployment(ttl: str) -> dict[str, Any]:
    labels = {"app": NAME}
    container = {
        "name": NAME,
        "image": "python",
        "command": ["python", "-c", "import time; time.sleep(600)"],
        "env": [{"name": "GPU_REJECTION_TTL", "value": ttl}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"serviceAccountName": "default", "containers": [container]},
            },
        },
    }


def _environ(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")


def test_a_local_pod_follows_its_deployments_template_stops_when_it_goes_and_starts_when_it_returns(
    api_client: Any, control_plane: ControlPlane, namespace: str, tmp_path: Path
) -> None:
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    apps.create_namespaced_deployment(namespace, _deployment("600"))
    state = run_state.State(
        dir=str(tmp_path), kubeconfig=str(control_plane.kubeconfig), bin_dir="", own_plane=False
    )
    pods = local_pods.LocalPods(state, api_client, detach=False, namespace=namespace)
    owner = run_state.installed(api_client, "Deployment", NAME, namespace)
    first = pods.start(owner, f"{NAME}-0", "node-1", tmp_path / "host")
    try:
        pods.wait_ready(first)
        first_uid = first.obj["metadata"]["uid"]
        assert pods.sync() == [], "an unchanged template keeps the pod"
        assert state.processes[f"pod/{NAME}-0"] == first.proc.pid

        apps.patch_namespaced_deployment(
            NAME,
            namespace,
            {"spec": {"template": {"spec": {"containers": [
                {"name": NAME, "env": [{"name": "GPU_REJECTION_TTL", "value": "300"}]}
            ]}}}},
        )  # fmt: skip
        (rolled,) = pods.sync()
        pid = state.processes[f"pod/{NAME}-0"]
        assert pid != first.proc.pid and first.proc.poll() is not None, rolled
        assert f"pid {first.proc.pid} → {pid}" in rolled
        assert "GPU_REJECTION_TTL=300" in _environ(pid)
        pod = core.read_namespaced_pod(f"{NAME}-0", namespace)
        assert pod.metadata.uid != first_uid, "the Pod is written again, as a new one"
        ready = {c.type: c.status for c in pod.status.conditions or []}
        assert ready.get("Ready") == "True"
        # State is what the local kubelet of `make demo` reads back on each pass.
        saved = run_state.State.load(tmp_path)
        assert saved is not None and saved.processes[f"pod/{NAME}-0"] == pid
        assert pods.sync() == [], "the new template is now the one started from"

        apps.delete_namespaced_deployment(NAME, namespace)
        (stopped,) = pods.sync()
        assert f"pod/{NAME}-0" not in state.processes
        assert "gone" in stopped
        assert not os.path.exists(f"/proc/{pid}"), "stopped and reaped"
        assert pods.sync() == [], "nothing to do while the Deployment is gone"

        # helm uninstall, then helm install: the same Deployment again starts its pod again,
        # on the same local ports (the webhook Service's endpoint stays right).
        apps.create_namespaced_deployment(namespace, _deployment("120"))
        (again,) = pods.sync()
        back = state.processes[f"pod/{NAME}-0"]
        assert "back" in again and back != pid, again
        assert "GPU_REJECTION_TTL=120" in _environ(back)
        assert pods.sync() == [], "the reinstalled template is now the one started from"
    finally:
        for name in list(state.processes):
            run_state.stop_process(state, name)
