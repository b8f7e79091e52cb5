"""Entry point: ``python -m cozystack_gpu`` (or ``cozystack-gpu-controller``).

The process's cache and the binder start first (the binder binds only in the replica that
holds the Lease, and keeps its snapshot warm in the others); once the binder has made its
first pass, or the election says another replica leads, kopf and the webhooks are imported
and kopf runs them (``cozystack_gpu.operator``): the admission webhooks of every
replica, the liveness probe and the clean-up. The readiness probe (``/readyz``, ready once
the webhooks' feed has read the cluster and their port answers) is a server of its own.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from importlib import metadata

from kubernetes import client
from kubernetes import config as kube_config

from cozystack_gpu import config as settings
from cozystack_gpu.cluster.discovery import resolve_dra
from cozystack_gpu.cluster.gc_freeze import SurvivorFreezer
from cozystack_gpu.cluster.informer import SharedInformers
from cozystack_gpu.controller import Controller
from cozystack_gpu.metrics_server import MetricsServer

log = logging.getLogger("cozystack_gpu")

STARTING_POLL_S = 0.02  # how often the start looks whether kopf's part may be imported
# The kubernetes client's module of typed core calls (cluster/list_calls.py says why late).
CORE_CALLS = "kubernetes.client.api.core_v1_api"


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


def version() -> str:
    """The installed package's version (the image and the chart's appVersion carry it)."""
    try:
        return metadata.version("cozystack-gpu-controller")
    except metadata.PackageNotFoundError:
        return "unknown"


def _arguments(argv: Sequence[str] | None) -> tuple[argparse.Namespace, settings.Config]:
    """The command line, and the settings it makes (an invalid one ends the process with
    argparse's usage message)."""
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
        help="port of /readyz: 200 once this replica has read the cluster and its webhooks "
        "listen (0: off)",
    )
    parser.add_argument("--log-format", choices=("json", "text"), default="json")
    args = parser.parse_args(argv)
    try:
        config = settings.from_arguments(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args, config


def _log_to_stderr(log_format: str) -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])


def main(argv: Sequence[str] | None = None) -> int:
    args, config = _arguments(argv)
    _log_to_stderr(args.log_format)
    identity = config.identity
    # Before the first listing: each full collection from here on walks only what came
    # after the last one, not the whole cache again (see gc_freeze).
    SurvivorFreezer().start()
    # One listing and watch per kind for the whole process, read by the admission feed of
    # every replica and by the binder; the binder first, so that a new leader's first bind
    # waits on neither kopf's import nor the webhooks'.
    informers_api = api_client(args.kubeconfig, user_agent=user_agent(identity, "informers"))
    config = resolve_dra(informers_api, config)
    informers = SharedInformers(informers_api)
    informers.start()
    controller = Controller(
        api_client(args.kubeconfig, user_agent=user_agent(identity, "binder")),
        config,
        informers,
    )
    controller.start()
    if config.metrics_port:
        # HTTPS with the webhooks' key pair; each scraper's token is reviewed by the API
        # server (the inventory in the metrics is the hoster's, not the tenants').
        MetricsServer(
            api_client(args.kubeconfig, user_agent=user_agent(identity, "metrics")),
            config.webhook_cert_dir,
            config.metrics_port,
        )
    # Imported here, not at the top, and only once the binder has made its first pass and
    # its first bind is answered, or this replica is known to stand by, FEED_WAIT_S
    # at most: kopf's and the webhooks' import is about 0.5 s of CPU, which would share the
    # interpreter with the binder's first listing and pass. Its liveness probe answers from
    # then on (the chart's probe waits 10 s before its first try).
    while not controller.first_pass_or_standby():
        time.sleep(STARTING_POLL_S)
    # The typed core calls (Events, pods, Secrets) are imported now as well, at a moment of
    # our choosing, not by the first write that needs one: that import held the interpreter
    # for 0.4 s in the middle of binding, and a burst of orders arriving close to the
    # binder's rate never caught up with the lag it left (BENCHMARKS.md, issue 30).
    importlib.import_module(CORE_CALLS)
    import kopf  # pylint: disable=import-outside-toplevel

    from cozystack_gpu import operator  # pylint: disable=import-outside-toplevel
    from cozystack_gpu.admission.readiness import (  # pylint: disable=import-outside-toplevel
        ReadinessServer,
    )

    if args.kubeconfig:
        # kopf logs in on its own (its watches, the webhook server's self-check) from the
        # standard sources: KUBECONFIG makes it use the same file as our own client.
        os.environ["KUBECONFIG"] = args.kubeconfig
    memo = kopf.Memo()
    # Not ready (503) from the start until the webhooks' feed has read the cluster and
    # their server listens.
    ready = (
        ReadinessServer(args.ready_port, lambda: operator.not_ready(memo))
        if args.ready_port
        else None
    )
    if ready is not None:
        ready.start()
    try:
        operator.run(
            config,
            args.kubeconfig,
            informers,
            controller,
            api_client(args.kubeconfig, user_agent=user_agent(identity, "admission")),
            args.health_port,
            memo,
        )
    finally:
        if ready is not None:
            ready.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
