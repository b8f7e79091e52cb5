"""A local control plane by hand, with KubeVirt's virt-api and virt-controller (what
``make cluster`` runs) and, where the machine can run one, a real node where pods run: the
plane is ``cluster``'s, KubeVirt on it ``kubevirt``'s, the node ``node``'s (detached: it
outlives this process, and ``down`` stops it before the plane).

    eval "$(python -m cozystack_gpu_testkit.local_cluster up)"   # prints export KUBECONFIG=...
    kubectl get gpuclasses
    python -m cozystack_gpu_testkit.local_cluster down
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit import node as node_kit
from cozystack_gpu_testkit.cluster import (
    CONTROLLERS,
    CRD_DIR,
    DEFAULT_STATE_DIR,
    STOP_ORDER,
    WORKLOAD_CONTROLLERS,
    ControlPlane,
    alive,
    binary_dir,
    kubevirt_crds,
    load_manifests,
    start,
    terminate,
)
from cozystack_gpu_testkit.node_host import NodeBusy

# --- command line ----------------------------------------------------------------------


def _state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def _cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.dir
    if _state_file(state_dir).exists():
        state: dict[str, Any] = json.loads(_state_file(state_dir).read_text())
        if all(alive(pid) for pid in _all_pids(state).values()):
            print(f"# already running at {state['server']}", file=sys.stderr)
            _print_env(state)
            return 0
        _cmd_down(args)
    if state_dir.exists():
        shutil.rmtree(state_dir)
    started = time.monotonic()
    full = not args.apiserver_only
    what = (
        "etcd, kube-apiserver, kube-scheduler, kube-controller-manager, virt-api and "
        "virt-controller"
    )
    print(f"# starting {what if full else 'etcd and kube-apiserver'}...", file=sys.stderr)
    bin_dir = binary_dir()
    crds = [] if args.no_crds else [*sorted(CRD_DIR.glob("*.yaml")), kubevirt_crds(bin_dir)]
    no_node = _why_no_node(args, bin_dir, full)
    plane = start(
        state_dir,
        bin_dir=bin_dir,
        detach=True,
        scheduler=full,
        controller_manager=full,
        controllers=WORKLOAD_CONTROLLERS if no_node is None else CONTROLLERS,
        crds=crds,
        # Webhook Services are reached at their endpoints (no kube-proxy here), so the
        # chart's webhooks can be served by a local process.
        extra_apiserver_args=("--enable-aggregator-routing=true",),
    )
    if crds:
        _hand_crds_to_helm(plane)
    if full and crds:
        # KubeVirt's own virt-api and virt-controller, so VirtualMachines start here as in
        # a cluster.
        kubevirt.start(plane)
    state = {
        "server": plane.server,
        "kubeconfig": str(plane.kubeconfig),
        "bin_dir": str(plane.bin_dir),
        "pids": plane.pids,
        "node": None,
    }
    _state_file(state_dir).write_text(json.dumps(state))
    if no_node is None:
        no_node = _start_node(plane, state, args.node == "yes")
        _state_file(state_dir).write_text(json.dumps(state))
    print(
        f"# kube-apiserver {plane.version()} ready at {plane.server} "
        f"in {time.monotonic() - started:.1f} s"
        + (
            " (with kube-scheduler, kube-controller-manager, virt-api and virt-controller)"
            if full
            else ""
        ),
        file=sys.stderr,
    )
    if no_node is not None:
        print(
            f"# no node: {no_node}. Pods stay Pending here; the chart can be installed "
            "with webhook.enabled=false and agent.enabled=false only",
            file=sys.stderr,
        )
    _print_env(state)
    return 0


def _why_no_node(args: argparse.Namespace, bin_dir: Path, full: bool) -> str | None:
    """Why no real node is started (None: one is), refusing when one was asked for."""
    if args.node == "no":
        return "not asked for (--node=no)"
    why = None
    if not full:
        why = "--apiserver-only runs no scheduler"
    else:
        try:
            node_kit.check_host(bin_dir)
        except node_kit.NodeError as exc:
            why = str(exc)
    if why is not None and args.node == "yes":
        raise SystemExit(f"local_cluster: a real node was asked for, but {why}")
    return why


def _start_node(plane: ControlPlane, state: dict[str, Any], required: bool) -> str | None:
    """A real node (containerd and kubelet) that outlives this process, untainted, so the
    scheduler places the chart's pods there as in a cluster; None when it runs, else why
    not (another real node holds this machine's lock, in ``auto``)."""
    started = time.monotonic()
    try:
        node = node_kit.start(
            plane, name="local-node", taints=(), detach=True, lock_timeout=0 if not required else 60
        )
    except NodeBusy as exc:
        if required:
            raise
        return str(exc)
    state["node"] = node.state()
    print(
        f"# real node {node.name} Ready in {time.monotonic() - started:.1f} s: containerd "
        f"and kubelet, pods run there. Images: {node_kit.import_hint(node)}; it is no GPU "
        "host: label it and give the agent a fixture sysfs tree (docs/install.md)",
        file=sys.stderr,
    )
    return None


def _all_pids(state: dict[str, Any]) -> dict[str, int]:
    node = state.get("node") or {}
    return {**state["pids"], **{f"node/{k}": v for k, v in (node.get("pids") or {}).items()}}


# The release `helm install cozystack-gpu controller/chart -n cozy-gpu` makes (README).
CHART_RELEASE = ("cozystack-gpu", "cozy-gpu")


def _hand_crds_to_helm(plane: ControlPlane) -> None:
    hand_crds_to_helm(plane.api_client(), *CHART_RELEASE)


def hand_crds_to_helm(api: Any, release: str, namespace: str) -> None:
    """Mark the gpu CRDs (those installed) as the chart release's, so a later `helm install`
    of the chart into this plane adopts them instead of refusing objects it does not own."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    installed = {c.metadata.name for c in ext.list_custom_resource_definition().items}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for crd in load_manifests(path):
            if crd["metadata"]["name"] not in installed:
                continue
            ext.patch_custom_resource_definition(
                crd["metadata"]["name"],
                {
                    "metadata": {
                        "labels": {"app.kubernetes.io/managed-by": "Helm"},
                        "annotations": {
                            "meta.helm.sh/release-name": release,
                            "meta.helm.sh/release-namespace": namespace,
                        },
                    }
                },
            )


def _print_env(state: dict[str, Any]) -> None:
    print(f"export KUBECONFIG={state['kubeconfig']}")
    print(f"export PATH={state['bin_dir']}:$PATH")


def _cmd_down(args: argparse.Namespace) -> int:
    path = _state_file(args.dir)
    if not path.exists():
        print("# no local control plane is running", file=sys.stderr)
        return 0
    state = json.loads(path.read_text())
    if state.get("node"):
        # Before the plane: the node's pods are deleted while kube-apiserver runs.
        plane = ControlPlane(
            workdir=args.dir,
            bin_dir=Path(state["bin_dir"]),
            server=state["server"],
            kubeconfig=Path(state["kubeconfig"]),
            ca_file=args.dir / "pki" / "ca.crt",
            client_cert=args.dir / "pki" / "admin.crt",
            client_key=args.dir / "pki" / "admin.key",
            pids=dict(state["pids"]),
            detach=True,
        )
        try:
            node_kit.stop_detached(plane, state["node"])
        except node_kit.NodeError as exc:
            print(f"# {exc}", file=sys.stderr)
    for name in STOP_ORDER:
        pid = state["pids"].get(name)
        if pid:
            terminate(pid, None, 10.0)
    shutil.rmtree(args.dir, ignore_errors=True)
    print("# stopped", file=sys.stderr)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    path = _state_file(args.dir)
    if not path.exists():
        print("not running")
        return 1
    state = json.loads(path.read_text())
    running = {name: alive(pid) for name, pid in state["pids"].items()}
    node = state.get("node")
    node_running = {n: alive(p) for n, p in node["pids"].items()} if node else {}
    print(json.dumps({"server": state["server"], "alive": running, "node": node_running}))
    return 0 if all(running.values()) and all(node_running.values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cozystack-gpu-cluster", description="A real local Kubernetes control plane."
    )
    parser.add_argument("--dir", type=Path, default=DEFAULT_STATE_DIR, help="state directory")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start etcd, kube-apiserver, kube-scheduler, kube-controller-manager and "
        "KubeVirt's virt-api and virt-controller and print export lines",
    )
    up.add_argument(
        "--no-crds", action="store_true", help="do not install the gpu and KubeVirt CRDs"
    )
    up.add_argument(
        "--apiserver-only",
        action="store_true",
        help="start only etcd and kube-apiserver (no scheduler, no controller-managers)",
    )
    up.add_argument(
        "--node",
        choices=("auto", "yes", "no"),
        default="auto",
        help="a real node (containerd and kubelet, no GPU) where pods run: auto starts one "
        "where this machine can (root, `make binaries`, no other real node), yes refuses "
        "to go on without it",
    )
    sub.add_parser("down", help="stop them and remove the state directory")
    sub.add_parser("status", help="say whether they run")
    args = parser.parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "up": _cmd_up,
        "down": _cmd_down,
        "status": _cmd_status,
    }
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
