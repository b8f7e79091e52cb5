"""Fixtures of the node agent's unit tests: sysfs trees and a fake kubelet on a real socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cozystack_gpu_testkit.fake_kubelet import FakeKubelet


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    # A short path: unix socket paths are limited to about 100 bytes.
    fake = FakeKubelet(str(tmp_path / "kubelet.sock"))
    fake.start()
    try:
        yield fake
    finally:
        fake.stop()
