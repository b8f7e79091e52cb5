"""The demo's platform: the control plane, the chart, and the chart's pods as local processes.

The control plane is the test kit's (etcd, kube-apiserver with aggregator routing, so a
webhook Service can be pointed at a local process, kube-scheduler, kube-controller-manager),
or the cluster ``$KUBECONFIG`` names. The chart goes in with ``helm install``: CRDs, RBAC,
webhook configurations, policies, the controller Deployment and the agent DaemonSet.

No kubelet runs here, so the demo plays the controllers and kubelets that would turn the
installed Deployment and DaemonSet into running pods (:class:`LocalPods`): it writes each Pod
(from the installed object's pod template, bound to its node), asks for a service-account token
bound to that Pod (what the projected token volume holds; for the agent it carries the node
name the chart's own-node policy reads), and runs the container's command and arguments as a
local process, exactly as rendered: only what a container would see differently is mapped,

* the image's ``python`` is this environment's interpreter, with its ``$PYTHONPATH`` (a
  worktree's code, not the one the environment has installed);
* every absolute path is below the pod's own root directory, where each volume mount is a link
  to its source (a hostPath below the host's root, a Secret's files, an emptyDir);
* each container port gets a free local port (pods have their own network namespaces, local
  processes share one), in the arguments and environment that name it;
* the API server is reached through ``$KUBECONFIG``, a kubeconfig with the pod's token.

Once the story has started them, a local kubelet process (``python -m
cozystack_gpu_testkit.demo kubelet``, :func:`run_local_kubelet`) follows the installed
objects as a cluster would: every few seconds it compares each pod's template with the one
its process was started from, and restarts the pod when it changed (``helm upgrade``) or stops
it when its Deployment or DaemonSet is gone (``helm uninstall``).

Processes, the plane and the state that ``make demo-down`` needs are recorded in ``demo.json``
in the demo directory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, kubevirt, local_cluster
from cozystack_gpu_testkit.demo.existing_cluster import remove_foreign
from cozystack_gpu_testkit.demo.run_state import (
    CHART,
    LOCAL_KUBELET,
    NAMESPACE,
    RELEASE,
    State,
    stop_process,
)


def down(directory: Path, say: Any = print) -> int:
    """Stops what a demo in ``directory`` started: its processes, then its own control plane,
    and removes the directory. In a cluster it did not start it first removes the objects it
    made there (:func:`remove_foreign`); it exits 1 naming what it could not."""
    state = State.load(directory)
    if state is None:
        say(f"# no demo in {directory}")
        return 0
    left = [] if state.own_plane else remove_foreign(state, say)
    attached = _ATTACHED_NODES.pop(directory.absolute(), None)
    if attached is not None:
        attached.stop()  # a detached one is in the plane's record: `cluster down` stops it
    pid = state.processes.get(LOCAL_KUBELET)
    if pid is not None:
        # First, and read the state again after it: it may have restarted pods since.
        cluster.terminate(pid, None, 10.0)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        state = State.load(directory) or state
        state.processes.pop(LOCAL_KUBELET, None)
    for name in sorted(state.processes, key=lambda n: (not n.startswith("pod/"), n)):
        stop_process(state, name)
    if state.own_plane:
        local_cluster.main(["--dir", str(directory / "cluster"), "down"])
        shutil.rmtree(directory, ignore_errors=True)
        say("# demo stopped: its processes and its control plane")
    else:
        state.path.unlink()
        if left:
            say("# demo processes stopped; what could not be removed, to remove by hand:")
            for command in left:
                say(f"  {command}")
            return 1
        say(f"# demo stopped: its processes, and what it made in the cluster at {state.kubeconfig}")
    return 0


log = logging.getLogger(__name__)


# --- the control plane -----------------------------------------------------------------------

# Who wrote the objects a tenant owns in the story (claims, reservations, VMs), as the API
# server judged it: its audit log, in the plane's directory. Metadata only, and nothing else
# is logged.
AUDIT_RULES = [
    {
        "level": "Metadata",
        "verbs": ["create", "update", "patch", "delete"],
        "resources": [
            {"group": keys.GROUP, "resources": [keys.PLURAL_CLAIMS, keys.PLURAL_RESERVATIONS]},
            {"group": keys.KUBEVIRT_GROUP, "resources": [keys.VM.plural]},
        ],
    },
]


@dataclass(frozen=True)
class AuditedWrite:
    verb: str
    resource: str
    namespace: str
    name: str
    # The user whose rights the API server judged: the impersonated one where there is one.
    user: str
    code: int


def audited_writes(directory: Path) -> list[AuditedWrite]:
    """The writes of claims, reservations and VMs the demo's own plane in ``directory``
    logged, in order."""
    path = directory / "cluster" / "audit.log"  # the plane's (cluster.start's audit)
    found = []
    for line in path.read_text().splitlines() if path.exists() else []:
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete":
            continue
        ref = event.get("objectRef") or {}
        user = (event.get("impersonatedUser") or event.get("user") or {}).get("username", "")
        found.append(
            AuditedWrite(
                verb=event["verb"],
                resource=ref.get("resource", ""),
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                user=user,
                code=(event.get("responseStatus") or {}).get("code", 0),
            )
        )
    return found


def start_plane(
    directory: Path,
    bin_dir: Path,
    *,
    detach: bool,
    controllers: tuple[str, ...] = cluster.CONTROLLERS,
) -> cluster.ControlPlane:
    """The test kit's control plane in ``directory/cluster``, with KubeVirt's CRDs (the
    chart brings its own), recorded so the test kit's ``cluster down`` stops it too (and
    the real node :func:`record_node` adds). ``controllers``: what its
    kube-controller-manager runs (``node_pods.NODE_CONTROLLERS`` with a real node)."""
    workdir = directory / "cluster"
    plane = cluster.start(
        workdir,
        bin_dir=bin_dir,
        detach=detach,
        # The webhook Service is called at its EndpointSlice address: a local process.
        extra_apiserver_args=("--enable-aggregator-routing=true",),
        audit=AUDIT_RULES,
        scheduler=True,
        controller_manager=True,
        controllers=controllers,
        crds=[cluster.kubevirt_crds(bin_dir)],
    )
    # KubeVirt's own virt-api (its webhooks) and virt-controller make the VM act's VMI and
    # launcher pod.
    kubevirt.start(plane)
    (workdir / "state.json").write_text(
        json.dumps(
            {
                "server": plane.server,
                "kubeconfig": str(plane.kubeconfig),
                "bin_dir": str(bin_dir),
                "pids": plane.pids,
            }
        )
    )
    return plane


# Real nodes that die with this process (the e2e test's), by demo directory: `down` stops
# them first. Their lock is this process's, so only this process can stop them.
_ATTACHED_NODES: dict[Path, Any] = {}


def record_node(directory: Path, node: Any) -> None:
    """Makes :func:`down` stop the demo's real node: a detached one is added to the plane's
    record (``RealNode.state``; ``cluster down`` stops it before the plane)."""
    if not node.detach:
        _ATTACHED_NODES[directory.absolute()] = node
        return
    path = directory / "cluster" / "state.json"
    state = json.loads(path.read_text())
    state["node"] = node.state()
    path.write_text(json.dumps(state))


# --- the chart -------------------------------------------------------------------------------


def helm_install(
    state: State,
    values: dict[str, Any],
    log: Path,
    chart: Path = CHART,
    *,
    take_ownership: bool = False,
) -> str:
    """``helm install`` of ``chart`` (``upgrade --install``: a rerun converges, and with
    another chart it is an upgrade); returns helm's output. ``take_ownership``: adopt
    objects the chart now renders that the cluster already has (an upgrade from 0.1.0,
    whose controller made gpu-settings itself)."""
    args = ["upgrade", "--install", RELEASE, str(chart), "--create-namespace", "--values", "-"]
    # The run's mark on the release (helm keeps it on upgrades and rollbacks).
    labels = ["--labels", ",".join(f"{k}={v}" for k, v in state.mark.items())]
    return _helm(
        state,
        [*args, *(labels if state.mark else []), *(["--take-ownership"] if take_ownership else [])],
        log,
        yaml.safe_dump(values),
    )


def helm_command(state: State, command: str, log: Path) -> str:
    """A ``helm`` command line as a page prints it (``helm upgrade ...``), run against the
    state's cluster; returns helm's output."""
    words = command.split()
    if words[:1] != ["helm"]:
        raise ValueError(f"not a helm command: {command}")
    return _helm(state, words[1:], log)


def helm_rollback(state: State, revision: int, log: Path) -> str:
    """``helm rollback`` of the release to ``revision``; returns helm's output."""
    return _helm(state, ["rollback", RELEASE, str(revision)], log)


