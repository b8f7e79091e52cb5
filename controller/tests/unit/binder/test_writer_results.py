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

from cozystack_gpu import keys
from cozystack_gpu.binder import calls
from cozystack_gpu.binder.calls.base import Answer, Call, Clients, Outcome, Priority
from cozystack_gpu.binder.calls.claims import ClaimNote, Decision, Note
from cozystack_gpu.binder.calls.reports import (
    ClassStatus,
    EventWrite,
    Finalizer,
    GpuNodeStatus,
    RecordCreate,
    RecordDelete,
    RecordStatus,
    Settings,
)
from cozystack_gpu.binder.calls.start_path import (
    ClaimCreate,
    ClaimDelete,
    PodDelete,
    PodPin,
    VmiDelete,
)
from cozystack_gpu.binder.rules.events import EventBook
from cozystack_gpu.binder.writer import Writer

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


def one_of_each() -> list[Call]:
    """One call of every type the binder sends."""
    claim = {"metadata": {"name": "c", "namespace": "t", "uid": "u"}}
    told, _needs_write = EventBook("test").tell(
        claim, keys.GPU_CLAIM, "Bound", "bound", False, 1_800_000_000.0
    )
    return [
        Decision("t", "c", {"status": {}}, "Bind"),
        ClaimNote("t", "w", {"status": {}}, Note.WAIT),
        PodPin("t", "virt-launcher-vm", {"spec": {}}),
        PodDelete("t", "virt-launcher-old", "uid-old"),
        ClaimCreate("t", "vm-gpu", {"metadata": {"name": "vm-gpu"}}),
        VmiDelete("t", "vm"),
        ClaimDelete("t", "vm-gpu", "uid-gpu", "its VMI is gone"),
        Finalizer(keys.GPU_CLAIM, "t", "c", {"metadata": {"finalizers": []}}),
        ClassStatus("h100", {"status": {}}),
        GpuNodeStatus("n1", {"status": {}}),
        Settings("cozy-gpu", {"resourceNames": ""}),
        RecordCreate("t", {"metadata": {"name": "r"}, "status": {}}),
        RecordStatus("t", "r2", {"status": {}}),
        RecordDelete("t", "r3"),
        EventWrite(told, EventBook("test")),
    ]


def send_one_of_each(writer: Writer) -> int:
    sent = one_of_each()
    for call in sent:
        writer.send(call)
    return len(sent)


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
    assert all(isinstance(a, Answer) for a in got), got
    assert sorted(type(a.call).__name__ for a in got) == sorted(
        type(c).__name__ for c in one_of_each()
    ), "one answer per call"
    for answer in got:
        assert answer.outcome is Outcome.FAILED and answer.obj is None, answer
        assert answer.error, "a failure says what went wrong"


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
    assert "MaxRetryError" in next(a for a in got if isinstance(a.call, Decision)).error


def test_every_write_reports_back_when_the_server_never_answers(
    silent: SilentServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(calls.base, "REQUEST_TIMEOUT_S", TIMEOUT_S)
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


class Slow(Call):
    """A call whose request waits until it is released."""

    what = "slow"
    priority = Priority.BIND
    namespace, name = "t", "x"

    def __init__(self) -> None:
        self.busy, self.release = threading.Event(), threading.Event()

    def request(self, api: Clients) -> dict[str, Any]:
        self.busy.set()
        self.release.wait(10)
        return {}


def test_jobs_still_queued_when_the_writer_stops_report_back_unsent() -> None:
    results: queue.Queue[Any] = queue.Queue()
    writer = Writer(api_at(closed_port()), results, workers=1)
    writer.start()
    slow = Slow()
    writer.send(slow)
    assert slow.busy.wait(5)
    for i in range(5):
        writer.send(Decision("t", f"c{i}", {"status": {}}, "Bind"))
    stopping = threading.Thread(target=writer.stop)
    stopping.start()
    time.sleep(0.2)  # stop() has marked the writer stopped before the worker is free
    slow.release.set()
    stopping.join(10)
    got = results_of(results, 6, timeout=10)
    claims = [a for a in got if isinstance(a.call, Decision)]
    assert len(claims) == 5
    for answer in claims:
        assert answer.outcome is Outcome.FAILED, answer
        assert answer.error.startswith("WriterStopped"), answer
        assert answer.obj is None, "a call never sent reads nothing again"


def test_a_queued_call_a_newer_one_of_its_key_supersedes_goes_unsent() -> None:
    """Three class statuses queued behind a busy worker: the two older are answered
    SUPERSEDED without a request, and only the newest is sent."""
    results: queue.Queue[Any] = queue.Queue()
    writer = Writer(api_at(closed_port()), results, workers=1)
    writer.start()
    slow = Slow()
    try:
        writer.send(slow)
        assert slow.busy.wait(5)
        for free in (3, 2, 1):
            writer.send(ClassStatus("h100", {"status": {"free": free}}))
        writer.send(Decision("t", "c", {"status": {}}, "Bind"))  # placements never supersede
        slow.release.set()
        got = results_of(results, 5, timeout=30)
    finally:
        writer.stop()
    statuses = [a for a in got if isinstance(a.call, ClassStatus)]
    assert [a.outcome for a in statuses] == [
        Outcome.SUPERSEDED,
        Outcome.SUPERSEDED,
        Outcome.FAILED,
    ]
    assert statuses[-1].call == ClassStatus("h100", {"status": {"free": 1}}), "the newest is sent"
    assert writer.sent["class-status"] == 1
    [bind] = [a for a in got if isinstance(a.call, Decision)]
    assert bind.outcome is Outcome.FAILED, "a placement is always sent"
