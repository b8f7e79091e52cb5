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

import base64
import contextlib
import enum
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster, kubevirt, local_cluster, tenants
from cozystack_gpu_testkit.objects import unless
from cozystack_gpu_testkit.ports import free_port
from cozystack_gpu_testkit.webhook_route import host_address, slice_name

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


# What the demo makes in a cluster it did not start (besides the CRDs, which the chart keeps),
# each marked as the run's (MARK).
FOREIGN_NODES = ("gpu-h100-01", "gpu-l40s-01", "gpu-l40s-02", "worker-01")
FOREIGN_NAMESPACES = ("tenant-root", "tenant-acme", "tenant-acme-research")
FOREIGN_CLASSES = ("h100", "l40s", "l40s-24c")
FOREIGN_SECRET = "nls-token"
# In the chart's namespace: the hoster's Prometheus's account the chart lets read /metrics,
# and the slice that points the chart's webhook Service (a fixed name) at the local controller.
FOREIGN_SERVICE_ACCOUNT = "prometheus"
FOREIGN_ENDPOINT_SLICE = slice_name("cozystack-gpu-webhook")


# How long `make demo-down` waits for each kind of the demo's objects to go from a cluster it
# did not start (a namespace goes once the controller has released its claims).
FOREIGN_REMOVAL_TIMEOUT = 120.0


@dataclass(frozen=True)
class ForeignKind:
    """One kind of object the demo makes in a cluster it did not start, with its names."""

    kind: str  # as the demo names it to a person
    resource: str  # as kubectl names it
    names: tuple[str, ...]
    namespace: str | None = None

    def what(self, name: str) -> str:
        return f"{self.kind} {self.namespace}/{name}" if self.namespace else f"{self.kind} {name}"

    def command(self, names: list[str]) -> str:
        """The kubectl command that removes ``names`` by hand."""
        where = f"-n {self.namespace} " if self.namespace else ""
        return f"kubectl {where}delete {self.resource} {' '.join(names)}"


# In the order `make demo-down` removes them: the namespaces first, so the controller releases
# their claims' finalizers while they go, then the classes (their finalizers are the
# controller's too), then the release (remove_foreign), then the rest.
FOREIGN_KINDS = (
    ForeignKind("namespace", "namespace", FOREIGN_NAMESPACES),
    ForeignKind("gpuclass", f"{keys.PLURAL_CLASSES}.{keys.GROUP}", FOREIGN_CLASSES),
    ForeignKind("endpointslice", "endpointslice", (FOREIGN_ENDPOINT_SLICE,), NAMESPACE),
    ForeignKind("serviceaccount", "serviceaccount", (FOREIGN_SERVICE_ACCOUNT,), NAMESPACE),
    ForeignKind("secret", "secret", (FOREIGN_SECRET,), NAMESPACE),
    ForeignKind("node", "node", FOREIGN_NODES),
    ForeignKind("clusterrole", "clusterrole", (tenants.KUBEVIRT_ADMIN_STAND_IN,)),
)
FOREIGN_RELEASE = f"helm release {NAMESPACE}/{RELEASE}"


