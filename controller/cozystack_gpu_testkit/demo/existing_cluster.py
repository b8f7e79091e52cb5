"""What the demo makes in a cluster it did not start (``make demo CLUSTER=existing``): the
objects, each marked as the run's (``run_state.MARK``); the check before its first write that
none of them is there already; and their removal by ``make demo-down``, of what carries the
run's mark only."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.config.config_exception import ConfigException

from cozystack_gpu import keys
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.demo.run_state import MARK, NAMESPACE, RELEASE, State, admin_client
from cozystack_gpu_testkit.objects import unless
from cozystack_gpu_testkit.webhook_route import slice_name

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
