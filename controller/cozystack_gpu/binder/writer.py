"""The binder's API writes, done by a few threads so round trips overlap.

Decisions stay serial in the binder loop; only the HTTP calls run here. Binds go before
everything else (a status condition on a waiting claim, an Event, a class status), so a
burst of refusals never delays a bind. Every job reports back to the loop through its queue.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.model import ClaimKey

log = logging.getLogger(__name__)


class Priority(IntEnum):
    BIND = 0  # placement changes: bind, move, lose, rebind, attach
    RECORD = 1  # usage records
    STATUS = 2  # class status, settings, waiting conditions
    EVENT = 3  # Events for people


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

    what: str
    name: str
    ok: bool
    obj: dict[str, Any] | None = None
    error: str = ""


class Writer:
    def __init__(self, api: client.ApiClient, results: queue.Queue[Any], workers: int) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self._results = results
        self._jobs: queue.PriorityQueue[tuple[int, int, Callable[[], None] | None]] = (
            queue.PriorityQueue()
        )
        self._seq = itertools.count()
        self._threads = [
            threading.Thread(target=self._work, name=f"writer-{i}", daemon=True)
            for i in range(workers)
        ]
        self.status_writes = 0  # claim status writes sent, for the benchmark's writes per bind

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
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

    def _submit(self, priority: Priority, job: Callable[[], None]) -> None:
        self._jobs.put((priority, next(self._seq), job))

    def _work(self) -> None:
        while True:
            _priority, _seq, job = self._jobs.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # one failed write must not kill a writer thread
                log.exception("write failed")

    # --- claims ------------------------------------------------------------------------

    def claim_status(
        self, key: ClaimKey, body: dict[str, Any], purpose: str, priority: Priority
    ) -> None:
        def job() -> None:
            self.status_writes += 1
            metrics.STATUS_WRITES.labels(purpose).inc()
            try:
                response = self.custom.patch_namespaced_custom_object_status(
                    keys.GROUP,
                    keys.VERSION,
                    key.namespace,
                    keys.PLURAL_CLAIMS,
                    key.name,
                    body,
                    _preload_content=False,
                )
                obj = json.loads(response.data)
                self._results.put(ClaimWriteDone(key, Outcome.WRITTEN, obj, purpose))
            except ApiException as exc:
                self._results.put(self._claim_failure(key, exc, purpose))

        self._submit(priority, job)

    def _claim_failure(self, key: ClaimKey, exc: ApiException, purpose: str) -> ClaimWriteDone:
        outcome = {409: Outcome.CONFLICT, 404: Outcome.GONE}.get(exc.status, Outcome.FAILED)
        if outcome is Outcome.GONE:
            return ClaimWriteDone(key, outcome, None, purpose)
        try:
            fresh = self.custom.get_namespaced_custom_object(
                keys.GROUP, keys.VERSION, key.namespace, keys.PLURAL_CLAIMS, key.name
            )
        except ApiException as again:
            if again.status == 404:
                return ClaimWriteDone(key, Outcome.GONE, None, purpose)
            fresh = None
        if outcome is Outcome.FAILED:
            log.warning("status write of claim %s failed: %s", key, exc.reason)
        return ClaimWriteDone(key, outcome, fresh, purpose, error=str(exc.reason))

    # --- classes, records, settings, events ---------------------------------------------

    def class_status(self, name: str, body: dict[str, Any]) -> None:
        def job() -> None:
            try:
                obj = self.custom.patch_cluster_custom_object_status(
                    keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name, body
                )
                self._results.put(WriteDone("class-status", name, True, obj))
            except ApiException as exc:
                self._results.put(WriteDone("class-status", name, False, error=str(exc.reason)))

        self._submit(Priority.STATUS, job)

    def create_record(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]

        def job() -> None:
            try:
                obj = self.custom.create_namespaced_custom_object(
                    keys.WORKLOAD_GROUP,
                    keys.WORKLOAD_VERSION,
                    namespace,
                    keys.WORKLOAD_PLURAL,
                    body,
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
                    )
                self._results.put(WriteDone("record", f"{namespace}/{name}", True, obj))
            except ApiException as exc:
                ok = exc.status == 409  # already there: the watch brings it
                self._results.put(
                    WriteDone("record", f"{namespace}/{name}", ok, error=str(exc.reason))
                )

        self._submit(Priority.RECORD, job)

    def delete_record(self, namespace: str, name: str) -> None:
        def job() -> None:
            try:
                self.custom.delete_namespaced_custom_object(
                    keys.WORKLOAD_GROUP,
                    keys.WORKLOAD_VERSION,
                    namespace,
                    keys.WORKLOAD_PLURAL,
                    name,
                )
                self._results.put(WriteDone("record-delete", f"{namespace}/{name}", True))
            except ApiException as exc:
                ok = exc.status == 404
                self._results.put(
                    WriteDone("record-delete", f"{namespace}/{name}", ok, error=str(exc.reason))
                )

        self._submit(Priority.RECORD, job)

    def delete_vmi(self, namespace: str, name: str) -> None:
        def job() -> None:
            try:
                self.custom.delete_namespaced_custom_object(
                    keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, name
                )
                log.info("deleted VMI %s/%s: its node is gone and it never ran", namespace, name)
                self._results.put(WriteDone("vmi-delete", f"{namespace}/{name}", True))
            except ApiException as exc:
                ok = exc.status == 404
                self._results.put(
                    WriteDone("vmi-delete", f"{namespace}/{name}", ok, error=str(exc.reason))
                )

        self._submit(Priority.BIND, job)

    def call(self, what: str, name: str, request: Callable[[], Any], priority: Priority) -> None:
        """Any other write the loop composes (a finalizer, a GPUNode condition): ``request``
        runs on a writer thread and its answer comes back as a WriteDone."""

        def job() -> None:
            try:
                answer = request()
                obj = answer if isinstance(answer, dict) else None
                self._results.put(WriteDone(what, name, True, obj))
            except ApiException as exc:
                self._results.put(WriteDone(what, name, False, error=f"{exc.status} {exc.reason}"))

        self._submit(priority, job)

    def settings(self, namespace: str, data: dict[str, str]) -> None:
        def job() -> None:
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
            try:
                try:
                    self.core.replace_namespaced_config_map(
                        keys.SETTINGS_CONFIGMAP, namespace, body
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    self.core.create_namespaced_config_map(namespace, body)
                self._results.put(WriteDone("settings", keys.SETTINGS_CONFIGMAP, True))
            except ApiException as exc:
                self._results.put(
                    WriteDone("settings", keys.SETTINGS_CONFIGMAP, False, error=str(exc.reason))
                )

        self._submit(Priority.STATUS, job)

    def event(self, claim_obj: dict[str, Any], reason: str, message: str, warning: bool) -> None:
        metadata = claim_obj.get("metadata") or {}

        def job() -> None:
            body = {
                "metadata": {
                    "generateName": f"{metadata.get('name')}.",
                    "namespace": metadata.get("namespace"),
                },
                "involvedObject": {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND_CLAIM,
                    "name": metadata.get("name"),
                    "namespace": metadata.get("namespace"),
                    "uid": metadata.get("uid"),
                },
                "reason": reason,
                "message": message[:1024],
                "type": "Warning" if warning else "Normal",
                "source": {"component": keys.FIELD_MANAGER_BINDER},
                "reportingComponent": keys.FIELD_MANAGER_BINDER,
                "count": 1,
            }
            try:
                # The answer is not read: skip building the client's Event model from it.
                self.core.create_namespaced_event(
                    str(metadata.get("namespace")), body, _preload_content=False
                ).release_conn()
            except ApiException as exc:
                log.debug("event for %s not written: %s", metadata.get("name"), exc.reason)

        self._submit(Priority.EVENT, job)