def _helm(state: State, args: list[str], log: Path, stdin: str | None = None) -> str:
    command = [
        str(Path(state.bin_dir) / "helm"),
        *args,
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        state.kubeconfig,
    ]
    result = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    with log.open("a") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        raise RuntimeError(f"helm {args[0]} failed: {result.stderr.strip()}")
    return result.stdout


def webhook_service(api: Any) -> str:
    """The Service the chart's webhook configurations call."""
    hooks = client.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration(
        label_selector="app.kubernetes.io/part-of=cozystack-gpu"
    )
    names = {h.client_config.service.name for c in hooks.items for h in c.webhooks or []}
    if len(names) != 1:
        raise RuntimeError(f"expected one webhook Service in the chart's configurations: {names}")
    return str(names.pop())


def node_matches(template_spec: dict[str, Any], labels: Mapping[str, str]) -> bool:
    """Does a Node with ``labels`` fit the pod template's nodeSelector and required node
    affinity (what a DaemonSet controller decides)? Supports In, NotIn, Exists,
    DoesNotExist."""
    for key, value in (template_spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (
        ((template_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if not required:
        return True
    return any(_term_matches(term, labels) for term in required)


def _term_matches(term: dict[str, Any], labels: Mapping[str, str]) -> bool:
    for expr in term.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
        }.get(op)
        if not ok:
            return False
    return True
