"""List-then-watch feeds of API objects into one queue, with an explicit "listed" mark.

The binder needs what kopf's per-object workers do not give: every kind fully listed before
its first decision (a claim seen before its node would read as Lost), and one ordered stream
of changes for its single loop. Each Informer runs one thread: it lists, emits the whole
listing as one LISTED event, then watches from the listing's resourceVersion, re-listing on
410 Gone or any broken stream. Objects stay plain dicts (the API's JSON), so the edges decide
what to read from them.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.keys import ApiKind

log = logging.getLogger(__name__)

_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})

WATCH_TIMEOUT_S = 300
RETRY_DELAY_S = 1.0
# (connect, read) seconds; read is the longest silence of one socket read. A listing streams
# without pause once the server starts answering. A watch is silent between events, but the
# server ends it after WATCH_TIMEOUT_S: a watch silent for longer has lost its connection
# (e.g. the API server went away without closing it) and is listed again.
LIST_TIMEOUT_S = (5.0, 60.0)
WATCH_READ_TIMEOUT_S = (5.0, WATCH_TIMEOUT_S + 30.0)


class EventType(enum.Enum):
    LISTED = "LISTED"  # objects = the complete current set of the kind
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class Event:
    kind: str
    type: EventType
    obj: dict[str, Any] | None = None
    objects: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Source:
    """One watched kind: a list callable of the kubernetes client and its arguments."""

    kind: str
    list_fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def list_function(api: client.ApiClient, kind: ApiKind) -> Callable[..., Any]:
    """The cluster-wide list (and watch) call of one kind of ``keys``' table."""
    if kind.group:
        custom = client.CustomObjectsApi(api)

        def list_custom(**kwargs: Any) -> Any:
            return custom.list_cluster_custom_object(
                kind.group, kind.version, kind.plural, **kwargs
            )

        return list_custom
    # The core group has one typed call per kind; namespaced kinds are listed across all
    # namespaces.
    core = client.CoreV1Api(api)
    core_lists: dict[str, Callable[..., Any]] = {
        keys.NODE.plural: core.list_node,
        keys.NAMESPACE.plural: core.list_namespace,
        keys.RESOURCE_QUOTA.plural: core.list_resource_quota_for_all_namespaces,
        keys.POD.plural: core.list_pod_for_all_namespaces,
        keys.PVC.plural: core.list_persistent_volume_claim_for_all_namespaces,
        keys.PV.plural: core.list_persistent_volume,
    }
    try:
        return core_lists[kind.plural]
    except KeyError:
        raise ValueError(f"no list call for core kind {kind.kind}") from None


def source(api: client.ApiClient, kind: ApiKind) -> Source:
    return Source(kind.kind, list_function(api, kind))


class RawWatch(watch.Watch):  # type: ignore[misc]  # the client is untyped
    """The client's watch with events left as the API's JSON: no return type, so no model
    is built. Its default path is kept on purpose: it reads an ERROR event (410 Gone when
    the resourceVersion was compacted) and raises it as an ApiException, where
    ``deserialize=False`` fails on that event with a KeyError ('raw_object')."""

    def get_return_type(self, func: Callable[..., Any]) -> None:
        return None


