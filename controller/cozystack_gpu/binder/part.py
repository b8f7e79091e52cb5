"""What the binder hands its parts (the gate, the reports): a narrow handle, not the binder.

A part reads the cluster view, the snapshot, the writer, the settings and the clock, and
changes claims only through ``decide``, which records the decision in the snapshot and
sends its write in one step; ``in_flight`` says which claims have a write still out, and a
part touches none of those. Those two rules each live in one method of the binder, and a
part can be tested against a fake handle (tests/unit/binder/test_parts_handle.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from cozystack_gpu.binder.writer import Writer
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.model import ClaimInfo, ClaimKey, Snapshot


class PartHandle(Protocol):
    """The binder as its parts see it."""

    @property
    def view(self) -> ClusterView: ...

    @property
    def snapshot(self) -> Snapshot: ...  # rebuilt on a fresh listing: read it each time

    @property
    def writer(self) -> Writer: ...

    @property
    def config(self) -> Config: ...

    def clock(self) -> float: ...

    def in_flight(self, keys: Iterable[ClaimKey]) -> bool:
        """Whether a placement write about any of these claims is still out."""

    def decide(self, claim: ClaimInfo, body: dict[str, Any], purpose: str) -> None:
        """Record ``claim`` as decided in the snapshot and send its status write."""


class BinderPart:
    def __init__(self, handle: PartHandle) -> None:
        self.handle = handle

    @property
    def view(self) -> ClusterView:
        return self.handle.view

    @property
    def snapshot(self) -> Snapshot:
        return self.handle.snapshot

    @property
    def writer(self) -> Writer:
        return self.handle.writer

    @property
    def config(self) -> Config:
        return self.handle.config
