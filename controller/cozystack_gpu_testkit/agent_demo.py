"""The node agent against the local control plane, on a fixture node, in one command.

    eval "$(python -m cozystack_gpu_testkit.local_cluster up)"
    python -m cozystack_gpu_testkit.agent_demo            # --scenario mixed by default
    kubectl get gpunodes -o yaml

It builds a sysfs fixture tree (:mod:`.sysfs_tree`), or takes one built before
(``--root``), creates the Node object if it is missing (there is no kubelet to register it),
serves a fake kubelet pod-resources socket advertising what kubevirt-gpu-device-plugin would
for that tree (:mod:`.fake_kubelet`), and runs the real agent (``python -m
cozystack_gpu.agent``) once against them; ``--watch`` keeps it running (Ctrl-C stops both).
``--kubelet-status`` also writes the Node's status as its kubelet would: Ready, and those
devices as allocatable (tests and molecule scenarios stand a fixture host up this way). The
API server is the one ``$KUBECONFIG`` names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_scenarios
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices


def ensure_node(kubeconfig: str | None, name: str) -> None:
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException

    api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
    try:
        api.read_node(name)
    except ApiException as exc:
        if exc.status != 404:
            raise
        api.create_node({"metadata": {"name": name, "labels": {"demo": "cozystack-gpu-agent"}}})
        print(f"# created Node {name}", file=sys.stderr)


def write_kubelet_status(kubeconfig: str | None, name: str, devices: dict[str, list[str]]) -> None:
    """The Node's status as its kubelet reports it: Ready, each resource's devices."""
    from kubernetes import config

    from cozystack_gpu_testkit.objects import Kube

    kube = Kube(config.new_client_from_config(config_file=kubeconfig))
    kube.node_status(name, allocatable={r: len(ids) for r, ids in devices.items()}, ready=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cozystack_gpu_testkit.agent_demo")
    parser.add_argument("--scenario", default="mixed", choices=sorted(sysfs_scenarios.SCENARIOS))
    parser.add_argument("--node", default="demo-gpu-node")
    parser.add_argument("--dir", type=Path, default=Path(".cache/agent-demo"))
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--watch", action="store_true", help="keep the agent running")
    parser.add_argument("--root", type=Path, help="an existing fixture tree (no --scenario)")
    parser.add_argument(
        "--kubelet-status",
        action="store_true",
        help="also write the Node's status as kubelet would: Ready, the devices allocatable",
    )
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error(
            'no $KUBECONFIG: run eval "$(python -m cozystack_gpu_testkit.local_cluster up)"'
        )

    if args.root is not None:
        root = args.root
    else:
        root = args.dir / "root"
        shutil.rmtree(root, ignore_errors=True)
        sysfs_scenarios.SCENARIOS[args.scenario](root)
    ensure_node(args.kubeconfig, args.node)
    devices = plugin_devices(sysfs.read_inventory(str(root)))
    if args.kubelet_status:
        write_kubelet_status(args.kubeconfig, args.node, devices)
    socket_path = args.dir / "pod-resources" / "kubelet.sock"
    kubelet = FakeKubelet(str(socket_path))
    kubelet.set(allocatable=devices)
    kubelet.start()
    command = [
        sys.executable,
        "-m",
        "cozystack_gpu.agent",
        "--node",
        args.node,
        "--sysfs-root",
        str(root),
        "--pod-resources-socket",
        str(socket_path),
        "--kubeconfig",
        args.kubeconfig,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
        "--poll",
        "2",
    ]
    if not args.watch:
        command.append("--once")
    print(
        f"# sysfs fixture {root}; fake kubelet at {socket_path}",
        file=sys.stderr,
    )
    try:
        code = subprocess.call(command)
    except KeyboardInterrupt:
        code = 0
    finally:
        kubelet.stop()
    if code == 0:
        print(
            f"# GPUNode {args.node} written: kubectl get gpunodes {args.node} -o yaml",
            file=sys.stderr,
        )
    return code


if __name__ == "__main__":
    sys.exit(main())
