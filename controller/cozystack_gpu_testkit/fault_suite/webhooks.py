"""The admission webhooks' side of a run: their Service on loopback, forwarding to one
replica (``Service``), and the chart's webhook configurations for it (``WebhookSetup``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cozystack_gpu_testkit.fault_suite.run import Run
from cozystack_gpu_testkit.proxy import Proxy


class Service:
    """The webhooks' Service on loopback: a port the API server calls, forwarding to one
    replica's webhook server. ``down`` leaves it without an endpoint (connections are
    refused, as for a Service whose pods are not ready); ``up`` brings the endpoint back.
    It carries what the chart's configurations name: ``namespace``, ``port``, ``ca_pem``."""

    def __init__(self, run: Run, identity: str) -> None:
        self.namespace = run.namespace
        self.ca_pem = run.webhook_ca.cert_pem
        self._target = ("127.0.0.1", run.webhook_ports[identity])
        self._proxy = Proxy(self._target, name="service")
        self.port = self._proxy.port
        self.serving = identity

    def down(self) -> None:
        self._proxy.stop()

    def up(self) -> None:
        self._proxy = Proxy(self._target, port=self.port, name="service")

    def move_to(self, run: Run, identity: str) -> None:
        """The endpoint becomes another replica's, as a Service's would when the pod it
        routed to died."""
        self.down()
        self._target = ("127.0.0.1", run.webhook_ports[identity])
        self.up()
        self.serving = identity


@dataclass(frozen=True)
class WebhookSetup:
    """The chart's webhook configurations for a Service, and how to put them in place and
    take them away (the admission tests render them: ``admission_env``)."""

    configurations: Callable[[Service], list[dict[str, Any]]]
    install: Callable[[Any, list[dict[str, Any]]], None]
    remove: Callable[[Any, list[dict[str, Any]]], None]
