"""Every write the binder sends reports back to its loop, whatever the network does.

The loop holds a claim "in flight" until its write reports; a write that never reports
blocks every later plan touching that claim. Here the API server is replaced by what a
restart or a partition looks like from the client: a port that refuses connections, and
one that accepts them and never answers. Every kind of job must still end in a result.
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from cozystack_gpu.binder import writer as writer_module
from cozystack_gpu.binder.writer import (
    ClaimWriteDone,
    Outcome,
    Priority,
    WriteDone,
    WriteKind,
    Writer,
)
from cozystack_gpu.model import ClaimKey

TIMEOUT_S = (0.5, 0.5)


class SilentServer:
    """Accepts connections and reads requests, but never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                continue
            self._conns.append(conn)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        for conn in self._conns:
            conn.close()
        self.sock.close()


def api_at(port: int) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    return client.ApiClient(configuration)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once it is closed


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


def send_one_of_each(writer: Writer) -> int:
    claim = {"metadata": {"name": "c", "namespace": "t", "uid": "u"}}
    writer.claim_status(ClaimKey("t", "c"), {"status": {}}, "Bind", Priority.BIND)
    writer.claim_status(ClaimKey("t", "w"), {"status": {}}, "Wait", Priority.STATUS)
    writer.class_status("h100", {"status": {}})
    writer.create_record("t", {"metadata": {"name": "r"}, "status": {}})
    writer.delete_record("t", "r")
    writer.delete_vmi("t", "vm")
    writer.settings("cozy-gpu", {"resourceNames": ""})
    writer.event(claim, "Bound", "bound", False)
    writer.call(
        WriteKind.FINALIZER, "t", "c", writer.custom.get_api_resources, object_kind="GPUClaim"
    )
    return 9


def results_of(results: queue.Queue[Any], count: int, timeout: float) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(got)} of {count} writes reported back: {got}"
        try:
            got.append(results.get(timeout=left))
        except queue.Empty:
            continue
    return got


def assert_all_failed(got: list[Any]) -> None:
    claims = {r.key.name: r for r in got if isinstance(r, ClaimWriteDone)}
    others = {r.what: r for r in got if isinstance(r, WriteDone)}
    assert set(claims) == {"c", "w"}
    for done in claims.values():
        assert done.outcome is Outcome.FAILED and done.obj is None, done
        assert done.error, "a failure says what went wrong"
    assert set(others) == {
        "class-status",
        "record",
        "record-delete",
        "vmi-delete",
        "settings",
        "event",
        "finalizer",
    }
    for other in others.values():
        assert not other.ok and other.error, other


def test_every_write_reports_back_when_the_server_refuses_connections() -> None:
    results: queue.Queue[Any] = queue.Queue()
    writer = Writer(api_at(closed_port()), results, workers=3)
    writer.start()
    try:
        count = send_one_of_each(writer)
        got = results_of(results, count, timeout=30)
    finally:
        writer.stop()
    assert_all_failed(got)
    assert "MaxRetryError" in next(r for r in got if isinstance(r, ClaimWriteDone)).error


def test_every_write_reports_back_when_the_server_never_answers(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(writer_module, "REQUEST_TIMEOUT_S", TIMEOUT_S)
    results: queue.Queue[Any] = queue.Queue()
    writer = Writer(api_at(silent.port), results, workers=9)
    writer.start()
    started = time.monotonic()
    try:
        count = send_one_of_each(writer)
        got = results_of(results, count, timeout=30)
    finally:
        writer.stop()
    assert_all_failed(got)
    # Each request ended at its timeout; the claim's follow-up read too.
    assert time.monotonic() - started < 10


def test_jobs_still_queued_when_the_writer_stops_report_back_unsent() -> None:
    results: queue.Queue[Any] = queue.Queue()
    writer = Writer(api_at(closed_port()), results, workers=1)
    writer.start()
    busy, release = threading.Event(), threading.Event()

    def slow_request() -> dict[str, Any]:
        busy.set()
        release.wait(10)
        return {}

    writer.call(WriteKind.POD_PIN, "t", "x", slow_request)
    assert busy.wait(5)
    for i in range(5):
        writer.claim_status(ClaimKey("t", f"c{i}"), {"status": {}}, "Bind", Priority.BIND)
    stopping = threading.Thread(target=writer.stop)
    stopping.start()
    time.sleep(0.2)  # stop() has marked the writer stopped before the worker is free
    release.set()
    stopping.join(10)
    got = results_of(results, 6, timeout=10)
    claims = [r for r in got if isinstance(r, ClaimWriteDone)]
    assert len(claims) == 5
    for done in claims:
        assert done.outcome is Outcome.FAILED, done
        assert done.error.startswith("WriterStopped"), done
