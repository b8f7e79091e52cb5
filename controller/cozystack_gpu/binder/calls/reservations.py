"""Reservation status writes: a booking, or why a reservation waits."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import ClassVar

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import (
    Answer,
    Call,
    Clients,
    Outcome,
    Priority,
    WriterStopped,
    describe,
    status_of,
)
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)

KIND = keys.GPU_RESERVATION


@dataclass(frozen=True)
class ReservationStatus(Call):
    """A status merge patch of a reservation, carrying the resourceVersion its body was
    built on: a reservation changed since answers 409, and comes back as it is now."""

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
            self.body,
            _preload_content=False,
            _request_timeout=base.REQUEST_TIMEOUT_S,
        )
        return dict(json.loads(response.data))

    def refused(self, exc: Exception, api: Clients) -> Answer:
        outcome = {409: Outcome.CONFLICT, 404: Outcome.GONE}.get(
            status_of(exc) or 0, Outcome.FAILED
        )
        if outcome is Outcome.GONE or isinstance(exc, WriterStopped):
            return Answer(self, outcome, error=describe(exc))
        if outcome is Outcome.FAILED:
            log.warning(
                "status write of reservation %s (%s) failed: %s; it is judged again",
                self.path,
                self.label,
                describe(exc),
            )
        try:
            fresh = api.custom.get_namespaced_custom_object(
                KIND.group,
                KIND.version,
                self.namespace,
                KIND.plural,
                self.name,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        except ApiException as again:
            if again.status == 404:
                return Answer(self, Outcome.GONE)
            fresh = None
        except Exception as again:  # the server is away: the watch brings it later
            log.debug("reservation %s not read again: %s", self.path, again)
            fresh = None
        return Answer(self, outcome, fresh, describe(exc), code=status_of(exc))