def read_foreign(api: Any, kind: ForeignKind, name: str) -> dict[str, Any] | None:
    """The object as the API server has it, or None (a GPUClass without our CRD, too)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    reads: dict[str, Callable[[], Any]] = {
        "namespace": lambda: core.read_namespace(name),
        "gpuclass": lambda: custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        ),
        "endpointslice": lambda: client.DiscoveryV1Api(api).read_namespaced_endpoint_slice(
            name, kind.namespace
        ),
        "serviceaccount": lambda: core.read_namespaced_service_account(name, kind.namespace),
        "secret": lambda: core.read_namespaced_secret(name, kind.namespace),
        "node": lambda: core.read_node(name),
        "clusterrole": lambda: client.RbacAuthorizationV1Api(api).read_cluster_role(name),
    }
    found = unless(404, reads[kind.kind])
    return None if found is None else dict(api.sanitize_for_serialization(found))


def _delete_foreign(api: Any, kind: ForeignKind, name: str, uid: str) -> None:
    """Deletes the object only while it is the one with ``uid`` (a precondition the API
    server checks): one made again since it was read is not touched (409)."""
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    body = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid))
    deletes: dict[str, Callable[[], Any]] = {
        "namespace": lambda: core.delete_namespace(name, body=body),
        "gpuclass": lambda: custom.delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, body=body
        ),
        "endpointslice": lambda: client.DiscoveryV1Api(api).delete_namespaced_endpoint_slice(
            name, kind.namespace, body=body
        ),
        "serviceaccount": lambda: core.delete_namespaced_service_account(
            name, kind.namespace, body=body
        ),
        "secret": lambda: core.delete_namespaced_secret(name, kind.namespace, body=body),
        "node": lambda: core.delete_node(name, body=body),
        "clusterrole": lambda: client.RbacAuthorizationV1Api(api).delete_cluster_role(
            name, body=body
        ),
    }
    unless(404, deletes[kind.kind])


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def release_listed(kubeconfig: str, bin_dir: str, selector: str | None = None) -> bool:
    """Is release cozystack-gpu in cozy-gpu (with release labels ``selector``), whatever
    its status?"""
    done = subprocess.run(
        [str(Path(bin_dir) / "helm"), "list", "--all", "--short", "--filter", f"^{RELEASE}$",
         *(["--selector", selector] if selector else []),
         "--namespace", NAMESPACE, "--kubeconfig", kubeconfig],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"helm list failed: {done.stderr.strip()}")
    return RELEASE in done.stdout.split()


def already_there(kubeconfig: str, bin_dir: str) -> list[str]:
    """The demo's objects that the cluster at ``kubeconfig`` has already, by kind and name,
    each with an earlier run's id where it carries a :data:`MARK`: the demo must not start
    there, as it would change them and `make demo-down` could not tell them from its own.
    Raises RuntimeError when it cannot read the cluster."""
    try:
        api = admin_client(kubeconfig)
        found = []
        for kind in FOREIGN_KINDS:
            for name in kind.names:
                obj = read_foreign(api, kind, name)
                if obj is not None:
                    run = _labels(obj).get(MARK)
                    found.append(
                        kind.what(name) + (f" (an earlier demo's: {MARK}={run})" if run else "")
                    )
    except ApiException as exc:
        raise RuntimeError(
            f"cannot read the cluster at {kubeconfig}: {exc.status} {exc.reason}"
        ) from exc
    except (ConfigException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise RuntimeError(f"cannot reach the cluster at {kubeconfig}: {exc}") from exc
    if release_listed(kubeconfig, bin_dir):
        found.append(FOREIGN_RELEASE)
    return found


def refusal(kubeconfig: str, found: list[str]) -> str:
    """Why the demo does not start on the cluster at ``kubeconfig``, and what to do."""
    return "\n".join(
        [
            f"the cluster at {kubeconfig} already has what the demo would make there:",
            *(f"  {what}" for what in found),
            "The demo changes and removes only what it made itself, so it does not start here.",
            "Remove these first if they are an earlier demo's (its state directory lost), or",
            "run it on a local control plane of its own: `make demo` without CLUSTER=existing.",
        ]
    )


def remove_foreign(
    state: State, say: Any = print, timeout: float = FOREIGN_REMOVAL_TIMEOUT
) -> list[str]:
    """Removes from the cluster ``state`` names (not its own plane) what this run made
    there, kind by kind in the order of ``FOREIGN_KINDS``: only objects that carry its
    :data:`MARK`, each kind waited for up to ``timeout``; an object of the demo's names
    without it is left alone and named. Returns the commands that would remove what did not
    go, with why, for a person to finish. The demo's processes must still run: the controller
    releases the claims' and classes' finalizers."""
    api = admin_client(state.kubeconfig)
    left: list[str] = []
    for kind in FOREIGN_KINDS:
        left += _remove_kind(api, state, kind, say, timeout)
        if kind.kind == "gpuclass":  # the controller goes with the release: claims first
            left += _remove_release(state, say, timeout)
    return left


def _remove_kind(api: Any, state: State, kind: ForeignKind, say: Any, timeout: float) -> list[str]:
    """Deletes the objects of ``kind`` that carry this run's mark and waits for them; returns
    the command for those still there (empty when all went)."""
    uids = {}
    for name in kind.names:
        obj = read_foreign(api, kind, name)
        if obj is None or not _is_ours(state, obj, kind.what(name), say):
            continue
        uid = str(obj["metadata"]["uid"])
        try:
            _delete_foreign(api, kind, name, uid)
        except ApiException as exc:
            if exc.status != 409:  # the precondition: made again since it was read
                raise
            say(f"# left alone, made again since it was read: {kind.what(name)}")
            continue
        uids[name] = uid
    stuck = _wait_gone(api, kind, uids, timeout)
    if gone := [name for name in uids if name not in stuck]:
        say(f"# removed: {kind.kind} {' '.join(gone)}")
    if not stuck:
        return []
    why = "; ".join(
        kind.what(n) + (f" ({reason})" if reason else "") for n, reason in stuck.items()
    )
    return [f"{kind.command(list(stuck))}  # still there after {timeout:.0f} s: {why}"]


def _is_ours(state: State, obj: Mapping[str, Any], what: str, say: Any) -> bool:
    """Does ``obj`` carry this run's mark? Says so where it does not."""
    run = _labels(obj).get(MARK)
    if state.run and run == state.run:
        return True
    say(f"# left alone, {_not_made_here(state, run)}: {what}")
    return False


