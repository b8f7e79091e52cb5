"""Bringing one kind of the binder's model inputs up to date from the view."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def sync_kind(
    names: Iterable[Any],
    build: Callable[[Any], Any],
    current: Callable[[Any], Any],
    upsert: Callable[[Any], None],
    remove: Callable[[Any], None],
) -> bool:
    """Bring one kind of model input up to date; True when the model saw a change."""
    changed = False
    for name in names:
        fresh = build(name)
        if fresh is None:
            changed |= current(name) is not None
            remove(name)
        elif current(name) != fresh:
            upsert(fresh)
            changed = True
    return changed
