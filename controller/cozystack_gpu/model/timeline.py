"""Units held over time on one node or under one budget key: a step function kept as its
change points.

A reservation holds its units over ``[start, end)``: ``+units`` at ``start``, ``-units`` at
``end``; the value at ``t`` is the sum of the changes at or before ``t``. Reservations
answer three questions of it: the value at a moment, the peak over a window ``[a, b)``
(``b`` may be infinite: what an order must leave room for), and the earliest start of a
window of a given length whose peak stays under a cap (the window a refusal offers).

The change points sit in sorted chunks of a few dozen, each knowing its sum and the highest
running sum within it, so a change costs one chunk's length plus the chunk count, and a
peak walks whole chunks in one step each: at the root of a tenant tree (every reservation
of every tenant below it) a query reads a few hundred numbers, not twenty thousand.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from itertools import accumulate

# Points per chunk before it splits in two: small enough that refreshing one is cheap,
# large enough that a timeline of 20,000 points has a few hundred chunks.
CHUNK = 64


class _Chunk:
    """Sorted change points, with their sum and the highest running sum within."""

    __slots__ = ("deltas", "times", "top", "total")

    def __init__(self, times: list[int], deltas: list[int]) -> None:
        self.times = times
        self.deltas = deltas
        self.total = 0
        self.top = 0
        self.refresh()

    def refresh(self) -> None:
        running = list(accumulate(self.deltas))
        self.total = running[-1]
        self.top = max(running)


class Timeline:
    """A step function of time with integer values, changed by ``add``."""

    __slots__ = ("_bases", "_chunks", "_firsts", "_highs")

    def __init__(self) -> None:
        self._chunks: list[_Chunk] = []
        self._firsts: list[int] = []  # each chunk's first time, for bisecting
        # Built on the first read after a change, since reads outnumber changes: the units
        # held before each chunk, and the highest value from each chunk on (so the peak
        # from now on, which every order asks, reads one chunk and one number).
        self._bases: list[int] | None = None
        self._highs: list[int] | None = None

    def __bool__(self) -> bool:
        return bool(self._chunks)

    def add(self, start: int, end: int, units: int) -> None:
        """Hold ``units`` more over ``[start, end)`` (fewer when negative)."""
        self._bump(start, units)
        self._bump(end, -units)

    def points(self) -> list[tuple[int, int]]:
        """Every change point as (time, change), in time order."""
        return [p for c in self._chunks for p in zip(c.times, c.deltas, strict=True)]

    def value_at(self, t: float) -> int:
        """Units held at ``t``."""
        i = bisect_right(self._firsts, t) - 1
        if i < 0:
            return 0
        chunk = self._chunks[i]
        return self._sums()[0][i] + sum(chunk.deltas[: bisect_right(chunk.times, t)])

    def peak(self, a: float, b: float = math.inf) -> int:
        """The most units held at any moment of ``[a, b)``."""
        chunks = self._chunks
        if len(chunks) == 1:  # most nodes: a few windows, one chunk
            times, deltas = chunks[0].times, chunks[0].deltas
            j = bisect_right(times, a)
            return max(accumulate(deltas[j : bisect_left(times, b, j)], initial=sum(deltas[:j])))
        bases, highs = self._sums()
        i = bisect_right(self._firsts, a) - 1
        if i < 0:
            held = best = 0
            rest = 0
        else:
            held = bases[i]
            chunk = chunks[i]
            j = bisect_right(chunk.times, a)
            held += sum(chunk.deltas[:j])
            k = bisect_left(chunk.times, b, j)
            # The value at a, then after each change inside the window.
            best = max(accumulate(chunk.deltas[j:k], initial=held))
            if k < len(chunk.times):
                return best
            held += sum(chunk.deltas[j:])
            rest = i + 1
        if b == math.inf:
            return max(best, highs[rest]) if rest < len(chunks) else best
        for chunk in chunks[rest:]:
            if chunk.times[-1] < b:
                best = max(best, held + chunk.top)
                held += chunk.total
                continue
            k = bisect_left(chunk.times, b)
            return max(best, *accumulate(chunk.deltas[:k], initial=held))
        return best

    def earliest_fit(self, s: int, length: int, cap: int, until: float) -> int | None:
        """The earliest start ``t >= s``, no later than ``until``, at which a window
        ``[t, t + length)`` never holds more than ``cap``; None when there is none.

        Only the end of a hold can let a window fit that did not, so the answer is ``s``
        or the end of the last busy stretch the window would touch: walk the stretches
        above the cap in time order, moving the start past each one the window overlaps,
        until the window ends before the next.
        """
        if cap < 0:
            return None
        start = s
        chunks = self._chunks
        if len(chunks) == 1:  # most nodes: a few windows, one chunk
            times, deltas = chunks[0].times, chunks[0].deltas
            j = bisect_right(times, s)
            held = sum(deltas[:j])
            after: Iterable[tuple[int, int]] = zip(times[j:], deltas[j:], strict=True)
        else:
            held = self.value_at(s)
            after = self._after(s)
        since = s  # the current stretch of constant value began here
        for t, delta in after:
            if since >= start + length:
                return start
            if held > cap:
                start = t
                if start > until:
                    return None
            held += delta
            since = t
        return start if held <= cap else None

    def _after(self, s: float) -> Iterator[tuple[int, int]]:
        """The change points after ``s``, in time order."""
        i = max(bisect_right(self._firsts, s) - 1, 0)
        chunks = self._chunks
        if not chunks:
            return
        first = chunks[i]
        j = bisect_right(first.times, s)
        yield from zip(first.times[j:], first.deltas[j:], strict=True)
        for chunk in chunks[i + 1 :]:
            yield from zip(chunk.times, chunk.deltas, strict=True)

    def _sums(self) -> tuple[list[int], list[int]]:
        if self._bases is None or self._highs is None:
            chunks = self._chunks
            self._bases = list(accumulate((c.total for c in chunks), initial=0))
            tops = [base + c.top for base, c in zip(self._bases, chunks, strict=False)]
            self._highs = list(accumulate(reversed(tops), max))[::-1]
        return self._bases, self._highs

    def _bump(self, t: int, delta: int) -> None:
        if not delta:
            return
        self._bases = self._highs = None
        chunks, firsts = self._chunks, self._firsts
        if not chunks:
            chunks.append(_Chunk([t], [delta]))
            firsts.append(t)
            return
        i = max(bisect_right(firsts, t) - 1, 0)
        chunk = chunks[i]
        times, deltas = chunk.times, chunk.deltas
        j = bisect_left(times, t)
        if j < len(times) and times[j] == t:
            changed = deltas[j] + delta
            if changed:
                deltas[j] = changed
            else:
                del times[j], deltas[j]
                if not times:
                    del chunks[i], firsts[i]
                    return
                if len(times) < CHUNK // 4 and i + 1 < len(chunks):
                    # Merge a thinned chunk into the next, so removals never leave a long
                    # row of tiny chunks for every peak to walk.
                    after = chunks[i + 1]
                    if len(times) + len(after.times) <= 2 * CHUNK:
                        times += after.times
                        deltas += after.deltas
                        del chunks[i + 1], firsts[i + 1]
        else:
            times.insert(j, t)
            deltas.insert(j, delta)
        firsts[i] = times[0]
        if len(times) > 2 * CHUNK:
            tail = _Chunk(times[CHUNK:], deltas[CHUNK:])
            del times[CHUNK:], deltas[CHUNK:]
            chunks.insert(i + 1, tail)
            firsts.insert(i + 1, tail.times[0])
        chunk.refresh()
