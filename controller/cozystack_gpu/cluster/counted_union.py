"""The union of named sets, kept by counting each member over the sets that hold it: one
set's change updates the union without reading the others (the view's GPU resource names,
from classes, GPUNodes, nodes and the hoster's list; the names agents found to be other
devices')."""

from __future__ import annotations

from collections.abc import Hashable, Iterator


class CountedUnion:
    def __init__(self) -> None:
        self._sets: dict[Hashable, frozenset[str]] = {}
        self._counts: dict[str, int] = {}

    def set(self, source: Hashable, members: frozenset[str]) -> bool:
        """``source``'s set is now ``members`` (empty: it has none); True when the union
        changed."""
        old = self._sets.get(source, frozenset())
        if members == old:
            return False
        if members:
            self._sets[source] = members
        else:
            self._sets.pop(source, None)
        changed = False
        for member in old - members:
            left = self._counts[member] - 1
            if left:
                self._counts[member] = left
            else:
                del self._counts[member]
                changed = True
        for member in members - old:
            self._counts[member] = self._counts.get(member, 0) + 1
            changed = changed or self._counts[member] == 1
        return changed

    def members(self) -> frozenset[str]:
        return frozenset(self._counts)

    def __iter__(self) -> Iterator[str]:
        return iter(self._counts)

    def __contains__(self, member: object) -> bool:
        return member in self._counts
