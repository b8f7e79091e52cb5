"""What one run of the demo is: where its state lives (``demo.json``), the processes it
started, whose control plane it runs on, and the mark (``MARK``) on what it made; the names of
the chart's release, and the admin client the demo acts as the hoster with."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client

from cozystack_gpu_testkit import cluster

CHART = cluster.REPO_ROOT / "controller" / "chart"
RELEASE = "cozystack-gpu"
NAMESPACE = "cozy-gpu"
STATE_FILE = "demo.json"
# Tokens outlive the demo's cluster by far; the cluster stays up after `make demo`.
TOKEN_SECONDS = 7 * 24 * 3600
# The local kubelet's process name in the state, and how often it compares pod templates.
LOCAL_KUBELET = "local-kubelet"
LOCAL_KUBELET_PERIOD = 2.0
# The mark of what one run of the demo made: this label, with the run's id (State.run), on
# every object it makes and on its helm release. In a cluster it did not start, `make
# demo-down` removes only what carries it: an object of the same name without it is not the
# demo's to change or delete.
MARK = "demo.cozystack.io/run"

log = logging.getLogger(__name__)


def new_run() -> str:
    """A new run's id: the value of its :data:`MARK`."""
    return secrets.token_hex(4)


@dataclass
class State:
    """What `make demo-down` needs: the processes started, and whose plane it is."""

    dir: str
    kubeconfig: str
    bin_dir: str
    own_plane: bool
    # This run's id, the value of its MARK ("": a state from before marks, whose objects
    # carry none, so that `make demo-down` removes nothing of them).
    run: str = ""
    processes: dict[str, int] = field(default_factory=dict)
    # The chart's local pods, by Pod name: what the local kubelet needs to restart one
    # (owner kind and name, node, host root, the hash of the template it was started from,
    # its local ports).
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    # What a node would pull: the code (a directory for $PYTHONPATH) behind an image
    # reference, e.g. a recorded release's tree behind its tag. An image not named here
    # runs this checkout's code.
    images: dict[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return Path(self.dir) / STATE_FILE

    @property
    def mark(self) -> dict[str, str]:
        """The labels that mark an object as this run's."""
        return {MARK: self.run} if self.run else {}

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, self.path)

    @classmethod
    def load(cls, directory: Path) -> State | None:
        path = directory / STATE_FILE
        if not path.exists():
            return None
        return cls(**json.loads(path.read_text()))


# --- processes -------------------------------------------------------------------------------


def spawn(
    state: State,
    name: str,
    argv: list[str],
    *,
    log: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    detach: bool,
) -> subprocess.Popen[bytes]:
    """Starts a process, logging to ``log``, and records it in the state. Detached, it runs
    in its own session and outlives the demo; attached, it dies with the demo's process."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=detach,
            preexec_fn=None if detach else cluster._die_with_parent,
        )
    state.processes[name] = proc.pid
    state.save()
    return proc


def stop_process(state: State, name: str, timeout: float = 10.0) -> None:
    pid = state.processes.pop(name, None)
    if pid is not None:
        cluster.terminate(pid, None, timeout)
        # A child of this process (attached mode) is reaped here, not left a zombie.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    state.save()


def admin_client(kubeconfig: str) -> Any:
    return cluster.kubeconfig_client(kubeconfig, 16)


def installed(api: Any, kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The chart's Deployment or DaemonSet as the API server stores it."""
    apps = client.AppsV1Api(api)
    read = (
        apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_daemon_set
    )
    found: dict[str, Any] = api.sanitize_for_serialization(read(name, namespace))
    return found
