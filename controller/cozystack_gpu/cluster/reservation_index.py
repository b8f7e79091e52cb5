"""The cluster view's reservations: their model inputs, and when each window ends.

A reservation holds nothing once its window has ended, whatever its status says (the
binder ends it then, but may be late, or may not lead yet). No watch event says that time
has come, so the view keeps every window's end, soonest first, and marks a reservation
dirty when its end passes: the next sync takes it out of the model.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping

from cozystack_gpu.cluster.dirty import Dirty
from cozystack_gpu.model import ClaimKey, ReservationInfo
from cozystack_gpu.objects import MutableObj, translate

Key = tuple[str, str]


class ReservationIndex:
    def __init__(
        self, raw: Callable[[], Mapping[Key, MutableObj]], dirty: Callable[[], Dirty]
    ) -> None:
        self._raw = raw
        self._dirty = dirty
        self._ends: list[tuple[int, ClaimKey]] = []  # (end, key), a heap; stale rows are harmless

    def on_event(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        reservation = ClaimKey(*key)
        self._dirty().reservations.add(reservation)
        info = translate.reservation_info(new) if new is not None else None
        if info is not None:
            heapq.heappush(self._ends, (info.end, reservation))

    def ended(self, now: float) -> None:
        """Reservations whose window ended by ``now`` are built again."""
        while self._ends and self._ends[0][0] <= now:
            self._dirty().reservations.add(heapq.heappop(self._ends)[1])

    def objects(self) -> Iterable[MutableObj]:
        """Every reservation as the API confirmed it, whatever its phase or window."""
        return self._raw().values()

    def get(self, key: ClaimKey) -> MutableObj | None:
        return self._raw().get(key)

    def keys(self) -> list[ClaimKey]:
        return [ClaimKey(*key) for key in self._raw()]

    def info(self, key: ClaimKey, now: float) -> ReservationInfo | None:
        """A reservation as the model reads it; None once its window has ended."""
        obj = self._raw().get(key)
        info = translate.reservation_info(obj) if obj is not None else None
        return info if info is not None and info.end > now else None
