"""No part of the agent stops silently: a dead or hung refresh loop fails /healthz, and a
health server that stopped ends the refresh loop (the process then exits non-zero)."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cozystack_gpu.agent.podresources import PodResourcesUnavailable, Snapshot
from cozystack_gpu.agent.runner import Agent, serve
from cozystack_gpu_testkit import sysfs_scenarios

POLL_S = 0.05


class Fatal(BaseException):
    """Escapes every ``except Exception``: what ends a thread."""


class Kubelet:
    """A kubelet stand-in: ``behaviour`` decides what ``snapshot`` does."""

    reconnects = 0

    def __init__(self, behaviour: str) -> None:
        self.behaviour = behaviour
        self.entered = threading.Event()
        self.release = threading.Event()

    def snapshot(self) -> Snapshot:
        self.entered.set()
        if self.behaviour == "die":
            raise Fatal("the refresh thread ends here")
        if self.behaviour == "hang":
            self.release.wait(30)
        raise PodResourcesUnavailable("no kubelet in this test")


class Writer:
    node_name = "gpu-1"

    def patch_status(self, fields: dict[str, Any]) -> dict[str, Any]:
        return {"status": fields}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def healthz(server: Any) -> tuple[int, str]:
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def agent_with(tmp_path: Path, kubelet: Kubelet, clock: Clock) -> Agent:
    tree = sysfs_scenarios.t4_mdev(tmp_path / "root")
    return Agent(
        sysfs_root=str(tree.root), kubelet=kubelet, writer=Writer(), poll=POLL_S, clock=clock
    )


def run_in_thread(
    agent: Agent, stop: threading.Event
) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            agent.run(stop)
        except BaseException as exc:  # what would end the process; kept for the test
            errors.append(exc)

    thread = threading.Thread(target=target, name="refresh", daemon=True)
    thread.start()
    return thread, errors


def test_a_refresh_loop_that_died_fails_healthz_at_once(tmp_path: Path) -> None:
    clock = Clock()
    agent = agent_with(tmp_path, Kubelet("die"), clock)
    server = serve(agent, "127.0.0.1", 0)
    stop = threading.Event()
    try:
        thread, errors = run_in_thread(agent, stop)
        thread.join(5)
        assert not thread.is_alive()
        assert [type(e) for e in errors] == [Fatal], "the loop's death reaches its caller"
        # The clock has not moved: the last pass began "just now", yet the loop is dead.
        status, body = healthz(server)
    finally:
        stop.set()
        server.shutdown()
    assert status == 503, body
    assert "refresh loop died: Fatal: the refresh thread ends here" in body


def test_a_hung_refresh_fails_healthz_once_it_is_overdue(tmp_path: Path) -> None:
    clock = Clock()
    kubelet = Kubelet("hang")
    agent = agent_with(tmp_path, kubelet, clock)
    server = serve(agent, "127.0.0.1", 0)
    stop = threading.Event()
    try:
        thread, _errors = run_in_thread(agent, stop)
        assert kubelet.entered.wait(5)
        assert healthz(server)[0] == 200, "a pass in progress is healthy"
        clock.now += 3 * POLL_S + 30
        status, body = healthz(server)
    finally:
        stop.set()
        kubelet.release.set()
        server.shutdown()
    thread.join(5)
    assert status == 503, body
    assert "no refresh started for 30 s" in body


def test_the_refresh_loop_ends_when_the_health_server_stops(tmp_path: Path) -> None:
    clock = Clock()
    agent = agent_with(tmp_path, Kubelet("unavailable"), clock)
    server = serve(agent, "127.0.0.1", 0)
    stop = threading.Event()
    thread, errors = run_in_thread(agent, stop)
    try:
        assert healthz(server)[0] == 200
        server.shutdown()  # its thread ends, as if it had died
        thread.join(5)
        assert not thread.is_alive(), "the agent went on without its health server"
    finally:
        stop.set()
    assert not errors
    assert agent.failure == "thread agent-http ended"
    assert agent.problem() == "thread agent-http ended"
