"""The binder's writes, one type per call.

A part builds a call (what to write, on which object) and hands it to the binder; the
writer's threads send it (``request``) at its ``priority`` and turn whatever happens into an
``Answer`` (``refused`` for an exception); the loop applies the answer to the view
(``apply``) and, where the part keeps books on it, tells the part whether it landed
(``heard``). So a part never holds an API client and never writes into the view, and a new
kind of write is one class here.

``key`` names the object a call writes: the loop counts the calls of a key that are out
(a part asks before writing it again), and a call whose type ``supersedes`` is dropped
unsent when a newer one of the same key is queued behind it: its body is stale and the
newer one says all it would have.

Every request carries ``REQUEST_TIMEOUT_S``, so a request the server never answers ends too.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, ClassVar, NamedTuple

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys, metrics
from cozystack_gpu.binder.events import EventBook, Told
from cozystack_gpu.cluster.informer import WRITE_TIMEOUT_S
from cozystack_gpu.cluster.view import ClusterView, Key
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import MutableObj

log = logging.getLogger(__name__)

# (connect, read) seconds of every request: the loops' write timeouts.
REQUEST_TIMEOUT_S = WRITE_TIMEOUT_S

CallKey = tuple[str, str, str]  # (what is written, namespace or "", name)


class Priority(IntEnum):
    BIND = 0  # placement changes: bind, move, lose, rebind, attach, the gate's pod updates
    RECORD = 1  # usage records
    STATUS = 2  # class status, settings, waiting conditions
    EVENT = 3  # Events for people


class Outcome(IntEnum):
    WRITTEN = 0
    CONFLICT = 1  # changed since it was read; ``obj`` is its fresh state when it could be read
    GONE = 2
    FAILED = 3
    SUPERSEDED = 4  # not sent: a newer call of the same key was queued behind it


class Clients(NamedTuple):
    """The API clients a call is sent with, in a writer thread: only calls hold them."""

    custom: client.CustomObjectsApi
    core: client.CoreV1Api

    @classmethod
    def of(cls, api: client.ApiClient) -> Clients:
        return cls(client.CustomObjectsApi(api), client.CoreV1Api(api))


class WriterStopped(Exception):
    """A call still queued when the writer stopped: not sent (this replica no longer leads)."""


@dataclass(frozen=True)
class Answer:
    """What became of one call; ``obj`` is the object as the server has it when known."""

    call: Call
    outcome: Outcome
    obj: MutableObj | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.WRITTEN


def describe(exc: BaseException) -> str:
    """A short, single-line account of a failed request for answers and logs."""
    if isinstance(exc, ApiException):
        return f"{exc.status} {exc.reason}"
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


def discard(response: Any) -> None:
    """Read the rest of an answer nobody needs, then give its connection back. A connection
    returned with unread bytes hands them to the next request on it as its answer (seen as
    a status write failing with the body of an Event)."""
    response.drain_conn()
    response.release_conn()


def _status(exc: Exception) -> int | None:
    return int(exc.status or 0) if isinstance(exc, ApiException) else None


Heard = Callable[[Answer], None]


class Call(ABC):
    """One write. Subclasses are frozen dataclasses with ``namespace`` and ``name``."""

    what: ClassVar[str]  # the first part of ``key``, and the name in logs
    priority: ClassVar[Priority]
    supersedes: ClassVar[bool] = False
    # API statuses that mean the write's goal holds already (a delete of what is gone).
    done_when: ClassVar[frozenset[int]] = frozenset()
    namespace: str
    name: str
    heard: Heard | None = None  # the sending part's bookkeeping, told after ``apply``

    @property
    def key(self) -> CallKey:
        return (self.what, self.namespace, self.name)

    @property
    def path(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @abstractmethod
    def request(self, api: Clients) -> MutableObj | Answer | None:
        """Send it: the object the server answered with (or an Answer of another outcome)."""

    def refused(self, exc: Exception, api: Clients) -> Answer:
        """What a request that raised comes to; never raises."""
        if _status(exc) in self.done_when:
            return Answer(self, Outcome.WRITTEN)
        return Answer(self, Outcome.FAILED, error=describe(exc))

    def apply(self, answer: Answer, view: ClusterView) -> None:  # noqa: B027 (a default)
        """What the answer changes in the view (run in the loop); nothing by default."""


def _take_into(view: ClusterView, kind: keys.ApiKind, answer: Answer) -> None:
    if answer.obj is not None:
        answer.obj.setdefault("kind", kind.kind)
        view.apply(kind.kind, answer.obj, deleted=False)


# --- claim status: decisions and notes -------------------------------------------------


@dataclass(frozen=True)
class _ClaimStatus(Call):
    """A status merge patch of a claim, carrying the resourceVersion its body was built on:
    a claim changed since answers 409, and the fresh claim comes back to be judged again."""

    namespace: str
    name: str
    body: MutableObj

    @property
    def claim(self) -> ClaimKey:
        return ClaimKey(self.namespace, self.name)

    @property
    @abstractmethod
    def label(self) -> str:
        """The purpose in metrics and logs."""

    def request(self, api: Clients) -> MutableObj:
        metrics.STATUS_WRITES.labels(self.label).inc()
        response = api.custom.patch_namespaced_custom_object_status(
            *_claims(self.namespace),
            self.name,
            self.body,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        return dict(json.loads(response.data))

    def refused(self, exc: Exception, api: Clients) -> Answer:
        outcome = {409: Outcome.CONFLICT, 404: Outcome.GONE}.get(_status(exc) or 0, Outcome.FAILED)
        if outcome is Outcome.GONE:
            return Answer(self, outcome)
        error = describe(exc)
        if isinstance(exc, WriterStopped):
            return Answer(self, outcome, error=error)
        if outcome is Outcome.FAILED:
            log.warning(
                "status write of claim %s (%s) failed: %s; it is judged again",
                self.path,
                self.label,
                error,
            )
        try:
            fresh = api.custom.get_namespaced_custom_object(
                *_claims(self.namespace), self.name, _request_timeout=REQUEST_TIMEOUT_S
            )
        except ApiException as again:
            if again.status == 404:
                return Answer(self, Outcome.GONE)
            fresh = None
        except Exception as again:  # the server is away: the watch brings the claim later
            log.debug("claim %s not read again: %s", self.path, again)
            fresh = None
        return Answer(self, outcome, fresh, error)

    def apply(self, answer: Answer, view: ClusterView) -> None:
        _take_into(view, keys.GPU_CLAIM, answer)  # written, or refused with it as it is now


def _claims(namespace: str) -> tuple[str, str, str, str]:
    return (keys.GPU_CLAIM.group, keys.GPU_CLAIM.version, namespace, keys.GPU_CLAIM.plural)


@dataclass(frozen=True)
class Decision(_ClaimStatus):
    """A placement (bind, move, lose, rebind, attach, detach, a rejected node): recorded in
    the snapshot when sent, and the claim held in flight until it is answered."""

    what: ClassVar[str] = "claim-decision"
    priority: ClassVar[Priority] = Priority.BIND
    step: str = ""

    @property
    def label(self) -> str:
        return self.step

    def apply(self, answer: Answer, view: ClusterView) -> None:
        super().apply(answer, view)
        if answer.outcome is Outcome.GONE:
            view.forget(keys.GPU_CLAIM.kind, self.claim)
        view.dirty.claims.add(self.claim)  # judged again on what the API now holds


class Note(StrEnum):
    """Status writes that only tell: not placements, so queued behind every bind and never
    held in flight."""

    WAIT = "Wait"  # why an order waits
    DELETING = "Deleting"  # why a claim's deletion waits
    PLACED = "Placed"  # where a VM's set starts, or why it cannot
    WITHDRAWN = "Withdrawn"  # its class is being deleted


@dataclass(frozen=True)
class ClaimNote(_ClaimStatus):
    """A condition that tells; a newer one of the same note on the claim replaces one
    still queued (it was built on a claim version the older would have changed)."""

    what: ClassVar[str] = "claim-note"
    priority: ClassVar[Priority] = Priority.STATUS
    supersedes: ClassVar[bool] = True
    note: Note = Note.WAIT
    heard: Heard | None = field(default=None, compare=False, repr=False)

    @property
    def key(self) -> CallKey:
        return (f"{self.what}/{self.note}", self.namespace, self.name)

    @property
    def label(self) -> str:
        return self.note.value


# --- the gate's writes -----------------------------------------------------------------


@dataclass(frozen=True)
class PodPin(Call):
    """The launcher pod's one update: pinned to the set's node and ungated (or only
    ungated), as a merge patch."""

    what: ClassVar[str] = "pod"
    priority: ClassVar[Priority] = Priority.BIND
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.core.patch_namespaced_pod(
                self.name,
                self.namespace,
                self.body,
                _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            ).json()
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            log.warning("launcher pod %s not updated: %s", self.path, answer.error)
        _take_into(view, keys.POD, answer)


@dataclass(frozen=True)
class PodDelete(Call):
    """A pinned launcher pod its node refused, deleted: only the very pod judged (its uid
    as a precondition); one gone or replaced since (404, 409) is as good."""

    what: ClassVar[str] = "pod"  # one update of a pod at a time, pin or delete
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404, 409})
    namespace: str
    name: str
    uid: str | None

    def request(self, api: Clients) -> None:
        discard(
            api.core.delete_namespaced_pod(
                self.name,
                self.namespace,
                body={"preconditions": {"uid": self.uid}},
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            log.warning("launcher pod %s not deleted: %s", self.path, answer.error)


@dataclass(frozen=True)
class TemplateClaimCreate(Call):
    """A VMI's template claim; one created before (409) is brought by the watch."""

    what: ClassVar[str] = "claim-create"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({409})
    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj:
        return dict(
            api.custom.create_namespaced_custom_object(
                *_claims(self.namespace), self.body, _request_timeout=REQUEST_TIMEOUT_S
            )
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            log.warning("template claim %s not created: %s", self.path, answer.error)
        _take_into(view, keys.GPU_CLAIM, answer)


# --- deletes of what is left over -------------------------------------------------------


@dataclass(frozen=True)
class VmiDelete(Call):
    """A VMI pinned to a node that is gone before it ever ran: deleted, the VM starts
    again elsewhere."""

    what: ClassVar[str] = "vmi-delete"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    namespace: str
    name: str
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            keys.VMI.group,
            keys.VMI.version,
            self.namespace,
            keys.VMI.plural,
            self.name,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        log.info("deleted VMI %s: its node is gone and it never ran", self.path)


@dataclass(frozen=True)
class ClaimDelete(Call):
    """A template claim whose VMI is gone, deleted: only the very one judged (its uid as a
    precondition), so a claim of the same name made since is not touched."""

    what: ClassVar[str] = "claim-delete"
    priority: ClassVar[Priority] = Priority.BIND
    done_when: ClassVar[frozenset[int]] = frozenset({404})
    namespace: str
    name: str
    uid: str
    why: str
    heard: Heard | None = field(default=None, compare=False, repr=False)

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            *_claims(self.namespace),
            self.name,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=self.uid)),
            _request_timeout=REQUEST_TIMEOUT_S,
        )
        log.info("deleted GPUClaim %s: %s", self.path, self.why)

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            log.warning("left-over template claim %s not deleted: %s", self.path, answer.error)