def _not_made_here(state: State, run: str | None) -> str:
    """Why an object of the demo's names is not this run's: the mark it carries, if any."""
    if not run:
        return f"not made by this demo (no {MARK})"
    theirs = f"its {MARK} is {run}"
    return f"not made by this demo ({theirs}, not {state.run})" if state.run else theirs


def _wait_gone(
    api: Any, kind: ForeignKind, uids: Mapping[str, str], timeout: float
) -> dict[str, str]:
    """Waits up to ``timeout`` for each of ``uids`` (name: uid) to be gone; returns those
    still there, with why as far as the object says (a namespace's conditions, finalizers)."""
    deadline = time.monotonic() + timeout
    while True:
        there = {}
        for name, uid in uids.items():
            obj = read_foreign(api, kind, name)
            if obj is not None and obj["metadata"].get("uid") == uid:
                there[name] = obj
        if not there or time.monotonic() > deadline:
            return {name: _why_there(obj) for name, obj in there.items()}
        time.sleep(0.5)


def _why_there(obj: Mapping[str, Any]) -> str:
    """What keeps an object being deleted, as it says: a namespace's conditions (content
    with finalizers), else its own finalizers."""
    conditions = [
        str(c.get("message"))
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") == "True" and str(c.get("type", "")).startswith("Namespace")
        and c.get("message")
    ]  # fmt: skip
    metadata = obj.get("metadata") or {}
    if conditions:
        return "; ".join(conditions)
    if metadata.get("finalizers"):
        return f"finalizers {', '.join(metadata['finalizers'])}"
    return "being deleted" if metadata.get("deletionTimestamp") else ""


