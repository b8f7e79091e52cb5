"""A local control plane by hand, with KubeVirt's virt-api and virt-controller (what
``make cluster`` runs): the plane is ``cluster``'s, KubeVirt on it ``kubevirt``'s.

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
from cozystack_gpu_testkit.cluster import (
    CRD_DIR,
    DEFAULT_STATE_DIR,
    STOP_ORDER,
    ControlPlane,
    alive,
    binary_dir,
    kubevirt_crds,
    load_manifests,
    start,
    terminate,
)

# --- command line ----------------------------------------------------------------------


def _state_file(state_dir: Path) -> Path:
    return state_dir / "state.json"


def _cmd_up(args: argparse.Namespace) -> int:
    state_dir: Path = args.dir
    if _state_file(state_dir).exists():
        state = json.loads(_state_file(state_dir).read_text())
        if all(alive(pid) for pid in state["pids"].values()):
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
    plane = start(
        state_dir,
        bin_dir=bin_dir,
        detach=True,
        scheduler=full,
        controller_manager=full,
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
    }
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
    _print_env(state)
    return 0


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
    print(json.dumps({"server": state["server"], "alive": running}))
    return 0 if all(running.values()) else 1


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
