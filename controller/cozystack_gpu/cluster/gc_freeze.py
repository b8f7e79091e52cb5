"""Keep the cache out of CPython's full garbage collections.

The process holds every watched object: tens of thousands of claims, decoded JSON, dicts
and lists with no reference cycles, freed by reference counting when an update replaces
them. CPython's full collection walks every tracked object each time it runs, all of it
holding the GIL. With 10,000 claims in the cache a full collection took 340-580 ms on two
shared cores, about every 30 s of a burst of orders, and the binds of that moment waited
behind it (the burst's p99 was these pauses, nothing else).

What survives a full collection is alive and, for the cache, stays alive until it is
replaced: ``SurvivorFreezer`` moves it to the permanent generation (``gc.freeze``) after
each full collection, so the next one walks only what came since. Reference counting
still frees frozen objects; only a reference cycle that was alive at a freeze and dropped
later is never collected, and the cache makes none.
"""

from __future__ import annotations

import gc
import logging
import threading

log = logging.getLogger(__name__)

LOOK_EVERY_S = 1.0


def full_collections() -> int:
    return int(gc.get_stats()[-1]["collections"])


class SurvivorFreezer:
    """Freezes what survived each full collection, looked for every ``LOOK_EVERY_S``
    from a thread of its own (not from a gc callback: a collection is not over there)."""

    def __init__(self) -> None:
        self._seen = full_collections()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gc-freeze", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def look(self) -> bool:
        """Freeze if a full collection ran since the last look; whether it did."""
        done = full_collections()
        if done == self._seen:
            return False
        self._seen = done
        # The young generations first: garbage made since the full collection goes now,
        # not into the permanent generation.
        gc.collect(1)
        gc.freeze()
        return True

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY_S):
            try:
                self.look()
            except Exception:  # never let the freezer end the process
                log.exception("gc freeze failed")
