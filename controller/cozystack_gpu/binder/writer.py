"""The binder's API writes, done by a few threads so round trips overlap.

Decisions stay serial in the binder loop; only the HTTP calls run here. Binds go before
everything else (a status condition on a waiting claim, an Event, a class status), so a
burst of refusals never delays a bind.

Every job reports back to the loop through its queue, whatever happens to the request: the
loop holds a claim "in flight" until its write reports, and a claim held for ever blocks
every later plan that would touch it. So an API answer, a broken connection (urllib3's
``MaxRetryError``, ``ProtocolError``), a timeout and a bug alike end in a result, and every
request carries a timeout so one the server never answers ends too.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.events import EventBook, Told
from cozystack_gpu.cluster.informer import WRITE_TIMEOUT_S
from cozystack_gpu.model import ClaimKey

log = logging.getLogger(__name__)

# (connect, read) seconds of every request: the loops' write timeouts.
REQUEST_TIMEOUT_S = WRITE_TIMEOUT_S
# After a request that did not reach the server (or a 429/5xx), a worker pauses before its
# next job, doubling up to the maximum: while the server restarts, the loop's re-decided
# writes are not fired at it in a tight loop. Any answer resets the pause.
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0


class Priority(IntEnum):
    BIND = 0  # placement changes: bind, move, lose, rebind, attach
    RECORD = 1  # usage records
    STATUS = 2  # class status, settings, waiting conditions
    EVENT = 3  # Events for people


class WriteKind(StrEnum):
    """Every kind of write the binder sends besides claim status (``claim_status``), as its
    answer names it: who hears the answer is routed by this."""

    CLASS_STATUS = "class-status"
    RECORD = "record"
    RECORD_DELETE = "record-delete"
    FINALIZER = "finalizer"  # a finalizer patch on a claim or a class (``object_kind``)
    GPUNODE_STATUS = "gpunode-status"
    SETTINGS = "settings"
    POD_PIN = "pod-pin"
    POD_DELETE = "pod-delete"
    TEMPLATE_CLAIM = "template-claim"
    VMI_DELETE = "vmi-delete"
    CLAIM_DELETE = "claim-delete"  # a template claim whose VMI is gone
    EVENT = "event"


# How soon each kind goes out: placement first, Events for people last.
PRIORITY: dict[WriteKind, Priority] = {
    WriteKind.FINALIZER: Priority.BIND,
    WriteKind.POD_PIN: Priority.BIND,
    WriteKind.POD_DELETE: Priority.BIND,
    WriteKind.TEMPLATE_CLAIM: Priority.BIND,
    WriteKind.VMI_DELETE: Priority.BIND,
    WriteKind.CLAIM_DELETE: Priority.BIND,
    WriteKind.RECORD: Priority.RECORD,
    WriteKind.RECORD_DELETE: Priority.RECORD,
    WriteKind.CLASS_STATUS: Priority.STATUS,
    WriteKind.GPUNODE_STATUS: Priority.STATUS,
    WriteKind.SETTINGS: Priority.STATUS,
    WriteKind.EVENT: Priority.EVENT,
}


class Outcome(IntEnum):
    WRITTEN = 0
    CONFLICT = 1  # the claim changed since the decision; ``obj`` is its fresh state
    GONE = 2
    FAILED = 3


@dataclass(frozen=True)
class ClaimWriteDone:
    """A claim status write finished; ``obj`` is the claim as the server has it now."""

    key: ClaimKey
    outcome: Outcome
    obj: dict[str, Any] | None
    purpose: str
    error: str = ""


@dataclass(frozen=True)
class WriteDone:
    """Any other write finished (class status, record, settings, event)."""

    what: WriteKind
    namespace: str  # "" for a cluster-scoped object
    name: str
    ok: bool
    obj: dict[str, Any] | None = None
    error: str = ""
    object_kind: str = ""  # the kind a finalizer patch was written on

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def path(self) -> str:
        """``namespace/name`` (or ``name``), for logs."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass(frozen=True)
class _Job:
    """One write: ``run`` sends it and returns what to report; ``failed`` turns an exception
    into what to report instead, and never raises."""

    run: Callable[[], ClaimWriteDone | WriteDone]
    failed: Callable[[Exception], ClaimWriteDone | WriteDone]


class WriterStopped(Exception):
    """A job still queued when the writer stopped: not sent (this replica no longer leads)."""


def discard(response: Any) -> None:
    """Read the rest of an answer nobody needs, then give its connection back. A connection
    returned with unread bytes hands them to the next request on it as its answer (seen as
    a status write failing with the body of an Event)."""
    response.drain_conn()
    response.release_conn()


def describe(exc: BaseException) -> str:
    """A short, single-line account of a failed request for results and logs."""
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def _transient(exc: BaseException) -> bool:
    """The server was not reached, or asked us to slow down."""
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        return status == 429 or status >= 500
    return True


