"""Per-class free-unit index: the nodes serving one class, bucketed by free units.

Best fit asks for the node with the fewest free units that are still enough, ties broken
by name. Free units per node take few distinct values (0..8 for passthrough, a few dozen for
vGPU), so nodes are kept in one bucket per value, each bucket a heap of names: a lookup walks
the distinct values at or above the need and pops the first name, O(distinct values +
log n) however many nodes there are.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator, Set
from typing import Any, TypeVar

# Up to this many names to skip, popping them off a bucket's heap is cheaper than a set
# difference over the whole bucket.
_FEW = 32


class _Bucket:
    """Node names with one free value; ``first`` returns the smallest accepted name.

    Removal is lazy: a name leaves ``members`` at once and its heap entry is dropped when it
    reaches the top or when stale entries outnumber live ones.
    """

    __slots__ = ("heap", "members")

    def __init__(self) -> None:
        self.members: set[str] = set()
        self.heap: list[str] = []

    def add(self, name: str) -> None:
        if name in self.members:
            return
        self.members.add(name)
        heapq.heappush(self.heap, name)

    def discard(self, name: str) -> None:
        self.members.discard(name)
        if len(self.heap) > 2 * len(self.members) + 32:
            self.heap = sorted(self.members)

    def first(self, accept: Callable[[str], bool] | None) -> str | None:
        heap = self.heap
        aside: list[str] = []
        found: str | None = None
        while heap:
            top = heap[0]
            if top not in self.members:
                heapq.heappop(heap)
                continue
            if accept is not None and not accept(top):
                aside.append(heapq.heappop(heap))
                continue
            found = top
            break
        for name in aside:
            heapq.heappush(heap, name)
        return found


class ClassIndex:
    """Free units and capacity per serving node of one class."""

    __slots__ = ("_buckets", "_cap_counts", "_keys", "cap", "free", "total_free")

    def __init__(self) -> None:
        self.free: dict[str, int] = {}
        self.cap: dict[str, int] = {}
        self.total_free = 0
        self._buckets: dict[int, _Bucket] = {}
        self._keys: list[int] = []  # free values with a non-empty bucket, ascending
        self._cap_counts: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.free)

    def __contains__(self, node: str) -> bool:
        return node in self.free

    def put(self, node: str, free: int, cap: int) -> None:
        old = self.free.get(node)
        if old is not None:
            if old == free and self.cap[node] == cap:
                return
            self._drop(node, old)
        self.free[node] = free
        self.cap[node] = cap
        self.total_free += free
        self._cap_counts[cap] = self._cap_counts.get(cap, 0) + 1
        bucket = self._buckets.get(free)
        if bucket is None:
            bucket = self._buckets[free] = _Bucket()
        if not bucket.members:
            insort(self._keys, free)
        bucket.add(node)

    def remove(self, node: str) -> None:
        old = self.free.get(node)
        if old is not None:
            self._drop(node, old)
            del self.free[node]
            del self.cap[node]

    def _drop(self, node: str, old: int) -> None:
        self.total_free -= old
        cap = self.cap[node]
        left = self._cap_counts[cap] - 1
        if left:
            self._cap_counts[cap] = left
        else:
            del self._cap_counts[cap]
        bucket = self._buckets[old]
        bucket.discard(node)
        if not bucket.members:
            self._keys.pop(bisect_left(self._keys, old))
            del self._buckets[old]

    def best(self, need: int, accept: Callable[[str], bool] | None = None) -> str | None:
        """The accepted node with the fewest free units >= need, smallest name first."""
        keys = self._keys
        for i in range(bisect_left(keys, need), len(keys)):
            found = self._buckets[keys[i]].first(accept)
            if found is not None:
                return found
        return None

    def best_outside(self, need: int, skip: Set[str]) -> str | None:
        """``best`` among the nodes not in ``skip``. A large ``skip`` (every node booked in a
        crowded window) is taken out of each bucket by set difference, where ``best`` would
        pop and push back every skipped name of the bucket's heap."""
        if len(skip) <= _FEW:
            return self.best(need, (lambda n: n not in skip) if skip else None)
        keys = self._keys
        for i in range(bisect_left(keys, need), len(keys)):
            rest = self._buckets[keys[i]].members - skip
            if rest:
                return min(rest)
        return None

    def largest_outside(self, skip: Set[str]) -> int | None:
        """``largest`` among the nodes not in ``skip``."""
        if len(skip) <= _FEW:
            return self.largest((lambda n: n not in skip) if skip else None)
        keys = self._keys
        for i in range(len(keys) - 1, -1, -1):
            if not self._buckets[keys[i]].members <= skip:
                return keys[i]
        return None

    def largest(self, accept: Callable[[str], bool] | None = None) -> int | None:
        """The most free units on one accepted node; None when no node is accepted."""
        keys = self._keys
        for i in range(len(keys) - 1, -1, -1):
            if self._buckets[keys[i]].first(accept) is not None:
                return keys[i]
        return None

    def by_free_desc(self) -> Iterator[tuple[str, int]]:
        """Serving nodes from the most free units down, smallest name first among equals.

        Each bucket's names come off a copy of its heap one at a time, so a caller that
        stops after a few nodes pays for those, not for sorting every node. A change the
        caller undoes before reading on is harmless: names are checked against ``free``.
        """
        for value in reversed(list(self._keys)):
            bucket = self._buckets.get(value)
            if bucket is None:
                continue
            heap = list(bucket.heap)
            last = None
            while heap:
                name = heapq.heappop(heap)
                # Stale entries (names gone or moved) and repeats of a re-added name skip.
                if name != last and self.free.get(name) == value:
                    last = name
                    yield name, value

    def max_free(self) -> int:
        return self._keys[-1] if self._keys else 0

    def max_cap(self) -> int:
        return max(self._cap_counts) if self._cap_counts else 0


Member = TypeVar("Member")


def discard_member(table: dict[Any, set[Member]], key: Any, item: Member) -> None:
    """Take ``item`` out of ``table[key]``, dropping the set once empty."""
    members = table.get(key)
    if members is not None:
        members.discard(item)
        if not members:
            del table[key]


def remove_sorted(entries: list[Any], entry: Any) -> int:
    """Takes ``entry`` out of the sorted ``entries``; returns how many are left."""
    del entries[bisect_left(entries, entry)]
    return len(entries)
