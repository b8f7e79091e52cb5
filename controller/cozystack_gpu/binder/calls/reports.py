"""What the binder keeps true beside placement and reports: finalizers, class and GPUNode
status, the settings ConfigMap, usage records and Events."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.calls import base
from cozystack_gpu.binder.calls.base import (
    Answer,
    Call,
    CallKey,
    Clients,
    Heard,
    Outcome,
    Priority,
    describe,
    discard,
    take_into,
)
from cozystack_gpu.binder.rules.events import EventBook, Told
from cozystack_gpu.cluster.view import ClusterView, Key
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Finalizer(Call):
    """A metadata merge patch (finalizers) on a claim or a class."""

    what: ClassVar[str] = "finalizer"
    priority: ClassVar[Priority] = Priority.BIND
    kind: keys.ApiKind
    namespace: str
    name: str
    body: MutableObj
    heard: Heard | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> CallKey:
        return (f"{self.what}/{self.kind.kind}", self.namespace, self.name)

    @staticmethod
    def key_of(kind: keys.ApiKind, key: Key) -> CallKey:
        return (f"{Finalizer.what}/{kind.kind}", *key)

    def request(self, api: Clients) -> MutableObj:
        kind = self.kind
        if kind.namespaced:
            return dict(
                api.custom.patch_namespaced_custom_object(
                    kind.group,
                    kind.version,
                    self.namespace,
                    kind.plural,
                    self.name,
                    self.body,
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )
        return dict(
            api.custom.patch_cluster_custom_object(
                kind.group,
                kind.version,
                kind.plural,
                self.name,
                self.body,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            # A conflict is the VMI webhook writing the same finalizer at attach time: the
            # next look finds it there.
            level = logging.DEBUG if answer.error.startswith("409") else logging.INFO
            log.log(level, "finalizer of %s %s not written: %s", self.kind.kind, self.path,
                    answer.error)  # fmt: skip
        take_into(view, self.kind, answer)


@dataclass(frozen=True)
class _ClusterStatus(Call):
    """The status of a cluster-scoped object of ours, as a merge patch."""

    takes: ClassVar[keys.ApiKind]
    priority: ClassVar[Priority] = Priority.STATUS
    supersedes: ClassVar[bool] = True  # a newer one says all an older one would
    name: str
    body: MutableObj
    namespace: str = ""

    def request(self, api: Clients) -> MutableObj:
        kind = self.takes
        return dict(
            api.custom.patch_cluster_custom_object_status(
                kind.group, kind.version, kind.plural, self.name, self.body,
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        )  # fmt: skip


@dataclass(frozen=True)
class ClassStatus(_ClusterStatus):
    """A GPUClass's status, whole."""

    what: ClassVar[str] = "class-status"
    takes: ClassVar[keys.ApiKind] = keys.GPU_CLASS


@dataclass(frozen=True)
class GpuNodeStatus(_ClusterStatus):
    """A GPUNode's conditions as the binder judges them."""

    what: ClassVar[str] = "gpunode-status"
    takes: ClassVar[keys.ApiKind] = keys.GPU_NODE
    heard: Heard | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Settings(Call):
    """The settings ConfigMap's data, written whole."""

    what: ClassVar[str] = "settings"
    priority: ClassVar[Priority] = Priority.STATUS
    supersedes: ClassVar[bool] = True
    namespace: str
    data: dict[str, str]
    name: str = keys.SETTINGS_CONFIGMAP
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        # The data written whole, the metadata left alone: the chart renders the ConfigMap
        # (the raw-name policy's binding refuses without it), and Helm's ownership labels
        # and annotations must survive, or the next `helm upgrade` could not adopt it; a key
        # someone added by hand goes (a merge patch would keep it). JSON Patch's add
        # replaces /data where it exists.
        try:
            api.core.patch_namespaced_config_map(
                self.name,
                self.namespace,
                [{"op": "add", "path": "/data", "value": self.data}],
                _content_type="application/json-patch+json",
                _request_timeout=base.REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            api.core.create_namespaced_config_map(
                self.namespace, self._created(), _request_timeout=base.REQUEST_TIMEOUT_S
            )

    def _created(self) -> MutableObj:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "cozystack-gpu-controller"},
            },
            "data": self.data,
        }

    def apply(self, answer: Answer, view: ClusterView) -> None:
        metrics.SETTINGS_WRITE_FAILING.set(0 if answer.ok else 1)


# --- usage records ----------------------------------------------------------------------


def _workloads(namespace: str) -> tuple[str, str, str, str]:
    return (keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, namespace, keys.WORKLOAD_PLURAL)


@dataclass(frozen=True)
class _RecordCall(Call):
    what: ClassVar[str] = "record"  # one write of a record at a time
    priority: ClassVar[Priority] = Priority.RECORD
    takes: ClassVar[keys.ApiKind] = keys.WORKLOAD  # written, or read again after a conflict
    write: ClassVar[str]  # the metric's label

    def apply(self, answer: Answer, view: ClusterView) -> None:
        """Every failed write of a record is logged and counted (the chart alerts on it):
        billing reads the records, and the next publish only tries again."""
        super().apply(answer, view)
        if answer.outcome is Outcome.FAILED:
            metrics.USAGE_RECORD_WRITE_FAILURES.labels(self.write).inc()
            log.warning(
                "usage record %s not written (%s): %s; tried again at the next publish",
                self.path,
                self.write,
                answer.error,
            )

    def _conflict(self, api: Clients, exc: ApiException) -> Answer:
        """Changed since it was read: the fresh record, so the view takes it and the next
        publish judges it again."""
        fresh = api.custom.get_namespaced_custom_object(
            *_workloads(self.namespace), self.name, _request_timeout=base.REQUEST_TIMEOUT_S
        )
        return Answer(self, Outcome.CONFLICT, dict(fresh), describe(exc))


