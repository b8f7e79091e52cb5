"""What survives a full collection is frozen, and the collector still frees what it must:
a cycle made after the freeze, and (by reference counting) a frozen object dropped."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from cozystack_gpu.cluster.gc_freeze import SurvivorFreezer


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_what_survives_a_full_collection_is_frozen_once() -> None:
    freezer = SurvivorFreezer()
    assert not freezer.look(), "no full collection since it started"
    kept = [Node() for _node in range(100)]
    gc.collect()
    assert freezer.look()
    assert gc.get_freeze_count() >= len(kept)
    walked = {id(o) for generation in range(3) for o in gc.get_objects(generation)}
    assert not any(id(n) in walked for n in kept), "no collection walks them again"
    assert not freezer.look(), "frozen once per full collection"


def test_a_cycle_made_after_the_freeze_is_still_collected() -> None:
    freezer = SurvivorFreezer()
    gc.collect()
    freezer.look()
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    del a, b
    gc.collect()
    assert gone() is None


def test_a_frozen_object_dropped_is_freed_by_reference_counting() -> None:
    freezer = SurvivorFreezer()
    held = Node()
    gone = weakref.ref(held)
    gc.collect()
    freezer.look()
    assert gc.get_freeze_count() > 0
    del held
    assert gone() is None