# --- what the binder keeps true beside placement ----------------------------------------


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
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        return dict(
            api.custom.patch_cluster_custom_object(
                kind.group,
                kind.version,
                kind.plural,
                self.name,
                self.body,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
        if not answer.ok:
            # A conflict is the VMI webhook writing the same finalizer at attach time: the
            # next look finds it there.
            level = logging.DEBUG if answer.error.startswith("409") else logging.INFO
            log.log(level, "finalizer of %s %s not written: %s", self.kind.kind, self.path,
                    answer.error)  # fmt: skip
        _take_into(view, self.kind, answer)


@dataclass(frozen=True)
class _ClusterStatus(Call):
    """The status of a cluster-scoped object of ours, as a merge patch."""

    kind: ClassVar[keys.ApiKind]
    priority: ClassVar[Priority] = Priority.STATUS
    supersedes: ClassVar[bool] = True  # a newer one says all an older one would
    name: str
    body: MutableObj
    namespace: str = ""

    def request(self, api: Clients) -> MutableObj:
        kind = self.kind
        return dict(
            api.custom.patch_cluster_custom_object_status(
                kind.group, kind.version, kind.plural, self.name, self.body,
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        )  # fmt: skip

    def apply(self, answer: Answer, view: ClusterView) -> None:
        _take_into(view, self.kind, answer)


@dataclass(frozen=True)
class ClassStatus(_ClusterStatus):
    """A GPUClass's status, whole."""

    what: ClassVar[str] = "class-status"
    kind: ClassVar[keys.ApiKind] = keys.GPU_CLASS


@dataclass(frozen=True)
class GpuNodeStatus(_ClusterStatus):
    """A GPUNode's conditions as the binder judges them."""

    what: ClassVar[str] = "gpunode-status"
    kind: ClassVar[keys.ApiKind] = keys.GPU_NODE
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
                _request_timeout=REQUEST_TIMEOUT_S,
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            api.core.create_namespaced_config_map(
                self.namespace, self._created(), _request_timeout=REQUEST_TIMEOUT_S
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

    def apply(self, answer: Answer, view: ClusterView) -> None:
        _take_into(view, keys.WORKLOAD, answer)  # written, or read again after a conflict


@dataclass(frozen=True)
class RecordCreate(_RecordCall):
    """A claim's usage record; one there already (409) is brought by the watch."""

    done_when: ClassVar[frozenset[int]] = frozenset({409})
    namespace: str
    body: MutableObj

    @property
    def name(self) -> str:  # type: ignore[override]
        return str(self.body["metadata"]["name"])

    def request(self, api: Clients) -> MutableObj:
        obj = dict(
            api.custom.create_namespaced_custom_object(
                *_workloads(self.namespace), self.body, _request_timeout=REQUEST_TIMEOUT_S
            )
        )
        if "status" not in obj and "status" in self.body:
            # Where Workload has a status subresource, create drops the status.
            obj = dict(
                api.custom.patch_namespaced_custom_object_status(
                    *_workloads(self.namespace),
                    self.name,
                    {"status": self.body["status"]},
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        return obj


@dataclass(frozen=True)
class RecordStatus(_RecordCall):
    """A record's status written back (``body`` a merge patch carrying the resourceVersion
    read, so a change not yet seen answers 409 and the fresh record is judged again).
    Through the status subresource where the Workload CRD has one, else on the object."""

    namespace: str
    name: str
    body: MutableObj

    def request(self, api: Clients) -> MutableObj | Answer:
        args = (*_workloads(self.namespace), self.name)
        try:
            return dict(
                api.custom.patch_namespaced_custom_object_status(
                    *args, self.body, _request_timeout=REQUEST_TIMEOUT_S
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
                    *args, self.body, _request_timeout=REQUEST_TIMEOUT_S
                )
            )
        except ApiException as again:
            if again.status == 409:
                return self._conflict(api, again)
            raise

    def _conflict(self, api: Clients, exc: ApiException) -> Answer:
        fresh = api.custom.get_namespaced_custom_object(
            *_workloads(self.namespace), self.name, _request_timeout=REQUEST_TIMEOUT_S
        )
        return Answer(self, Outcome.CONFLICT, dict(fresh), describe(exc))


@dataclass(frozen=True)
class RecordDelete(_RecordCall):
    """A record whose claim no longer holds units; one gone already (404) is as good."""

    done_when: ClassVar[frozenset[int]] = frozenset({404})
    namespace: str
    name: str

    def request(self, api: Clients) -> None:
        api.custom.delete_namespaced_custom_object(
            *_workloads(self.namespace), self.name, _request_timeout=REQUEST_TIMEOUT_S
        )

    def apply(self, answer: Answer, view: ClusterView) -> None:
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
                    _request_timeout=REQUEST_TIMEOUT_S,
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
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True