@dataclass(frozen=True)
class RecordCreate(_RecordCall):
    """A claim's or a reservation's usage record; one there already (409) is brought by the
    watch."""

    write: ClassVar[str] = "create"
    done_when: ClassVar[frozenset[int]] = frozenset({409})
    namespace: str
    body: MutableObj

    @property
    def name(self) -> str:  # type: ignore[override]
        return str(self.body["metadata"]["name"])

    def request(self, api: Clients) -> MutableObj:
        obj = dict(
            api.custom.create_namespaced_custom_object(
                *_workloads(self.namespace), self.body, _request_timeout=base.REQUEST_TIMEOUT_S
            )
        )
        if "status" not in obj and "status" in self.body:
            # Where Workload has a status subresource, create drops the status.
            obj = dict(
                api.custom.patch_namespaced_custom_object_status(
                    *_workloads(self.namespace),
                    self.name,
                    {"status": self.body["status"]},
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )
        return obj


@dataclass(frozen=True)
class RecordStatus(_RecordCall):
    """A record's status written back (``body`` a merge patch carrying the resourceVersion
    read, so a change not yet seen answers 409 and the fresh record is judged again).
    Through the status subresource where the Workload CRD has one, else on the object."""

    write: ClassVar[str] = "status"
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj | Answer:
        args = (*_workloads(self.namespace), self.name)
        try:
            return dict(
                api.custom.patch_namespaced_custom_object_status(
                    *args, self.body, _request_timeout=base.REQUEST_TIMEOUT_S
                )
            )
        except ApiException as exc:
            if exc.status == 409:
                return self._conflict(api, exc)
            if exc.status != 404:
                raise
        # No status subresource (or the record is gone: this answers 404 too).
        try:
            return dict(
                api.custom.patch_namespaced_custom_object(
                    *args, self.body, _request_timeout=base.REQUEST_TIMEOUT_S
                )
            )
        except ApiException as again:
            if again.status == 409:
                return self._conflict(api, again)
            raise


@dataclass(frozen=True)
class RecordMeta(_RecordCall):
    """A record's annotations written back (a reservation's window and node): ``body`` a
    merge patch carrying the resourceVersion read, as ``RecordStatus``'s. On the object
    always: where the Workload CRD has a status subresource, a write there drops metadata."""

    write: ClassVar[str] = "metadata"
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj | Answer:
        try:
            return dict(
                api.custom.patch_namespaced_custom_object(
                    *_workloads(self.namespace),
                    self.name,
                    self.body,
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            if exc.status == 409:
                return self._conflict(api, exc)
            raise


@dataclass(frozen=True)
class RecordDelete(_RecordCall):
    """A record whose claim no longer holds units, or whose reservation's window is over;
    one gone already (404) is as good."""

    write: ClassVar[str] = "delete"
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    namespace: str
    name: str

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            *_workloads(self.namespace), self.name, _request_timeout=base.REQUEST_TIMEOUT_S
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        super().apply(answer, view)
        if answer.ok:
            view.forget(keys.WORKLOAD.kind, (self.namespace, self.name))


# --- Events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class EventWrite(Call):
    """An Event for people (``events``): created, or its count raised when the server has
    it; repeats told while this waits in the queue ride on it."""

    what: ClassVar[str] = "event"
    priority: ClassVar[Priority] = Priority.EVENT
    told: Told
    book: EventBook = field(compare=False, repr=False)

    @property
    def namespace(self) -> str:  # type: ignore[override]
        return self.told.namespace

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.told.name

    def request(self, api: Clients) -> None:
        told, book = self.told, self.book
        with told.sending:
            created = book.taken(told)
            if created and not self._patch(api):
                book.lost(told)
                created = False
            if not created:
                self._create(api)
            book.sent(told)

    def refused(self, exc: Exception, api: Clients) -> Answer:
        self.book.taken(self.told)  # a later repeat writes it again
        log.debug("event %s not written: %s", self.path, describe(exc))
        return super().refused(exc, api)

    def _create(self, api: Clients) -> None:
        try:
            # The answer is not decoded: skip building the client's Event model from it.
            discard(
                api.core.create_namespaced_event(
                    self.told.namespace,
                    self.book.create_body(self.told),
                    _preload_content=False,
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            # Written before by a request whose answer was lost: count it up instead.
            if exc.status != 409 or not self._patch(api):
                raise

    def _patch(self, api: Clients) -> bool:
        """Raise the count of an Event the server has; False when it has it no more."""
        try:
            discard(
                api.core.patch_namespaced_event(
                    self.told.name,
                    self.told.namespace,
                    self.book.patch_body(self.told),
                    _preload_content=False,
                    _request_timeout=base.REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
