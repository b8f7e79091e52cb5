"""One replica of the controller: a Lease decides whether its binder runs.

Every replica is cheap and stateless apart from the Lease; only the leader watches the
cluster into a snapshot and binds. When the Lease is lost the binder is stopped at once, and
a new leader starts from a fresh listing.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from kubernetes import client

from cozystack_gpu import metrics
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.config import Config
from cozystack_gpu.keys import LEASE_NAME_BINDER
from cozystack_gpu.leader import LeaderElector, LeaseTiming

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, api: client.ApiClient, config: Config) -> None:
        self.api = api
        self.config = config
        self._lock = threading.Lock()
        self.binder: Binder | None = None
        self.elector = LeaderElector(
            api,
            namespace=config.namespace,
            name=LEASE_NAME_BINDER,
            identity=config.identity,
            timing=LeaseTiming(config.lease_duration, config.renew_deadline, config.retry_period),
            on_started=self._start_binding,
            on_stopped=self._stop_binding,
        )

    def start(self) -> None:
        self.elector.start()

    def stop(self) -> None:
        self.elector.stop(release=True)
        self._stop_binding()

    def _start_binding(self) -> None:
        with self._lock:
            if self.binder is not None:
                return
            metrics.LEADER.set(1)
            self.binder = Binder(self.api, self.config, is_leader=self.elector.is_leader)
            self.binder.start()
            log.info("%s leads: binder started", self.config.identity)

    def _stop_binding(self) -> None:
        with self._lock:
            binder, self.binder = self.binder, None
            metrics.LEADER.set(0)
        if binder is not None:
            binder.stop()
            log.info("%s stopped binding", self.config.identity)

    def health(self) -> dict[str, Any]:
        binder = self.binder
        return {
            "leader": self.elector.is_leader(),
            "synced": bool(binder and binder.synced.is_set()),
        }