def _remove_release(state: State, say: Any, timeout: float) -> list[str]:
    """``helm uninstall`` of the release when it carries this run's mark (helm keeps a
    release's labels across upgrades and rollbacks); one without it is left alone."""
    if not release_listed(state.kubeconfig, state.bin_dir):
        return []
    if not (state.run and release_listed(state.kubeconfig, state.bin_dir, f"{MARK}={state.run}")):
        mark = f"{MARK}={state.run}" if state.run else MARK
        say(f"# left alone, not made by this demo (no {mark}): {FOREIGN_RELEASE}")
        return []
    argv = ["helm", "uninstall", RELEASE, "-n", NAMESPACE, "--wait"]
    done = subprocess.run(
        [str(Path(state.bin_dir) / "helm"), *argv[1:], "--timeout", f"{timeout:.0f}s",
         "--kubeconfig", state.kubeconfig],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode == 0 or "not found" in done.stderr:
        say(f"# removed: {FOREIGN_RELEASE}")
        return []
    reason = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
    return [f"{' '.join(argv)}  # {reason}"]


def chosen_cluster(kubeconfig: str | None, *, existing: bool) -> tuple[str | None, list[str]]:
    """The kubeconfig the demo runs on (None: a local control plane of its own) and what it
    says about the choice. It never writes to a cluster it did not start unless asked in so
    many words (``--existing-cluster``, ``make demo CLUSTER=existing``): a $KUBECONFIG left
    set in a shell would otherwise get fake GPU Nodes and tenants. There, it starts only when
    the cluster has none of its objects (:func:`already_there`)."""
    if not existing:
        if kubeconfig is None:
            return None, []
        return None, [
            f"# $KUBECONFIG ({kubeconfig}) is ignored: the demo starts a local control plane",
            "# of its own. `make demo CLUSTER=existing` runs it on that cluster instead.",
        ]
    if kubeconfig is None:
        raise ValueError(
            "--existing-cluster (CLUSTER=existing) runs the demo on the cluster $KUBECONFIG "
            "names, and $KUBECONFIG is not set; set it, or leave the flag out for a local "
            "control plane"
        )
    account = FOREIGN_SERVICE_ACCOUNT
    return kubeconfig, [
        "!" * 78,
        f"! CLUSTER=existing: the demo runs against {kubeconfig}",
        f"! It registers Nodes {', '.join(FOREIGN_NODES)},",
        f"! creates namespaces {', '.join(FOREIGN_NAMESPACES)}, GPUClasses",
        f"! {', '.join(FOREIGN_CLASSES)}, the ClusterRole {tenants.KUBEVIRT_ADMIN_STAND_IN}",
        f"! (without KubeVirt), installs the chart as {RELEASE} in {NAMESPACE} and makes",
        f"! the Secret {FOREIGN_SECRET}, ServiceAccount {account} and EndpointSlice",
        f"! {FOREIGN_ENDPOINT_SLICE} there, each labelled with this run's id as",
        f"! {MARK}. It does not start where any of these is there already.",
        "! Its API server must reach this machine for the webhooks. `make demo-down`",
        "! removes only what carries this run's label (the namespaces first, while the",
        "! controller releases their claims), then stops the demo's processes.",
        "!" * 78,
    ]


def down(directory: Path, say: Any = print) -> int:
    """Stops what a demo in ``directory`` started: its processes, then its own control plane,
    and removes the directory. In a cluster it did not start it first removes the objects it
    made there (:func:`remove_foreign`); it exits 1 naming what it could not."""
    state = State.load(directory)
    if state is None:
        say(f"# no demo in {directory}")
        return 0
    left = [] if state.own_plane else remove_foreign(state, say)
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


# --- the control plane -----------------------------------------------------------------------

# Who wrote the objects a tenant owns in the story (claims, VMs), as the API server judged it:
# its audit log, in the plane's directory. Metadata only, and nothing else is logged.
AUDIT_RULES = [
    {
        "level": "Metadata",
        "verbs": ["create", "update", "patch", "delete"],
        "resources": [
            {"group": keys.GROUP, "resources": [keys.PLURAL_CLAIMS]},
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
    """The writes of claims and VMs the demo's own plane in ``directory`` logged, in order."""
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


def start_plane(directory: Path, bin_dir: Path, *, detach: bool) -> cluster.ControlPlane:
    """The test kit's control plane in ``directory/cluster``, with KubeVirt's CRDs (the
    chart brings its own), recorded so the test kit's ``cluster down`` stops it too."""
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


def admin_client(kubeconfig: str) -> Any:
    return cluster.kubeconfig_client(kubeconfig, 16)


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


def installed(api: Any, kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The chart's Deployment or DaemonSet as the API server stores it."""
    apps = client.AppsV1Api(api)
    read = (
        apps.read_namespaced_deployment if kind == "Deployment" else apps.read_namespaced_daemon_set
    )
    found: dict[str, Any] = api.sanitize_for_serialization(read(name, namespace))
    return found


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


# --- the chart's pods, as local processes ------------------------------------------------------


class Rollout(enum.Enum):
    """What the local kubelet does with a running local pod on a pass."""

    KEEP = "keep"
    RESTART = "restart"  # its owner's pod template changed: a cluster would roll it
    STOP = "stop"  # its owner is gone: the garbage collector would delete the Pod
    START = "start"  # its owner is back (helm install after helm uninstall)


def template_hash(template: Mapping[str, Any]) -> str:
    """A short hash of a pod template (as Kubernetes' pod-template-hash names a template):
    key order does not count, every value does."""
    canonical = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def rollout(started: str, owner: Mapping[str, Any] | None, *, stopped: bool = False) -> Rollout:
    """Restart a local pod when its Deployment's or DaemonSet's current pod template is not
    the one (``started``, its hash) its process was started from; stop it when the owner is
    gone; start a ``stopped`` one again when its owner is back (a reinstalled release names
    its Deployment and DaemonSet as before). Only the template counts: replicas, labels or
    status of the owner roll nothing."""
    if stopped:
        return Rollout.KEEP if owner is None else Rollout.START
    if owner is None:
        return Rollout.STOP
    if template_hash(owner["spec"]["template"]) != started:
        return Rollout.RESTART
    return Rollout.KEEP


def pod_root(directory: Path, node: str, container: str) -> Path:
    """A pod's root directory: short, for the unix socket paths below it."""
    return directory / "pods" / node / container


@dataclass
class LocalPod:
    name: str
    node: str
    ports: dict[str, int]  # container port name (or number) -> local port
    log: Path
    proc: subprocess.Popen[bytes]
    readiness: tuple[str, int] | None  # (path, local port) of the readiness probe
    obj: dict[str, Any]  # the Pod as created

    def log_tail(self, lines: int = 15) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else "(no log)"
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalPods:
    """Plays the Deployment and DaemonSet controllers and the kubelets of the chart's pods."""

    state: State
    api: Any
    detach: bool
    namespace: str = NAMESPACE

    @property
    def directory(self) -> Path:
        return Path(self.state.dir)

    def start(
        self,
        owner: dict[str, Any],
        pod_name: str,
        node: str,
        host_root: Path,
        *,
        ports: Mapping[str, int] | None = None,
    ) -> LocalPod:
        """Writes the Pod and starts its container as a local process. ``ports``: local
        ports to keep (by container port name) from the pod this one replaces, so what
        points at them (the webhook Service's endpoint) stays right."""
        template = owner["spec"]["template"]
        spec = template["spec"]
        (container,) = spec["containers"]
        pod = self._create_pod(owner, pod_name, node)
        kubeconfig = self._token_kubeconfig(pod, spec["serviceAccountName"])
        root = pod_root(self.directory, node, container["name"])
        self._mounts(root, spec, container, host_root)
        keep = ports or {}
        ports = {}
        for p in container.get("ports") or []:
            port_name = str(p.get("name") or p["containerPort"])
            ports[port_name] = keep.get(port_name) or free_port()
        by_number = {
            int(p["containerPort"]): ports[str(p.get("name") or p["containerPort"])]
            for p in container.get("ports") or []
        }
        fields = {
            "metadata.name": pod_name,
            "metadata.namespace": self.namespace,
            "spec.nodeName": node,
            "spec.serviceAccountName": spec["serviceAccountName"],
            "status.podIP": host_address(),
        }
        env: dict[str, str] = {}
        for entry in container.get("env") or []:
            if "valueFrom" in entry:
                value = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]
            else:  # the API server leaves an empty value out
                value = expand_vars(str(entry.get("value", "")), env)
            env[entry["name"]] = localize(value, root, by_number)
        argv = [
            localize(expand_vars(arg, env), root, by_number)
            for arg in [*(container.get("command") or []), *(container.get("args") or [])]
        ]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the image's interpreter: this environment's
        # The image's code: a release's tree where the state names one for the image, else
        # this checkout's (the import path the demo runs with).
        code = self.state.images.get(str(container.get("image")), os.environ.get("PYTHONPATH"))
        process_env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(root),
            "LANG": "C.UTF-8",
            **({"PYTHONPATH": code} if code else {}),
            **env,
            "KUBECONFIG": str(kubeconfig),
        }
        log = self.directory / "logs" / f"{pod_name}.log"
        proc = spawn(
            self.state, f"pod/{pod_name}", argv, log=log, env=process_env, cwd=root,
            detach=self.detach,
        )  # fmt: skip
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        readiness = None
        if probe:
            port = probe["port"]
            local = ports[str(port)] if str(port) in ports else by_number[int(port)]
            readiness = (str(probe["path"]), local)
        self.state.pods[pod_name] = {
            "kind": owner["kind"],
            "owner": owner["metadata"]["name"],
            "node": node,
            "host_root": str(host_root),
            "template": template_hash(template),
            "ports": ports,
        }
        self.state.save()
        return LocalPod(pod_name, node, ports, log, proc, readiness, pod)

    def sync(self) -> list[str]:
        """One pass of the local kubelet over the pods it started: restarts each whose
        owner's pod template changed (stop, then start: one replica on the same ports, where
        a cluster would surge a new one first), stops each whose owner is gone, and starts
        again one whose owner came back (its record stays, so it comes back on its node and
        ports). Returns a line per pod it acted on."""
        done = []
        for name, record in sorted(self.state.pods.items()):
            owner = self._owner(record)
            action = rollout(record["template"], owner, stopped=bool(record.get("stopped")))
            if action is Rollout.KEEP:
                continue
            old = self.state.processes.get(f"pod/{name}")
            stop_process(self.state, f"pod/{name}")
            what = f"pod {name}: {record['kind']} {record['owner']}"
            if owner is None:
                record["stopped"] = True
                self.state.save()
                done.append(f"{what} gone; pid {old} stopped")
                continue
            pod = self.start(
                owner, name, record["node"], Path(record["host_root"]), ports=record["ports"]
            )
            if action is Rollout.START:
                line = f"{what} back: pid {pod.proc.pid}"
            else:
                line = (
                    f"{what}'s pod template {record['template']} → "
                    f"{self.state.pods[name]['template']}: pid {old} → {pod.proc.pid}"
                )
            try:
                self.wait_ready(pod)
            except RuntimeError as exc:
                # Left as it is (not Ready; its log says why), as a cluster leaves a failed
                # rollout: its record has the new template, so only a next change restarts it.
                line += f", not ready: {exc}"
            done.append(line)
        return done

    def wait_ready(self, pod: LocalPod, timeout: float = 90.0) -> None:
        """Waits for the readiness probe to answer 200, then writes the pod Ready as its
        kubelet would."""
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while pod.readiness is not None:
            if pod.proc.poll() is not None:
                raise RuntimeError(
                    f"pod {pod.name} exited with {pod.proc.returncode}:\n{pod.log_tail()}"
                )
            path, port = pod.readiness
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
                    if r.status == 200:
                        break
            except urllib.error.HTTPError as exc:
                last = f"{path} answered {exc.code}"
            except OSError as exc:
                last = str(exc)
            if time.monotonic() > deadline:
                raise RuntimeError(f"pod {pod.name} not ready after {timeout:.0f} s: {last}")
            time.sleep(0.3)
        self._status(pod.obj, ready=True)

    # --- helpers -------------------------------------------------------------------------

    def _owner(self, record: Mapping[str, Any]) -> dict[str, Any] | None:
        """The pod's Deployment or DaemonSet now, or None when it is gone."""
        try:
            return installed(self.api, record["kind"], record["owner"], self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _create_pod(self, owner: dict[str, Any], pod_name: str, node: str) -> dict[str, Any]:
        core = client.CoreV1Api(self.api)
        template = owner["spec"]["template"]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": self.namespace,
                "labels": dict(template["metadata"].get("labels") or {}),
                "annotations": dict(template["metadata"].get("annotations") or {}),
                "ownerReferences": [
                    {
                        "apiVersion": owner["apiVersion"],
                        "kind": owner["kind"],
                        "name": owner["metadata"]["name"],
                        "uid": owner["metadata"]["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            # Bound to its node as the scheduler (or the DaemonSet controller) would.
            "spec": {**template["spec"], "nodeName": node},
        }
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(pod_name, self.namespace, grace_period_seconds=0)
        for _attempt in range(50):
            try:
                created: dict[str, Any] = self.api.sanitize_for_serialization(
                    core.create_namespaced_pod(self.namespace, body)
                )
                break
            except ApiException as exc:  # the earlier one is still going
                if exc.status != 409:
                    raise
                time.sleep(0.1)
        else:
            raise RuntimeError(f"pod {pod_name} from an earlier run does not go away")
        self._status(created, ready=False)
        return created

    def _status(self, pod: dict[str, Any], *, ready: bool) -> None:
        address = host_address()
        status = kubevirt.running_status(pod["spec"]["containers"], ready=ready)
        status.update({"podIP": address, "podIPs": [{"ip": address}], "hostIP": address})
        client.CoreV1Api(self.api).patch_namespaced_pod_status(
            pod["metadata"]["name"], self.namespace, {"status": status}
        )

    def _token_kubeconfig(self, pod: dict[str, Any], service_account: str) -> Path:
        """A kubeconfig with a token of ``service_account`` bound to ``pod``: the identity
        the pod's projected token volume would give it."""
        request = client.CoreV1Api(self.api).create_namespaced_service_account_token(
            service_account,
            self.namespace,
            {
                "spec": {
                    "expirationSeconds": TOKEN_SECONDS,
                    "boundObjectRef": {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    },
                }
            },
        )
        admin = yaml.safe_load(Path(self.state.kubeconfig).read_text())
        context = next(
            c["context"]
            for c in admin["contexts"]
            if c["name"] == admin.get("current-context", admin["contexts"][0]["name"])
        )
        server = next(c["cluster"] for c in admin["clusters"] if c["name"] == context["cluster"])
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "cluster", "cluster": server}],
            "users": [{"name": service_account, "user": {"token": request.status.token}}],
            "contexts": [
                {
                    "name": "pod",
                    "context": {
                        "cluster": "cluster",
                        "user": service_account,
                        "namespace": self.namespace,
                    },
                }
            ],
            "current-context": "pod",
        }
        node = str(pod["spec"]["nodeName"])
        path = self.directory / "pods" / node / f"{service_account}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _mounts(
        self, root: Path, spec: dict[str, Any], container: dict[str, Any], host_root: Path
    ) -> None:
        """The pod's root directory: each volume mount a link to the volume's source."""
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        volumes = {v["name"]: v for v in spec.get("volumes") or []}
        core = client.CoreV1Api(self.api)
        for mount in container.get("volumeMounts") or []:
            volume = volumes[mount["name"]]
            if "hostPath" in volume:
                source = host_root / volume["hostPath"]["path"].lstrip("/")
                if volume["hostPath"].get("type") == "Directory" and not source.is_dir():
                    raise RuntimeError(f"hostPath {source} of {mount['name']} is not a directory")
            elif "secret" in volume:
                source = root.parent / f"{root.name}.volumes" / mount["name"]
                shutil.rmtree(source, ignore_errors=True)
                source.mkdir(parents=True)
                secret = core.read_namespaced_secret(volume["secret"]["secretName"], self.namespace)
                for key, data in (secret.data or {}).items():
                    (source / key).write_bytes(base64.b64decode(data))
            elif "emptyDir" in volume:
                source = root.parent / f"{root.name}.volumes" / mount["name"]
                shutil.rmtree(source, ignore_errors=True)
                source.mkdir(parents=True)
            else:
                raise RuntimeError(f"volume {mount['name']}: only hostPath, secret, emptyDir")
            target = root / mount["mountPath"].lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source)


def local_pid(directory: Path, pod: str) -> int | None:
    """The pid of a local pod's process now (the local kubelet writes the state)."""
    state = State.load(directory)
    return None if state is None else state.processes.get(f"pod/{pod}")


def process_env(pid: int | None) -> dict[str, str]:
    """A local process's environment as it was started (empty once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)


def start_local_kubelet(state: State, *, detach: bool) -> int:
    """Starts the local kubelet process over the pods started so far; returns its pid. From
    then on it alone writes the state (the story starts no more pods)."""
    argv = [sys.executable, "-m", "cozystack_gpu_testkit.demo", "--dir", state.dir, "kubelet"]
    proc = spawn(
        state,
        LOCAL_KUBELET,
        [*argv, *(() if detach else ("--attached",))],
        log=Path(state.dir) / "logs" / f"{LOCAL_KUBELET}.log",
        detach=detach,
    )
    return proc.pid


def run_local_kubelet(directory: Path, *, detach: bool) -> None:
    """The local kubelet's loop (its own process, so it outlives ``make demo``): a
    :meth:`LocalPods.sync` pass every few seconds over the pods in the state, read again on
    each pass. It writes the state only when it restarts or stops a pod."""
    state = State.load(directory)
    if state is None:
        raise SystemExit(f"no demo in {directory}")
    api = admin_client(state.kubeconfig)
    log.info("following the pod templates of %s", ", ".join(sorted(state.pods)))
    while True:
        state = State.load(directory) or state
        try:
            for line in LocalPods(state, api, detach).sync():
                log.info("%s", line)
        except Exception as exc:  # the API server restarting, a pod that fails: next pass
            log.warning("pass failed: %s: %s", type(exc).__name__, exc)
        time.sleep(LOCAL_KUBELET_PERIOD)


_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand_vars(value: str, env: Mapping[str, str]) -> str:
    """kubelet's $(VAR) expansion of the container's own variables."""
    return _VAR.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def localize(value: str, root: Path, ports: Mapping[int, int]) -> str:
    """A container's path or port in an argument or variable, as the local process sees it."""
    flag, eq, rest = value.partition("=")
    if eq and flag.startswith("-") and rest.startswith("/"):
        return f"{flag}={root}{rest}"
    if value.startswith("/"):
        return f"{root}{value}"
    for container_port, local in ports.items():
        value = re.sub(rf"(?<![\d.]){container_port}(?!\d)", str(local), value)
    return value
