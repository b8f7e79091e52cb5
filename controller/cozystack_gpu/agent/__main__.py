"""``python -m cozystack_gpu.agent``: the node agent (the controller image's DaemonSet mode).

    python -m cozystack_gpu.agent --node NAME --sysfs-root / \\
        --pod-resources-socket /var/lib/kubelet/pod-resources/kubelet.sock

The Kubernetes API is reached in-cluster, or through ``--kubeconfig`` / ``$KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import tempfile
import threading
from importlib import metadata
from typing import Any

from cozystack_gpu.agent.podresources import DEFAULT_SOCKET, PodResourcesClient
from cozystack_gpu.agent.runner import Agent, serve
from cozystack_gpu.agent.writer import GPUNodeWriter, PodPhases
from cozystack_gpu.metrics_server import MetricsServer, self_signed

log = logging.getLogger("cozystack_gpu.agent")


def agent_version() -> str:
    try:
        return metadata.version("cozystack-gpu-controller")
    except metadata.PackageNotFoundError:
        return "unknown"


def api_client(kubeconfig: str | None) -> Any:
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # its loaders carry no annotations
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    return config.new_client_from_config(config_file=kubeconfig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m cozystack_gpu.agent", description=__doc__)
    parser.add_argument(
        "--node", default=os.environ.get("NODE_NAME"), help="this node ($NODE_NAME)"
    )
    parser.add_argument("--sysfs-root", default="/", help="root that holds sys/ (host's /)")
    parser.add_argument("--pod-resources-socket", default=DEFAULT_SOCKET)
    parser.add_argument(
        "--pci-ids", action="append", help="pci.ids to try first (repeatable; below the root first)"
    )
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--period", type=float, default=60.0, help="write at least this often (s)")
    parser.add_argument("--poll", type=float, default=5.0, help="look for changes this often (s)")
    parser.add_argument("--listen", default="0.0.0.0:8080", help="/healthz, /readyz (host:port)")
    parser.add_argument(
        "--metrics-listen",
        default="0.0.0.0:8443",
        help="/metrics over HTTPS, for a bearer token allowed get on /metrics (host:port; "
        "port 0: off)",
    )
    parser.add_argument(
        "--metrics-cert-dir",
        default="",
        help="tls.crt and tls.key of /metrics (empty: a self-signed pair made at start)",
    )
    parser.add_argument("--once", action="store_true", help="write once and exit")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("--node (or $NODE_NAME) is required")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    api = api_client(args.kubeconfig)
    kubelet = PodResourcesClient(args.pod_resources_socket)
    agent = Agent(
        sysfs_root=args.sysfs_root,
        kubelet=kubelet,
        writer=GPUNodeWriter(api, args.node),
        phases=PodPhases(api, args.node),
        pci_ids_paths=args.pci_ids,
        period=args.period,
        poll=args.poll,
        version=agent_version(),
    )
    if args.once:
        result = agent.tick(force=True)
        log.info("GPUNode %s: %s", args.node, result.reason)
        return 0 if result.written else 1
    host, _colon, port = args.listen.rpartition(":")
    server = serve(agent, host or "0.0.0.0", int(port))
    metrics_host, _colon, metrics_port = args.metrics_listen.rpartition(":")
    metrics = None
    # A self-signed pair lives only as long as this process: removed on the way out.
    own_cert_dir: tempfile.TemporaryDirectory[str] | None = None
    if int(metrics_port):
        cert_dir = args.metrics_cert_dir
        if not cert_dir:
            own_cert_dir = tempfile.TemporaryDirectory(prefix="agent-metrics-")
            cert_dir = self_signed(own_cert_dir.name, f"cozystack-gpu-agent.{args.node}")
        metrics = MetricsServer(
            api,
            cert_dir,
            int(metrics_port),
            addr=metrics_host or "0.0.0.0",
            registry=agent.metrics.registry,
        )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    log.info(
        "agent for node %s, sysfs %s, kubelet %s", args.node, args.sysfs_root, kubelet.socket_path
    )
    try:
        agent.run(stop)
    finally:
        server.shutdown()
        if metrics is not None:
            metrics.stop()
        if own_cert_dir is not None:
            own_cert_dir.cleanup()
        kubelet.close()
    # A part of the agent ended on its own: exit non-zero so kubelet restarts the agent.
    return 1 if agent.failure else 0


if __name__ == "__main__":
    sys.exit(main())
