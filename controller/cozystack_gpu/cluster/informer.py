"""List-then-watch feeds of API objects into one queue, with an explicit "listed" mark.

The binder needs what kopf's per-object workers do not give: every kind fully listed before
its first decision (a claim seen before its node would read as Lost), and one ordered stream
of changes for its single loop. Each Informer runs one thread: it lists, emits the whole
listing as one LISTED event, then watches from the listing's resourceVersion; a watch the
server ends goes on from the last version it delivered, and 410 Gone or a broken stream
lists again. Objects stay plain dicts (the API's JSON), so the edges decide
what to read from them.
"""

from __future__ import annotations

import enum
import json
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from cozystack_gpu.cluster.list_calls import kind_path, path_list
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.keys import ApiKind
from cozystack_gpu.objects.translate import object_key

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
# (connect, read) seconds of a write of the controller's loops (the binder's writer, the
# licence copier). A server that is down refuses the connection at once; a loaded one
# answers a write within a few seconds (BENCHMARKS.md: p99 of 2-4 s behind 10,000 waiting
# orders on 2 cores), so 30 s only ends a request that will never answer.
WRITE_TIMEOUT_S = (5.0, 30.0)


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
    # A listing's resourceVersion: what the view holds newer than it stays (``relist``).
    resource_version: int | None = None


@dataclass(frozen=True)
class Source:
    """One watched kind: a list callable of the kubernetes client and its arguments."""

    kind: str
    list_fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)


def list_function(api: client.ApiClient, kind: ApiKind) -> Callable[..., Any]:
    """The cluster-wide list (and watch) call of one kind of ``keys``' table, by its path
    (``list_calls``: no typed API module is imported for it)."""
    return path_list(api, kind_path(kind))


def source(api: client.ApiClient, kind: ApiKind) -> Source:
    return Source(kind.kind, list_function(api, kind))


class RawWatch(watch.Watch):  # type: ignore[misc]  # the client is untyped
    """The client's watch with events left as the API's JSON: no return type, so no model
    is built. Its default path is kept on purpose: it reads an ERROR event (410 Gone when
    the resourceVersion was compacted) and raises it as an ApiException, where
    ``deserialize=False`` fails on that event with a KeyError ('raw_object')."""

    def get_return_type(self, func: Callable[..., Any]) -> None:
        return None


class Sink(Protocol):
    """Where an informer puts its events: a queue, or the shared informers' fan-out."""

    def put(self, item: Event) -> None:
        """Take one event (never blocks for long: the informer's thread waits on it)."""


