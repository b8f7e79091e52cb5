"""Entry point: ``python -m cozystack_gpu`` (or ``cozystack-gpu-controller``).

kopf runs the operator: start-up and clean-up, the liveness probe, and the admission
webhooks of every replica (``cozystack_gpu.admission``); the readiness probe (``/readyz``,
ready once the webhooks' feed has read the cluster) is a server of its own. The binder
starts only in the replica that holds the Lease.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import Any

import kopf
from kubernetes import client
from kubernetes import config as kube_config

from cozystack_gpu import config as settings
from cozystack_gpu.admission import handlers as admission  # registers the webhook handlers
from cozystack_gpu.admission.readiness import ReadinessServer
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.controller import Controller
from cozystack_gpu.metrics_server import MetricsServer

log = logging.getLogger("cozystack_gpu")


def api_client(kubeconfig: str | None = None, *, user_agent: str = "") -> client.ApiClient:
    """In-cluster credentials when running in a pod, else a kubeconfig; ``user_agent``
    names the caller in the API server's audit log."""
    configuration = client.Configuration()
    if kubeconfig is None:
        try:
            kube_config.load_incluster_config(client_configuration=configuration)
        except kube_config.ConfigException:
            kube_config.load_kube_config(client_configuration=configuration)
    else:
        kube_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    # The binder's writers and informers share one pool; the default of 4 would queue them.
    configuration.connection_pool_maxsize = 32
    api = client.ApiClient(configuration)
    if user_agent:
        api.user_agent = user_agent
    return api


def user_agent(identity: str, part: str) -> str:
    """Like kube-controller-manager's: program/version, then who and which part asks."""
    return f"cozystack-gpu-controller/{version()} ({identity}) {part}"


class JSONFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry)


@kopf.on.startup()
def _startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.peering.standalone = True
    settings.posting.level = logging.WARNING
    identity = memo.config.identity
    # One listing and watch per kind for the whole process, read by the admission feed of
    # every replica and by the binder of the leader.
    informers = SharedInformers(
        api_client(memo.kubeconfig, user_agent=user_agent(identity, "informers"))
    )
    memo.informers = informers
    informers.start()
    controller = Controller(
        api_client(memo.kubeconfig, user_agent=user_agent(identity, "binder")),
        memo.config,
        informers,
    )
    memo.controller = controller
    controller.start()
    # Every replica serves the webhooks, with its own client: the binder's writes never
    # hold up an admission answer.
    admission.start(
        api_client(memo.kubeconfig, user_agent=user_agent(identity, "admission")),
        memo.config,
        settings,
        memo,
        informers,
    )


@kopf.on.cleanup()
def _cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller = memo.get("controller")
    if controller is not None:
        controller.stop()
    webhooks = memo.get("admission")
    if webhooks is not None:
        webhooks.stop()
    informers = memo.get("informers")
    if informers is not None:
        informers.stop()


@kopf.on.probe(id="binder")
def _binder_probe(memo: kopf.Memo, **_: Any) -> dict[str, Any]:
    """The liveness answer: 200 with the replica's state, or 500 when a part of it is dead.

    kopf serves what probe handlers return as 200 whatever it says; only a handler that
    fails permanently makes its endpoint answer 500 (any other exception is retried and
    the probe hangs).
    """
    controller = memo.get("controller")
    if controller is None:
        return {"leader": False, "synced": False, "problems": []}
    health: dict[str, Any] = controller.health()
    if health["problems"]:
        raise kopf.PermanentError(
            "unhealthy: " + "; ".join(health["problems"]) + " (this replica no longer leads)"
        )
    return health


def version() -> str:
    """The installed package's version (the image and the chart's appVersion carry it)."""
    try:
        return metadata.version("cozystack-gpu-controller")
    except metadata.PackageNotFoundError:
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="cozystack-gpu-controller",
        description="GPU claims binder (leader only) for cozystack.gpu",
    )
    parser.add_argument("--version", action="version", version=version())
    settings.add_arguments(parser)
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default: in-cluster)")
    parser.add_argument("--health-port", type=int, default=8080, help="port of /healthz (0: off)")
    parser.add_argument(
        "--ready-port",
        type=int,
        default=8081,
        help="port of /readyz: 200 once this replica has read the cluster (0: off)",
    )
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    args = parser.parse_args(argv)
    try:
        config = settings.from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    handler = logging.StreamHandler()
    if args.log_format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    if config.metrics_port:
        # HTTPS with the webhooks' key pair; each scraper's token is reviewed by the API
        # server (the inventory in the metrics is the hoster's, not the tenants').
        MetricsServer(
            api_client(args.kubeconfig, user_agent=user_agent(config.identity, "metrics")),
            config.webhook_cert_dir,
            config.metrics_port,
        )
    if args.kubeconfig:
        # kopf logs in on its own (its watches, the webhook server's self-check) from the
        # standard sources: KUBECONFIG makes it use the same file as our own client.
        os.environ["KUBECONFIG"] = args.kubeconfig
    memo = kopf.Memo(config=config, kubeconfig=args.kubeconfig)
    # Not ready (503) from the start until the webhooks' feed has read the cluster.
    ready = (
        ReadinessServer(args.ready_port, lambda: admission.not_ready(memo.get("admission")))
        if args.ready_port
        else None
    )
    if ready is not None:
        ready.start()
    try:
        kopf.run(
            clusterwide=True,
            standalone=True,
            liveness_endpoint=(
                f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None
            ),
            memo=memo,
        )
    finally:
        if ready is not None:
            ready.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