class Writer:
    def __init__(
        self,
        api: client.ApiClient,
        results: queue.Queue[Any],
        workers: int,
        may_send: Callable[[], bool] = lambda: True,
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._results = results
        # Asked before every request: a replica whose leadership ended sends nothing it had
        # queued, even before the binder is stopped (that waits for the elector's thread).
        self._may_send = may_send
        self._jobs: queue.PriorityQueue[tuple[int, int, _Job | None]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._stopped = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"writer-{i}", daemon=True)
            for i in range(workers)
        ]
        # The reporting instance of its Events: this replica, by its hostname (the pod's
        # name in a cluster, as the Lease identity defaults to) unless told otherwise.
        self.events = EventBook(instance or socket.gethostname())
        self._clock = clock
        self.status_writes = 0  # claim status writes sent, for the benchmark's writes per bind

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Ends the workers; jobs still queued report ``WriterStopped`` without being sent.

        The binder stops when this replica stops leading, and a replica that does not lead
        must not write: the next leader decides again from what the API server holds.
        """
        self._stopped.set()
        for _thread in self._threads:
            # None sorts after every job of the same priority; the highest number ends last.
            self._jobs.put((Priority.EVENT + 1, next(self._seq), None))
        for thread in self._threads:
            thread.join(timeout=5)

    @property
    def threads(self) -> tuple[threading.Thread, ...]:
        return tuple(self._threads)

    def pending(self) -> int:
        return self._jobs.qsize()

    def _submit(
        self,
        priority: Priority,
        run: Callable[[], ClaimWriteDone | WriteDone],
        failed: Callable[[Exception], ClaimWriteDone | WriteDone],
    ) -> None:
        self._jobs.put((priority, next(self._seq), _Job(run, failed)))

    def _work(self) -> None:
        pause = 0.0
        while True:
            _priority, _seq, job = self._jobs.get()
            if job is None:
                return
            if self._stopped.is_set():
                self._results.put(job.failed(WriterStopped("the writer stopped")))
                continue
            if not self._may_send():
                self._results.put(job.failed(WriterStopped("this replica no longer leads")))
                continue
            try:
                result = job.run()
                pause = 0.0
            except Exception as exc:  # an answer, a broken connection, a timeout or a bug
                result = job.failed(exc)
                if _transient(exc):
                    pause = min(max(pause * 2, BACKOFF_FIRST_S), BACKOFF_MAX_S)
                else:
                    pause = 0.0
            self._results.put(result)
            if pause:
                self._stopped.wait(pause)

    def call(
        self,
        what: WriteKind,
        namespace: str,
        name: str,
        request: Callable[[], Any],
        *,
        object_kind: str = "",
    ) -> None:
        """Any other write: ``request`` sends it (with ``_request_timeout=REQUEST_TIMEOUT_S``)
        and its answer, when a dict, comes back as the ``WriteDone``'s ``obj``; it goes out at
        its kind's priority (``PRIORITY``)."""

        def run() -> WriteDone:
            answer = request()
            obj = answer if isinstance(answer, dict) else None
            return WriteDone(what, namespace, name, True, obj, object_kind=object_kind)

        def failed(exc: Exception) -> WriteDone:
            return WriteDone(
                what, namespace, name, False, error=describe(exc), object_kind=object_kind
            )

        self._submit(PRIORITY[what], run, failed)

    # --- claims ------------------------------------------------------------------------

    def claim_status(
        self, key: ClaimKey, body: dict[str, Any], purpose: str, priority: Priority
    ) -> None:
        def run() -> ClaimWriteDone:
            self.status_writes += 1
            metrics.STATUS_WRITES.labels(purpose).inc()
            response = self.custom.patch_namespaced_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                key.namespace,
                keys.PLURAL_CLAIMS,
                key.name,
                body,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            obj = json.loads(response.data)
            return ClaimWriteDone(key, Outcome.WRITTEN, obj, purpose)

        def failed(exc: Exception) -> ClaimWriteDone:
            return self._claim_failure(key, exc, purpose)

        self._submit(priority, run, failed)

    def _claim_failure(self, key: ClaimKey, exc: Exception, purpose: str) -> ClaimWriteDone:
        """What the loop hears of a claim write that did not succeed: conflict, gone or failed,
        with the claim as the server has it now when it can still be read."""
        outcome = Outcome.FAILED
        if isinstance(exc, ApiException):
            outcome = {409: Outcome.CONFLICT, 404: Outcome.GONE}.get(exc.status, Outcome.FAILED)
        if outcome is Outcome.GONE:
            return ClaimWriteDone(key, outcome, None, purpose)
        error = describe(exc)
        if outcome is Outcome.FAILED and not isinstance(exc, WriterStopped):
            log.warning(
                "status write of claim %s/%s (%s) failed: %s; it is judged again",
                key.namespace,
                key.name,
                purpose,
                error,
            )
        fresh: dict[str, Any] | None = None
        if not isinstance(exc, WriterStopped):
            try:
                fresh = self.custom.get_namespaced_custom_object(
                    keys.GROUP,
                    keys.VERSION,
                    key.namespace,
                    keys.PLURAL_CLAIMS,
                    key.name,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            except ApiException as again:
                if again.status == 404:
                    return ClaimWriteDone(key, Outcome.GONE, None, purpose)
            except Exception as again:  # the server is away: the watch brings the claim later
                log.debug("claim %s/%s not read again: %s", key.namespace, key.name, again)
        return ClaimWriteDone(key, outcome, fresh, purpose, error=error)

    # --- classes, records, settings, events ---------------------------------------------

    def class_status(self, name: str, body: dict[str, Any]) -> None:
        def run() -> WriteDone:
            obj = self.custom.patch_cluster_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                keys.PLURAL_CLASSES,
                name,
                body,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            return WriteDone(WriteKind.CLASS_STATUS, "", name, True, obj)

        def failed(exc: Exception) -> WriteDone:
            return WriteDone(WriteKind.CLASS_STATUS, "", name, False, error=describe(exc))

        self._submit(PRIORITY[WriteKind.CLASS_STATUS], run, failed)

    def create_record(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]

        def run() -> WriteDone:
            obj = self.custom.create_namespaced_custom_object(
                keys.WORKLOAD_GROUP,
                keys.WORKLOAD_VERSION,
                namespace,
                keys.WORKLOAD_PLURAL,
                body,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            if "status" not in obj and "status" in body:
                # Where Workload has a status subresource, create drops the status.
                obj = self.custom.patch_namespaced_custom_object_status(
                    keys.WORKLOAD_GROUP,
                    keys.WORKLOAD_VERSION,
                    namespace,
                    keys.WORKLOAD_PLURAL,
                    name,
                    {"status": body["status"]},
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            return WriteDone(WriteKind.RECORD, namespace, name, True, obj)

        def failed(exc: Exception) -> WriteDone:
            # Already there: the watch brings it.
            ok = isinstance(exc, ApiException) and exc.status == 409
            return WriteDone(WriteKind.RECORD, namespace, name, ok, error=describe(exc))

        self._submit(PRIORITY[WriteKind.RECORD], run, failed)

    def record_status(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        """Write a record's status back (``body`` a merge patch carrying the resourceVersion
        read, so a change not yet seen answers 409 and is judged again). Through the status
        subresource where the Workload CRD has one, else on the object itself."""
        args = (keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, namespace, keys.WORKLOAD_PLURAL, name)

        def run() -> WriteDone:
            try:
                obj = self.custom.patch_namespaced_custom_object_status(
                    *args, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            except ApiException as exc:
                if exc.status == 409:
                    return conflict(exc)
                if exc.status != 404:
                    raise
                # No status subresource (or the record is gone: this answers 404 too).
                try:
                    obj = self.custom.patch_namespaced_custom_object(
                        *args, body, _request_timeout=REQUEST_TIMEOUT_S
                    )
                except ApiException as again:
                    if again.status == 409:
                        return conflict(again)
                    raise
            return WriteDone(WriteKind.RECORD, namespace, name, True, obj)

        def conflict(exc: ApiException) -> WriteDone:
            # Changed since it was read: the fresh record goes into the view, judged again.
            fresh = self.custom.get_namespaced_custom_object(
                *args, _request_timeout=REQUEST_TIMEOUT_S
            )
            return WriteDone(WriteKind.RECORD, namespace, name, False, fresh, describe(exc))

        def failed(exc: Exception) -> WriteDone:
            return WriteDone(WriteKind.RECORD, namespace, name, False, error=describe(exc))

        self._submit(PRIORITY[WriteKind.RECORD], run, failed)

    def delete_record(self, namespace: str, name: str) -> None:
        def run() -> WriteDone:
            self.custom.delete_namespaced_custom_object(
                keys.WORKLOAD_GROUP,
                keys.WORKLOAD_VERSION,
                namespace,
                keys.WORKLOAD_PLURAL,
                name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            return WriteDone(WriteKind.RECORD_DELETE, namespace, name, True)

        def failed(exc: Exception) -> WriteDone:
            ok = isinstance(exc, ApiException) and exc.status == 404
            return WriteDone(WriteKind.RECORD_DELETE, namespace, name, ok, error=describe(exc))

        self._submit(PRIORITY[WriteKind.RECORD_DELETE], run, failed)

    def delete_vmi(self, namespace: str, name: str) -> None:
        def run() -> WriteDone:
            self.custom.delete_namespaced_custom_object(
                keys.VMI.group,
                keys.VMI.version,
                namespace,
                keys.VMI.plural,
                name,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            log.info("deleted VMI %s/%s: its node is gone and it never ran", namespace, name)
            return WriteDone(WriteKind.VMI_DELETE, namespace, name, True)

        def failed(exc: Exception) -> WriteDone:
            ok = isinstance(exc, ApiException) and exc.status == 404
            return WriteDone(WriteKind.VMI_DELETE, namespace, name, ok, error=describe(exc))

        self._submit(PRIORITY[WriteKind.VMI_DELETE], run, failed)

    def delete_claim(self, namespace: str, name: str, uid: str, why: str) -> None:
        """Delete a claim, only the very one judged (its uid as a precondition): a claim of
        the same name made since is not touched."""

        def run() -> WriteDone:
            self.custom.delete_namespaced_custom_object(
                keys.GROUP,
                keys.VERSION,
                namespace,
                keys.PLURAL_CLAIMS,
                name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _request_timeout=REQUEST_TIMEOUT_S,
            )
            log.info("deleted GPUClaim %s/%s: %s", namespace, name, why)
            return WriteDone(WriteKind.CLAIM_DELETE, namespace, name, True)

        def failed(exc: Exception) -> WriteDone:
            ok = isinstance(exc, ApiException) and exc.status == 404
            return WriteDone(WriteKind.CLAIM_DELETE, namespace, name, ok, error=describe(exc))

        self._submit(PRIORITY[WriteKind.CLAIM_DELETE], run, failed)

    def settings(self, namespace: str, data: dict[str, str]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": keys.SETTINGS_CONFIGMAP,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "cozystack-gpu-controller"},
            },
            "data": data,
        }

        def run() -> WriteDone:
            # The data written whole, the metadata left alone: the chart renders the
            # ConfigMap (the raw-name policy's binding refuses without it), and Helm's
            # ownership labels and annotations must survive, or the next `helm upgrade`
            # could not adopt it; a key someone added by hand goes (a merge patch would
            # keep it). JSON Patch's add replaces /data where it exists.
            try:
                self.core.patch_namespaced_config_map(
                    keys.SETTINGS_CONFIGMAP,
                    namespace,
                    [{"op": "add", "path": "/data", "value": data}],
                    _content_type="application/json-patch+json",
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self.core.create_namespaced_config_map(
                    namespace, body, _request_timeout=REQUEST_TIMEOUT_S
                )
            return WriteDone(WriteKind.SETTINGS, "", keys.SETTINGS_CONFIGMAP, True)

        def failed(exc: Exception) -> WriteDone:
            return WriteDone(
                WriteKind.SETTINGS, "", keys.SETTINGS_CONFIGMAP, False, error=describe(exc)
            )

        self._submit(PRIORITY[WriteKind.SETTINGS], run, failed)

    def event(
        self,
        obj: dict[str, Any],
        reason: str,
        message: str,
        warning: bool,
        kind: keys.ApiKind = keys.GPU_CLAIM,
    ) -> None:
        """An Event for people about ``obj`` (a claim unless ``kind`` says otherwise); a
        repeat raises the count of the Event already written (see ``events``)."""
        told, needs_write = self.events.tell(obj, kind, reason, message, warning, self._clock())
        if not needs_write:
            return  # the write still queued for this Event carries the repeat
        metadata = obj.get("metadata") or {}
        name = f"{metadata.get('namespace')}/{metadata.get('name')}"

        def run() -> WriteDone:
            with told.sending:
                created = self.events.taken(told)
                if created and not self._patch_event(told):
                    self.events.lost(told)
                    created = False
                if not created:
                    self._create_event(told)
                self.events.sent(told)
            return WriteDone(WriteKind.EVENT, "", name, True)

        def failed(exc: Exception) -> WriteDone:
            self.events.taken(told)  # a later repeat writes it again
            log.debug("event for %s not written: %s", name, describe(exc))
            return WriteDone(WriteKind.EVENT, "", name, False, error=describe(exc))

        self._submit(PRIORITY[WriteKind.EVENT], run, failed)

    def _create_event(self, told: Told) -> None:
        try:
            # The answer is not decoded: skip building the client's Event model from it.
            discard(
                self.core.create_namespaced_event(
                    told.namespace,
                    self.events.create_body(told),
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            # Written before by a request whose answer was lost: count it up instead.
            if exc.status != 409 or not self._patch_event(told):
                raise

    def _patch_event(self, told: Told) -> bool:
        """Raise the count of an Event the server has; False when it has it no more."""
        try:
            discard(
                self.core.patch_namespaced_event(
                    told.name,
                    told.namespace,
                    self.events.patch_body(told),
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