class Informer:
    """Feeds one kind into ``sink`` until stopped."""

    def __init__(
        self,
        api: client.ApiClient,
        source: Source,
        sink: Sink,
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
        if self._thread.ident is not None:  # never started: nothing to wait for
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
        version = str(body["metadata"]["resourceVersion"])
        self._sink.put(
            Event(kind, EventType.LISTED, objects=tuple(items), resource_version=int(version))
        )
        return version

    def _run(self) -> None:
        kind = self._source.kind
        # The version the next watch starts from; None: list first.
        resource_version: str | None = None
        while not self._stop.is_set():
            try:
                if resource_version is None:
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
                    if not isinstance(obj, dict):
                        continue
                    # Every change and every bookmark moves the version the watch has
                    # delivered everything up to.
                    resource_version = _resource_version(obj) or resource_version
                    if kind_of_event not in _CHANGES:
                        continue
                    obj.setdefault("kind", kind)
                    self._sink.put(Event(kind, EventType(kind_of_event), obj=obj))
                # The server ended the watch (its timeout): the next goes on from what this
                # one delivered, as client-go's reflector does. Listing again instead made
                # every replica decode every object of the kind every WATCH_TIMEOUT_S; a
                # version too old by then answers 410, and that lists again (below).
            except ApiException as exc:
                resource_version = None
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
                resource_version = None
                # The server is away or the stream broke (a restart, a network blip): an
                # expected moment, told in one line rather than a traceback a second.
                if self._stop.is_set():
                    return
                reason = " ".join(str(exc).split())[:200]
                log.warning("watch of %s broke; retrying: %s: %s", kind, type(exc).__name__, reason)
                self._stop.wait(RETRY_DELAY_S)
            except Exception:  # a broken stream must not end the feed
                resource_version = None
                if self._stop.is_set():
                    return
                log.exception("watch of %s broke; retrying", kind)
                self._stop.wait(RETRY_DELAY_S)


def _resource_version(obj: dict[str, Any]) -> str | None:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get("resourceVersion"):
        return str(metadata["resourceVersion"])
    return None


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# Strings up to this length are shared between objects: keys, names, phases, reasons, the
# node and class a claim names, timestamps. Longer ones (messages, certificates) are rarely
# repeated.
SHARED_STRING_MAX = 64


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop, in place, what no reader of the cache reads and what is often the larger half
    of an object: ``managedFields`` and kubectl's last-applied copy. Everything else stays:
    the admission feed and the binder read the same objects, so neither may lose a field
    the other reads. What stays shares its keys and short strings with every other cached
    object (``share_strings``)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
        annotations = metadata.get("annotations")
        if isinstance(annotations, dict):
            annotations.pop(LAST_APPLIED, None)
    share_strings(obj)
    return obj


def share_strings(value: dict[str, Any] | list[Any]) -> None:
    """Replace, in place, every key and every string of up to ``SHARED_STRING_MAX``
    characters by the process's one copy of it (``sys.intern``). Each watch event is
    decoded on its own, so every object carries its own copy of "metadata",
    "lastTransitionTime", "True", its namespace and its node: more than half of what a cached
    claim holds (BENCHMARKS.md). Equal strings stay equal, so no reader can tell."""
    if isinstance(value, dict):
        items = list(value.items())
        value.clear()
        for key, item in items:
            value[sys.intern(key)] = _shared(item)
    else:
        for index, item in enumerate(value):
            value[index] = _shared(item)


def _shared(item: Any) -> Any:
    if isinstance(item, str):
        return sys.intern(item) if len(item) <= SHARED_STRING_MAX else item
    if isinstance(item, (dict, list)):
        share_strings(item)
    return item


class SharedInformers:
    """One informer per watched kind for the whole process, fanned out to every part that
    reads the cluster (client-go's shared informer factory, controller-runtime's manager
    cache).

    The admission feed runs in every replica and the binder in the leader; before, each
    listed and watched every kind itself, so the leader decoded every event twice and
    held two copies of every claim and pod. Here each kind is listed and watched once,
    when a first subscriber asks for it, and kept in a store of the objects as last seen;
    a subscriber that comes later (a replica that wins the Lease) is handed each kind's
    store as one LISTED event, then every event after it, in order, with nothing lost or
    doubled (both happen under one lock). Subscribers get the same dicts and must not
    change them.

    A binder that starts on this cache decides on what the watches delivered, as
    kube-scheduler and controller-runtime's controllers do after an election; every write
    it sends carries the resourceVersion it decided on, so a decision on a lagging cache
    fails with 409 instead of acting.
    """

    def __init__(self, api: client.ApiClient) -> None:
        self._api = api
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started = False
        # Each informer with its own stop: a kind no subscriber reads any more (the
        # binder's usage records, the copier's Secrets, once the replica stops leading) is
        # no longer watched, nor kept.
        self._informers: dict[str, tuple[Informer, threading.Event]] = {}
        self._stores: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        # The resourceVersion each store is current to: its listing's, then its events'.
        self._versions: dict[str, int] = {}
        self._listed: set[str] = set()
        self._subscribers: list[tuple[Sink, frozenset[str]]] = []

    def start(self) -> None:
        with self._lock:
            self._started = True
            for informer, _stop in self._informers.values():
                informer.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            informers = list(self._informers.values())
        for informer, stop in informers:
            stop.set()
            informer.join(timeout=1)

    def subscribe(self, sink: Sink, sources: Iterable[Source]) -> None:
        """Send ``sink`` every event of these kinds from now on, each kind already listed
        first as a LISTED event of its store. A kind no one watched yet starts its
        informer with this ``Source`` (one source per kind name)."""
        sources = list(sources)
        wanted = frozenset(s.kind for s in sources)
        with self._lock:
            for kind in sorted(wanted & self._listed):
                objects = tuple(self._stores[kind].values())
                version = self._versions.get(kind)
                sink.put(Event(kind, EventType.LISTED, objects=objects, resource_version=version))
            self._subscribers.append((sink, wanted))
            for src in sources:
                if src.kind in self._informers:
                    continue
                stop = threading.Event()
                informer = Informer(self._api, src, _From(self, stop), stop)
                self._informers[src.kind] = (informer, stop)
                if self._started:
                    informer.start()

    def unsubscribe(self, sink: Sink) -> None:
        with self._lock:
            self._subscribers = [(s, k) for s, k in self._subscribers if s is not sink]
            read = frozenset().union(*(kinds for _sink, kinds in self._subscribers))
            unread = [kind for kind in self._informers if kind not in read]
            ending = [self._informers.pop(kind) for kind in unread]
            for kind in unread:
                self._stores.pop(kind, None)
                self._versions.pop(kind, None)
                self._listed.discard(kind)
        for informer, stop in ending:
            stop.set()
            informer.join(timeout=1)

    def take(self, item: Event, informer: threading.Event | None = None) -> None:
        """An event of the informer whose stop is ``informer`` (None: the kind's informer
        now, as tests hand events in): keep the store, then hand the event to each
        subscriber of its kind."""
        kind = item.kind
        if item.type is EventType.LISTED:
            for obj in item.objects:
                slim(obj)
        elif item.obj is not None:
            slim(item.obj)
        with self._lock:
            current = self._informers.get(kind)
            if current is None or (informer is not None and current[1] is not informer):
                return  # the last event of an informer stopped: its kind is read no more
            store = self._stores.setdefault(kind, {})
            if item.type is EventType.LISTED:
                store.clear()
                store.update((object_key(o), o) for o in item.objects)
                self._listed.add(kind)
                if item.resource_version is not None:
                    self._versions[kind] = item.resource_version
            elif item.obj is not None:
                version = _resource_version(item.obj)
                if version is not None and kind in self._versions:
                    self._versions[kind] = max(self._versions[kind], int(version))
                if item.type is EventType.DELETED:
                    store.pop(object_key(item.obj), None)
                else:
                    store[object_key(item.obj)] = item.obj
            for sink, kinds in self._subscribers:
                if kind in kinds:
                    sink.put(item)

    def informer(self, kind: str) -> Informer | None:
        with self._lock:
            found = self._informers.get(kind)
        return None if found is None else found[0]

    def watched(self) -> set[str]:
        """The kinds listed and watched now."""
        with self._lock:
            return set(self._informers)

    def dead_threads(self) -> list[str]:
        """Informer threads that should run but do not (empty when healthy or stopped)."""
        if self._stop.is_set():
            return []
        with self._lock:
            threads = [i.thread for i, _stop in self._informers.values()]
        return [t.name for t in threads if t.ident is not None and not t.is_alive()]


@dataclass(frozen=True)
class _From:
    """One informer's sink into the shared informers, naming the informer it comes from."""

    informers: SharedInformers
    stop: threading.Event

    def put(self, item: Event) -> None:
        self.informers.take(item, self.stop)


class WatchedThread:
    """One worker thread fed by informers through one queue: the start, the stop (the
    queue is woken with None) and the health probe's dead threads, shared by the parts that
    keep watches (the admission feed, the binder, the licence copier). Given the process's
    ``SharedInformers`` it subscribes to them; without, it keeps informers of its own.

    ``target`` runs until the stop; one that raises is logged, its ``failure`` kept for
    the health probe, and the stop set, so the process is restarted or the Lease handed on.
    """

    def __init__(
        self,
        api: client.ApiClient,
        sources: Iterable[Source],
        target: Callable[[], None],
        name: str,
        informers: SharedInformers | None = None,
    ) -> None:
        self.stop_event = threading.Event()
        # Events (and, for the binder, its writes' answers), and None to wake the worker
        # when it must stop.
        self.queue: queue.Queue[Any] = queue.Queue()
        self._own = informers is None
        self.informers = informers if informers is not None else SharedInformers(api)
        self._sources = list(sources)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._target = target
        self.failure: str | None = None  # why the target stopped on its own

    def _run(self) -> None:
        try:
            self._target()
        except Exception as exc:
            log.exception("%s failed; it stops so that a fresh one can start", self.thread.name)
            self.failure = f"{type(exc).__name__}: {exc}"
            self.stop_event.set()

    def start(self) -> None:
        self.informers.subscribe(self.queue, self._sources)
        if self._own:
            self.informers.start()
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.informers.unsubscribe(self.queue)
        self.queue.put(None)
        self.thread.join(timeout=10)
        if self._own:
            self.informers.stop()

    def dead_threads(self) -> list[str]:
        """Threads that should run but do not (empty when healthy or stopped on purpose)."""
        if self.stop_event.is_set() and self.failure is None:
            return []
        threads = [self.thread] if self.thread.ident is not None else []
        dead = [t.name for t in threads if not t.is_alive()]
        return dead + self.informers.dead_threads()

    def drain(self, timeout: float, most: int) -> list[Any]:
        """What the queue holds: waits up to ``timeout`` for the first item, then takes what
        is there without waiting, at most ``most`` (the wake-up Nones left out)."""
        try:
            first = self.queue.get(timeout=timeout)
        except queue.Empty:
            return []
        batch = [first]
        while len(batch) < most:
            try:
                batch.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return [item for item in batch if item is not None]


class Watcher:
    """The start, stop, health and failure of a part that works its watches in one
    ``WatchedThread`` (``_threads``)."""

    _threads: WatchedThread

    def start(self) -> None:
        self._threads.start()

    def stop(self) -> None:
        self._threads.stop()

    def dead_threads(self) -> list[str]:
        """Threads that should run but do not (empty when healthy or stopped on purpose)."""
        return self._threads.dead_threads()

    @property
    def failure(self) -> str | None:
        """Why the part's loop stopped on its own (an exception), for the health probe."""
        return self._threads.failure


def take(view: ClusterView, event: Event) -> None:
    """An informer's event into a view: a listing replaces its kind, a watch event changes
    one object. (The view itself stays free of the client: the layout preview ships it.)"""
    if event.type is EventType.LISTED:
        view.relist(event.kind, event.objects, event.resource_version)
    elif event.obj is not None:
        view.apply(event.kind, event.obj, deleted=event.type is EventType.DELETED)
