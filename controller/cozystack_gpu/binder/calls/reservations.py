"""Reservation status writes: a booking, or why a reservation waits."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import ClassVar

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import (
    Answer,
    Call,
    Clients,
    Priority,
    refused_and_read_again,
)
from cozystack_gpu.binder.calls.claims import fenced
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)

KIND = keys.GPU_RESERVATION


@dataclass(frozen=True)
class ReservationStatus(Call):
    """A status merge patch of a reservation, carrying the resourceVersion its body was
    built on: a reservation changed since answers 409, and comes back as it is now. It is
    fenced by the binder's Lease as a claim's status write is (``claims.fenced``): a late
    booking of an overtaken leader is refused by the API server."""

    what: ClassVar[str] = "reservation-status"
    priority: ClassVar[Priority] = Priority.BIND
    takes: ClassVar[keys.ApiKind] = KIND  # written, or as it is now after a refusal
    namespace: str
    name: str
    body: MutableObj
    label: str = "book"

    def request(self, api: Clients) -> MutableObj:
        metrics.STATUS_WRITES.labels(self.label).inc()
        response = api.custom.patch_namespaced_custom_object_status(
            KIND.group,
            KIND.version,
            self.namespace,
            KIND.plural,
            self.name,
            fenced(self.body, api.term()),
            _preload_content=False,
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )
        return dict(json.loads(response.data))

    def refused(self, exc: Exception, api: Clients) -> Answer:
        def read() -> object:
            return api.custom.get_namespaced_custom_object(
                KIND.group, KIND.version, self.namespace, KIND.plural, self.name,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )  # fmt: skip

        return refused_and_read_again(self, exc, read, self.label)
