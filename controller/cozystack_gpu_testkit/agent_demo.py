"""The node agent against the local control plane, on a fixture node, in one command.

    eval "$(python -m cozystack_gpu_testkit.cluster up)"
    python -m cozystack_gpu_testkit.agent_demo            # --scenario mixed by default
    kubectl get gpunodes -o yaml

It builds a sysfs fixture tree (:mod:`.sysfs_tree`), creates the Node object if it is
missing (there is no kubelet to register it), serves a fake kubelet pod-resources socket
advertising what kubevirt-gpu-device-plugin would for that tree (:mod:`.fake_kubelet`), and
runs the real agent (``python -m cozystack_gpu.agent``) once against them; ``--watch`` keeps
it running (Ctrl-C stops both). The API server is the one ``$KUBECONFIG`` names.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_tree
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cozystack_gpu_testkit.agent_demo")
    parser.add_argument("--scenario", default="mixed", choices=sorted(sysfs_tree.SCENARIOS))
    parser.add_argument("--node", default="demo-gpu-node")
    parser.add_argument("--dir", type=Path, default=Path(".cache/agent-demo"))
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    parser.add_argument("--watch", action="store_true", help="keep the agent running")
    args = parser.parse_args(argv)
    if not args.kubeconfig:
        parser.error('no $KUBECONFIG: run eval "$(python -m cozystack_gpu_testkit.cluster up)"')

    root = args.dir / "root"
    shutil.rmtree(root, ignore_errors=True)
    sysfs_tree.SCENARIOS[args.scenario](root)
    ensure_node(args.kubeconfig, args.node)
    socket_path = args.dir / "pod-resources" / "kubelet.sock"
    kubelet = FakeKubelet(str(socket_path))
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(root))))
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
        "--poll",
        "2",
    ]
    if not args.watch:
        command.append("--once")
    print(
        f"# sysfs fixture '{args.scenario}' at {root}; fake kubelet at {socket_path}",
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
