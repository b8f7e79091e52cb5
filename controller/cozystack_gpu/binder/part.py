"""What the binder's parts (the gate, the reports) share: the binder's view, snapshot,
writer and settings, read through the binder, since the snapshot is rebuilt on a fresh
listing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from cozystack_gpu.binder.writer import Writer
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.config import Config
from cozystack_gpu.model import Snapshot

if TYPE_CHECKING:
    from cozystack_gpu.binder.loop import Binder


class BinderPart:
    def __init__(self, binder: Binder) -> None:
        self.binder = binder

    @property
    def view(self) -> ClusterView:
        return self.binder.view

    @property
    def snapshot(self) -> Snapshot:
        return self.binder.snapshot

    @property
    def writer(self) -> Writer:
        return self.binder.writer

    @property
    def config(self) -> Config:
        return self.binder.config
