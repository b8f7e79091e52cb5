"""Which Event an occurrence is, and what its write says: client-go's recorder rules, without
I/O (the writer sends what this decides).

An Event without times reads ``<unknown>`` in ``kubectl get events`` and ``describe``, and
cannot be sorted, so every Event carries ``firstTimestamp``, ``lastTimestamp`` and
``count``, and names the reporting controller and instance. As client-go's
``EventCorrelator`` does, a repeat of one event (same object, reason, message and type) is
the same Event, its count raised and its lastTimestamp moved, instead of a new object each
time. A repeat that comes while the Event's write still waits in the writer's queue rides
on that write, so a burst of repeats behind the binds costs one request, not one each.

The book remembers the last ``size`` distinct events (client-go keeps 4096); an event it has
forgotten starts a new Event, as one past the API server's event TTL does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects.translate import rfc3339

BOOK_SIZE = 4096
MESSAGE_MAX = 1024
# An Event's name is its object's name, a dot and 16 hex digits; names end at 253 characters.
_OBJECT_NAME_MAX = 253 - 17

EventKey = tuple[str, str, str, str, str, str, str]


@dataclass(eq=False)
class Told:
    """One Event as this replica last wrote or will write it."""

    name: str
    namespace: str
    involved: Mapping[str, Any]
    reason: str
    message: str
    type: str
    first: float
    last: float
    count: int = 1
    created: bool = False  # the API server has it (a patch raises its count)
    queued: bool = True  # a write of it waits in the writer's queue
    # One write of an Event at a time, so a repeat's patch never overtakes its create.
    sending: threading.Lock = field(default_factory=threading.Lock)


class EventBook:
    """The events this replica has told, by what makes two occurrences one Event.

    ``tell`` is called by the binder's loop, ``taken``/``sent`` by the writer's workers; a
    lock keeps the counts whole between them.
    """

    def __init__(self, instance: str, size: int = BOOK_SIZE) -> None:
        self.instance = instance
        self._size = size
        self._told: OrderedDict[EventKey, Told] = OrderedDict()
        self._lock = threading.Lock()
        self._stamp = 0

    def __len__(self) -> int:
        return len(self._told)

    def tell(
        self,
        obj: Mapping[str, Any],
        kind: keys.ApiKind,
        reason: str,
        message: str,
        warning: bool,
        now: float,
    ) -> tuple[Told, bool]:
        """The Event this occurrence is, and whether it needs a write of its own (False when
        a write of the same Event is still queued and will carry it)."""
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        name = str(metadata.get("name") or "")
        uid = str(metadata.get("uid") or "")
        text = message[:MESSAGE_MAX]
        type_ = "Warning" if warning else "Normal"
        key: EventKey = (namespace, kind.kind, name, uid, reason, text, type_)
        with self._lock:
            told = self._told.get(key)
            if told is not None:
                self._told.move_to_end(key)
                told.count += 1
                told.last = max(told.last, now)
                if told.queued:
                    return told, False
                told.queued = True
                return told, True
            involved = {
                "apiVersion": kind.api_version,
                "kind": kind.kind,
                "name": name,
                "namespace": namespace,
                "uid": uid,
            }
            # client-go's name: the object's, then the first time in nanoseconds, in hex;
            # kept rising here, so two events in one clock tick never share a name.
            self._stamp = max(int(now * 1e9), self._stamp + 1)
            event_name = f"{name[:_OBJECT_NAME_MAX]}.{self._stamp:016x}"
            told = Told(event_name, namespace, involved, reason, text, type_, now, now)
            self._told[key] = told
            while len(self._told) > self._size:
                self._told.popitem(last=False)
            return told, True

    def taken(self, told: Told) -> bool:
        """A worker starts the Event's write: later repeats need a write of their own.
        Returns whether the server has the Event (a patch raises its count)."""
        with self._lock:
            told.queued = False
            return told.created

    def sent(self, told: Told) -> None:
        with self._lock:
            told.created = True

    def lost(self, told: Told) -> None:
        """The server no longer has the Event (deleted by its TTL): the next write creates it."""
        with self._lock:
            told.created = False

    def create_body(self, told: Told) -> dict[str, Any]:
        with self._lock:
            count, last = told.count, told.last
        return {
            "metadata": {"name": told.name, "namespace": told.namespace},
            "involvedObject": dict(told.involved),
            "reason": told.reason,
            "message": told.message,
            "type": told.type,
            "source": {"component": keys.FIELD_MANAGER_BINDER},
            "reportingComponent": keys.FIELD_MANAGER_BINDER,
            "reportingInstance": self.instance[:128],
            "firstTimestamp": rfc3339(told.first),
            "lastTimestamp": rfc3339(last),
            "count": count,
        }

    def patch_body(self, told: Told) -> dict[str, Any]:
        with self._lock:
            return {"count": told.count, "lastTimestamp": rfc3339(told.last)}
