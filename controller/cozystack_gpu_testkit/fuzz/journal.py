"""The run's journal: every operation, what KubeVirt did and what the kit played, with its
outcome and the names it touched (``Journal``); a violation with the operations that
touched its subject up to when it was first seen (``Finding``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Entry:
    """One operation (or what KubeVirt did, or the kit did as kubelet or virt-handler) and
    what came of it."""

    index: int
    at: float  # seconds into the run
    op: str
    args: str
    outcome: str
    names: frozenset[str]  # the VMs, claims and nodes it touched

    def __str__(self) -> str:
        return f"#{self.index:04d} +{self.at:6.1f}s {self.op} {self.args} -> {self.outcome}"


@dataclass(frozen=True)
class Finding:
    """A violation, the operation after which it was first seen, and the operations that
    touched its subject up to then."""

    violation: str
    first_seen_after: int
    sequence: tuple[str, ...]


class Journal:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.entries: list[Entry] = []
        self.started = time.monotonic()
        self._lock = threading.Lock()

    @property
    def last(self) -> int:
        return self.entries[-1].index if self.entries else 0

    def record(self, op: str, args: str, outcome: str, names: Iterable[str]) -> Entry:
        with self._lock:
            entry = Entry(
                len(self.entries) + 1,
                time.monotonic() - self.started,
                op,
                args,
                outcome,
                frozenset(n for n in names if n),
            )
            self.entries.append(entry)
        log.info("seed %d %s", self.seed, entry)
        return entry

    def touching(self, names: set[str], until: int) -> list[Entry]:
        return [e for e in self.entries if e.index <= until and e.names & names]
