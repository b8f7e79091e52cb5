"""The base of the binder's typed writes: a call, its answer, its priority, the API clients
it is sent with, and what every call shares (see the package's docstring)."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any, ClassVar

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.cluster.informer import WRITE_TIMEOUT_S
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.leader import Term
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


# Methods that change what the API server holds: each carries the write deadline.
_WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class DeadlineApiClient(client.ApiClient):  # type: ignore[misc]  # the client is untyped
    """An API client whose every write tells the API server how long it may take: a write
    not done within ``deadline_s`` of reaching the server is abandoned there (504) and never
    done later (the server's ``timeout`` parameter, as kubectl's --request-timeout sends it).

    Without it, a write sent while etcd is away waits inside kube-apiserver until etcd is
    back, up to the server's request timeout (a minute), and lands then: after a new leader
    took over and judged budgets and capacity without it (the fault suite's etcd restart,
    a tenant 25 units into a budget of 24). With the deadline at the Lease's slack
    (lease_duration - renew_deadline) a leader's writes end before another may start: it
    sends nothing after its renew deadline, and a candidate waits a whole lease_duration
    after the renewal that set it.
    """

    def __init__(self, api: client.ApiClient, deadline_s: float) -> None:
        super().__init__(api.configuration)
        self.default_headers.update(api.default_headers)  # the User-Agent the audit log names
        self.deadline = f"{deadline_s:g}s"

    def param_serialize(
        self,
        method: str,
        resource_path: str,
        path_params: Any = None,
        query_params: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        if method in _WRITES:
            query_params = [*(query_params or []), ("timeout", self.deadline)]
        return super().param_serialize(
            method, resource_path, path_params, query_params, *args, **kwargs
        )


class Clients:
    """The API clients a call is sent with, in a writer thread: only calls hold them.

    The typed core calls are made at their first use (an Event, a pod's pin): importing them
    costs a new process 0.4 s of CPU, which its first bind, a claim status write, need not
    wait for (``cluster.list_calls``)."""

    def __init__(
        self, api: client.ApiClient, term: Callable[[], Term | None] = lambda: None
    ) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        # The term this replica leads in, asked as each claim status write is sent: the
        # fencing token the write carries (``claims.fenced``); None stamps nothing.
        self.term = term

    @classmethod
    def of(
        cls,
        api: client.ApiClient,
        write_deadline_s: float | None = None,
        term: Callable[[], Term | None] = lambda: None,
    ) -> Clients:
        """Clients over ``api``; with ``write_deadline_s``, every write carries that deadline
        for the API server (``DeadlineApiClient``)."""
        if write_deadline_s is None:
            return cls(api, term)
        return cls(DeadlineApiClient(api, write_deadline_s), term)

    @cached_property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)


class WriterStopped(Exception):
    """A call still queued when the writer stopped: not sent (this replica no longer leads)."""


@dataclass(frozen=True)
class Answer:
    """What became of one call; ``obj`` is the object as the server has it when known."""

    call: Call
    outcome: Outcome
    obj: MutableObj | None = None
    error: str = ""
    code: int | None = None  # the API's HTTP status of a refusal, when it answered one

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


# The API server refused the request as it is (a name or body it can never accept): sending
# it again unchanged gets the same answer.
INVALID = frozenset({400, 422})


def status_of(exc: Exception) -> int | None:
    return int(exc.status or 0) if isinstance(exc, ApiException) else None


Heard = Callable[[Answer], None]


class Call(ABC):
    """One write. Subclasses are frozen dataclasses with ``namespace`` and ``name``."""

    what: ClassVar[str]  # the first part of ``key``, and the name in logs
    priority: ClassVar[Priority]
    supersedes: ClassVar[bool] = False
    # API statuses that mean the write's goal holds already (a delete of what is gone).
    done_when: ClassVar[frozenset[int]] = frozenset()
    # What a failure is logged as (the path fills %s), when one is worth a warning.
    unwritten: ClassVar[str] = ""
    # The kind whose object an answer carries into the view (written, or read again).
    takes: ClassVar[keys.ApiKind | None] = None
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
        if status_of(exc) in self.done_when:
            return Answer(self, Outcome.WRITTEN)
        return Answer(self, Outcome.FAILED, error=describe(exc), code=status_of(exc))

    def apply(self, answer: Answer, view: ClusterView) -> None:
        """What the answer changes in the view (run in the loop): the object it carries
        taken in as a ``takes``, and a failure logged where ``unwritten`` says how."""
        if self.unwritten and not answer.ok:
            log.warning(f"{self.unwritten}: %s", self.path, answer.error)
        if self.takes is not None:
            take_into(view, self.takes, answer)


def refused_and_read_again(
    call: Call, exc: Exception, read: Callable[[], Any], label: str
) -> Answer:
    """What a status write guarded by a resourceVersion comes to when it raised: 409 a
    conflict, 404 gone, anything else a failure (logged). Unless gone, the object is read
    again (``read``), so the view takes what the server holds and it is judged again; a
    read the server cannot answer leaves that to the watch."""
    outcome = {409: Outcome.CONFLICT, 404: Outcome.GONE}.get(status_of(exc) or 0, Outcome.FAILED)
    if outcome is Outcome.GONE:
        return Answer(call, outcome)
    error = describe(exc)
    if isinstance(exc, WriterStopped):
        return Answer(call, outcome, error=error)
    what = call.takes.kind if call.takes is not None else call.what
    if outcome is Outcome.FAILED:
        log.warning(
            "status write of %s %s (%s) failed: %s; it is judged again",
            what, call.path, label, error,
        )  # fmt: skip
    try:
        fresh = read()
    except ApiException as again:
        if again.status == 404:
            return Answer(call, Outcome.GONE)
        fresh = None
    except Exception as again:  # the server is away: the watch brings the object later
        log.debug("%s %s not read again: %s", what, call.path, again)
        fresh = None
    return Answer(call, outcome, fresh, error, code=status_of(exc))


def take_into(view: ClusterView, kind: keys.ApiKind, answer: Answer) -> None:
    if answer.obj is not None:
        answer.obj.setdefault("kind", kind.kind)
        view.apply(kind.kind, answer.obj, deleted=False)


def claims_of(namespace: str) -> tuple[str, str, str, str]:
    return (keys.GPU_CLAIM.group, keys.GPU_CLAIM.version, namespace, keys.GPU_CLAIM.plural)