class Informer:
    """Feeds one kind into ``sink`` until stopped."""

    def __init__(
        self,
        api: client.ApiClient,
        source: Source,
        sink: queue.Queue[Event],
        stop: threading.Event,
    ) -> None:
        self._api = api
        self._source = source
        self._sink = sink
        self._stop = stop
        self._thread = threading.Thread(
            target=self._run, name=f"informer-{source.kind}", daemon=True
        )
        self._watch: watch.Watch | None = None

    def start(self) -> None:
        self._thread.start()

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def join(self, timeout: float | None = None) -> None:
        # The client's Watch.stop() also shuts the stream's socket: a read blocked until the
        # next event (minutes away, perhaps) ends now.
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout)

    def _list(self) -> str:
        # _preload_content=False keeps the JSON as dicts: the typed models of the client
        # are slow to build and drop fields of custom resources.
        response = self._source.list_fn(
            _preload_content=False, _request_timeout=LIST_TIMEOUT_S, **self._source.kwargs
        )
        body = json.loads(response.data)
        items = body.get("items") or []
        kind = self._source.kind
        for item in items:
            item.setdefault("kind", kind)
        self._sink.put(Event(kind, EventType.LISTED, objects=tuple(items)))
        return str(body["metadata"]["resourceVersion"])

    def _run(self) -> None:
        kind = self._source.kind
        while not self._stop.is_set():
            try:
                resource_version = self._list()
                self._watch = RawWatch()
                # timeout_seconds also keeps the client from retrying a 410 itself: the
                # ApiException below lists again, which heals any gap.
                for raw in self._watch.stream(
                    self._source.list_fn,
                    resource_version=resource_version,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    allow_watch_bookmarks=True,
                    _request_timeout=WATCH_READ_TIMEOUT_S,
                    **self._source.kwargs,
                ):
                    if self._stop.is_set():
                        return
                    kind_of_event = raw.get("type")
                    obj = raw.get("object")
                    if kind_of_event not in _CHANGES or not isinstance(obj, dict):
                        continue
                    obj.setdefault("kind", kind)
                    self._sink.put(Event(kind, EventType(kind_of_event), obj=obj))
                # A watch that ends (timeout) is re-listed too: simple, and it heals any gap.
            except ApiException as exc:
                if exc.status == 410:
                    # Our resourceVersion is too old: list again at once.
                    log.info("watch of %s expired; listing again", kind)
                    continue
                if exc.status == 404:
                    # The kind is not installed (e.g. no KubeVirt yet): an empty listing.
                    self._sink.put(Event(kind, EventType.LISTED, objects=()))
                    self._stop.wait(10 * RETRY_DELAY_S)
                    continue
                log.warning("watch of %s failed: %s; retrying", kind, exc.reason)
                self._stop.wait(RETRY_DELAY_S)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                # The server is away or the stream broke (a restart, a network blip): an
                # expected moment, told in one line rather than a traceback a second.
                if self._stop.is_set():
                    return
                reason = " ".join(str(exc).split())[:200]
                log.warning("watch of %s broke; retrying: %s: %s", kind, type(exc).__name__, reason)
                self._stop.wait(RETRY_DELAY_S)
            except Exception:  # a broken stream must not end the feed
                if self._stop.is_set():
                    return
                log.exception("watch of %s broke; retrying", kind)
                self._stop.wait(RETRY_DELAY_S)


class WatchedThread:
    """One worker thread fed by informers through one queue: the start, the stop (the
    queue is woken with None) and the health probe's dead threads, shared by the parts that
    keep watches of their own (the admission feed, the licence copier)."""

    def __init__(
        self,
        api: client.ApiClient,
        sources: Iterable[Source],
        target: Callable[[], None],
        name: str,
        failure: Callable[[], str | None],
    ) -> None:
        self.stop_event = threading.Event()
        # Events, and None to wake the worker when it must stop.
        self.queue: queue.Queue[Any] = queue.Queue()
        self.informers = [Informer(api, s, self.queue, self.stop_event) for s in sources]
        self.thread = threading.Thread(target=target, name=name, daemon=True)
        self._failure = failure

    def start(self) -> None:
        for informer in self.informers:
            informer.start()
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.queue.put(None)
        self.thread.join(timeout=10)
        for informer in self.informers:
            informer.join(timeout=1)

    def dead_threads(self) -> list[str]:
        """Threads that should run but do not (empty when healthy or stopped on purpose)."""
        if self.stop_event.is_set() and self._failure() is None:
            return []
        threads = [self.thread, *(i.thread for i in self.informers)]
        return [t.name for t in threads if t.ident is not None and not t.is_alive()]
