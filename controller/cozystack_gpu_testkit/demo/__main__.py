"""``python -m cozystack_gpu_testkit.demo up|down``: the entry points of ``make demo`` and
``make demo-down`` (and ``kubelet``, the local kubelet process ``up`` starts)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.demo import (
    existing_cluster,
    local_pods,
    node_pods,
    platform,
    run_state,
    story,
)
from cozystack_gpu_testkit.demo.console import DemoFailure

DEFAULT_DIR = cluster.DEFAULT_STATE_DIR.parent / "demo"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m cozystack_gpu_testkit.demo")
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the demo's directory")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="run the demo and leave its cluster up")
    up.add_argument(
        "--quiet", action="store_true", help="check every act without showing kubectl tables"
    )
    up.add_argument(
        "--existing-cluster",
        action="store_true",
        help="run on the cluster $KUBECONFIG names (make demo CLUSTER=existing) instead of a "
        "local control plane of its own; without it $KUBECONFIG is ignored",
    )
    up.add_argument(
        "--node",
        choices=node_pods.CHOICES,
        default="auto",
        help="the controller's pods on a real node (containerd and kubelet): auto where this "
        "machine can run one (root, `make binaries`, no other real node), yes refuses to go "
        "on without one, no runs the controller as a local process",
    )
    sub.add_parser("down", help="stop what the demo started and remove its directory")
    kubelet = sub.add_parser(
        "kubelet",
        help="(started by `up`) restart the chart's local pods when their pod templates change",
    )
    kubelet.add_argument(
        "--attached", action="store_true", help="the pods it restarts die with it (tests)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    directory: Path = args.dir.absolute()
    if args.command == "down":
        return platform.down(directory)
    if args.command == "kubelet":
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
        local_pods.run_local_kubelet(directory, detach=not args.attached)
        return 0

    if run_state.State.load(directory) is not None:
        print(f"# an earlier demo in {directory}: stopping it first", flush=True)
        platform.down(directory)
    try:
        kubeconfig, notice = existing_cluster.chosen_cluster(
            os.environ.get("KUBECONFIG") or None, existing=args.existing_cluster
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if kubeconfig:
        # Before anything is written: what is there already is not the demo's to change,
        # nor, at `make demo-down`, to delete.
        try:
            found = existing_cluster.already_there(kubeconfig, str(cluster.binary_dir()))
        except RuntimeError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if found:
            print(f"error: {existing_cluster.refusal(kubeconfig, found)}", file=sys.stderr)
            return 2
    if notice:
        print("\n".join(notice), flush=True)
    if kubeconfig and sys.stdout.isatty():
        print("Starting in 10 s; Ctrl-C stops it.", flush=True)
        try:
            time.sleep(10)
        except KeyboardInterrupt:
            print("\n# not started", flush=True)
            return 130
    try:
        down = (
            "make demo-down"
            if directory == DEFAULT_DIR.absolute()
            else f"python -m cozystack_gpu_testkit.demo --dir {directory} down"
        )
        demo = story.prepare(
            story.Options(
                dir=directory,
                kubeconfig=kubeconfig,
                show=not args.quiet,
                down_command=down,
                node=args.node,
            )
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        story.play(demo)
    except DemoFailure as failure:
        story.fail(demo, failure)
        return 1
    except KeyboardInterrupt:
        print("\n# interrupted: `make demo-down` stops what the demo started", flush=True)
        return 130
    story.finish(demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
