"""A controller cannot die silently: a replica whose binder or any of its threads died gives
the Lease up at once, its health probe answers 500, and the other replica binds.

Two Controller replicas run in this process against the real API server, each with its own
client, with a short Lease. Failures are injected into the leader: an exception in a plan
pass, a writer thread that dies, the election thread that dies, a loop that hangs.
kopf's own health endpoint (its ``health_reporter`` with the probe ``__main__`` registers)
serves the replicas' health.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kopf
import pytest
from binder_env import Corner
from kopf._core.engines import indexing, probing
from kubernetes import client
from kubernetes.client.rest import ApiException

# Imported for its side effect: it registers the binder's probe with kopf.
import cozystack_gpu.operator  # noqa: F401  # pylint: disable=unused-import
from cozystack_gpu import controller as controller_module
from cozystack_gpu import keys
from cozystack_gpu.binder import loop
from cozystack_gpu.cluster.informer import Source
from cozystack_gpu.controller import Controller
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.model import plan as real_plan
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, binder_config, install_extra_crds, wait_for
from cozystack_gpu_testkit.ports import free_port

pytestmark = pytest.mark.apiserver

LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5


class Fatal(BaseException):
    """Escapes every ``except Exception``: what ends a thread."""


@pytest.fixture(scope="module")
def kube(api_client: Any) -> Kube:
    install_extra_crds(api_client)
    return Kube(api_client)


class KopfHealth:
    """kopf's liveness endpoint for one replica, served on its own event loop thread."""

    def __init__(self, controller: Controller) -> None:
        self.url = f"http://127.0.0.1:{free_port()}/healthz"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        memo: Any = kopf.Memo(controller=controller)

        async def serve() -> asyncio.Task[None]:
            ready = asyncio.Event()
            task = asyncio.create_task(
                probing.health_reporter(
                    self.url,
                    memo=memo,
                    indices=indexing.OperatorIndexers().indices,
                    registry=kopf.get_default_registry(),
                    settings=kopf.OperatorSettings(),
                    ready_flag=ready,
                )
            )
            await ready.wait()
            return task

        self._task = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)

    def get(self) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def close(self) -> None:
        async def cancel() -> None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

        asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()


@dataclass
class Pair:
    kube: Kube
    id: str
    controller_ns: str
    tenant: str
    gpu_class: str
    replicas: dict[str, Controller]

    def holder(self) -> str | None:
        try:
            lease = client.CoordinationV1Api(self.kube.api).read_namespaced_lease(
                keys.LEASE_NAME_BINDER, self.controller_ns
            )
        except ApiException:
            return None
        return lease.spec.holder_identity or None

    def leader(self) -> tuple[Controller, str, Controller]:
        """The leader once its binder synced, the other replica's name, and that replica."""
        name = wait_for(self.holder, 30, "a leader")
        other = next(n for n in self.replicas if n != name)
        leader = self.replicas[name]
        wait_for(lambda: leader.binder is not None and leader.binder.synced.is_set(), 30, "sync")
        return leader, other, self.replicas[other]

    def order(self, name: str) -> None:
        self.kube.claim(self.tenant, name, self.gpu_class, 1)

    def bound(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            obj = self.kube.get_claim(self.tenant, name)
            return obj if (obj.get("status") or {}).get("phase") == "Bound" else None

        result: dict[str, Any] = wait_for(check, timeout, f"claim {name} Bound")
        return result


@pytest.fixture
def pair(control_plane: ControlPlane, kube: Kube, corner: Corner) -> Iterator[Pair]:
    corner.nodes(3, 4)
    gpu_class = corner.gpu_class()
    replicas = {
        name: Controller(
            control_plane.api_client(),
            binder_config(
                corner.controller_ns,
                identity=name,
                lease_duration=LEASE_S,
                renew_deadline=RENEW_S,
                retry_period=RETRY_S,
            ),
        )
        for name in ("r1", "r2")
    }
    for replica in replicas.values():
        replica.start()
    try:
        yield Pair(kube, corner.id, corner.controller_ns, corner.tenant, gpu_class, replicas)
    finally:
        for replica in replicas.values():
            replica.stop()


def assert_handed_over(
    pair: Pair, failed: Controller, other: str, since: float, within: float = LEASE_S
) -> float:
    """The failed replica let go (the other holds the Lease ``within`` seconds) and the other
    binds a new order; returns the seconds from ``since`` until that order was Bound."""
    wait_for(lambda: pair.holder() == other, within, f"{other} holding the lease")
    assert not failed.elector.is_leader()
    # It gave the Lease up for good: its binder stopped, and no standby replaces it.
    wait_for(lambda: failed.binder is None, 15, "the failed binder stopped")
    pair.order("after")
    bound = pair.bound("after")
    took = time.monotonic() - since
    assert bound["status"]["nodeName"].endswith(pair.id)
    # It gave up for good: it does not take the Lease again.
    time.sleep(4 * RETRY_S)
    assert pair.holder() == other
    assert not failed.elector.is_leader()
    return took


def test_a_binder_that_raises_hands_the_lease_over_and_fails_kopfs_probe(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    leader, other, standby = pair.leader()
    pair.order("before")
    pair.bound("before")

    raised: list[float] = []

    def plan_that_raises_once(*args: Any, **kwargs: Any) -> Any:
        if not raised:
            raised.append(time.monotonic())
            raise RuntimeError("injected into a pass")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr("cozystack_gpu.binder.loop.plan", plan_that_raises_once)
    pair.order("trigger")  # a change: the next pass plans, and raises
    wait_for(lambda: raised, 10, "the injected failure")
    took = assert_handed_over(pair, leader, other, raised[0])
    print(f"\n[binder raised] a new order was Bound by {other} {took:.1f} s after the failure")
    pair.bound("trigger")  # the order the failed pass held is bound by the new leader

    assert leader.problems() == ["binder loop failed: RuntimeError: injected into a pass"]
    assert leader.elector.failure == leader.problems()[0]
    assert standby.problems() == []

    failed_probe, healthy_probe = KopfHealth(leader), KopfHealth(standby)
    try:
        status, body = failed_probe.get()
        assert status == 500, body
        status, body = healthy_probe.get()
        assert status == 200, body
        # Other probes (the webhooks') may answer beside the binder's.
        answer = json.loads(body)["binder"]
        assert answer == {"leader": True, "synced": True, "problems": []}
    finally:
        failed_probe.close()
        healthy_probe.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_writer_thread_that_dies_hands_the_lease_over(pair: Pair) -> None:
    leader, other, _standby = pair.leader()
    binder = leader.binder
    assert binder is not None
    writer = binder.writer
    real_patch = writer.clients.custom.patch_namespaced_custom_object_status
    died: list[float] = []

    def patch_that_kills_its_thread(*args: Any, **kwargs: Any) -> Any:
        if not died:
            died.append(time.monotonic())
            raise Fatal("a writer thread ends")
        return real_patch(*args, **kwargs)

    writer.clients.custom.patch_namespaced_custom_object_status = patch_that_kills_its_thread
    pair.order("trigger")
    wait_for(lambda: died, 10, "the writer's death")
    took = assert_handed_over(pair, leader, other, died[0])
    print(f"\n[writer died] a new order was Bound by {other} {took:.1f} s after the death")
    pair.bound("trigger")
    [problem] = leader.problems()
    assert problem.startswith("binder threads died: writer-"), problem


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_informer_thread_that_dies_hands_the_lease_over(pair: Pair) -> None:
    leader, other, _standby = pair.leader()
    binder = leader.binder
    assert binder is not None
    informer = binder._threads.informers.informer(keys.GPU_CLASS.kind)
    assert informer is not None
    died: list[float] = []

    def list_that_kills_its_thread(**kwargs: Any) -> Any:
        died.append(time.monotonic())
        raise Fatal("an informer thread ends")

    informer._source = Source(keys.GPU_CLASS.kind, list_that_kills_its_thread)
    # End its watch: the informer lists again, and dies there.
    assert informer._watch is not None
    informer._watch.stop()
    wait_for(lambda: died, 10, "the informer's death")
    took = assert_handed_over(pair, leader, other, died[0])
    print(f"\n[informer died] a new order was Bound by {other} {took:.1f} s after the death")
    assert leader.problems() == ["binder threads died: informer-GPUClass"]


def test_an_election_thread_that_dies_stops_binding_and_releases_the_lease(pair: Pair) -> None:
    leader, other, _standby = pair.leader()
    died: list[float] = []

    def renew_that_kills_the_thread() -> None:
        died.append(time.monotonic())
        raise Fatal("the election thread ends")

    leader.elector._try_acquire_or_renew = renew_that_kills_the_thread  # type: ignore[method-assign]
    wait_for(lambda: died, 10, "the election thread's death")
    # Released, not expired: the other replica holds the Lease well within a lease duration.
    wait_for(lambda: pair.holder() == other, LEASE_S, f"{other} holding the lease")
    took = assert_handed_over(pair, leader, other, died[0])
    print(f"\n[election died] a new order was Bound by {other} {took:.1f} s after the death")
    assert leader.problems() == ["leader election thread died: Fatal: the election thread ends"]


def test_a_binder_loop_that_hangs_hands_the_lease_over(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(controller_module, "STALL_S", 2.0)
    leader, other, _standby = pair.leader()
    hung: list[float] = []
    release = threading.Event()

    def plan_that_hangs_once(*args: Any, **kwargs: Any) -> Any:
        if not hung:
            hung.append(time.monotonic())
            release.wait(60)
        return real_plan(*args, **kwargs)

    monkeypatch.setattr("cozystack_gpu.binder.loop.plan", plan_that_hangs_once)
    try:
        pair.order("trigger")
        wait_for(lambda: hung, 10, "the hang")
        wait_for(lambda: leader.elector.failure, 10, "the stall noticed")
        assert leader.elector.failure is not None
        assert leader.elector.failure.startswith("the binder loop made no progress for ")
        # Stopping the binder waits a while for its hung thread before the release: the
        # Lease may expire first, which takes a lease duration and a retry period at most.
        assert_handed_over(pair, leader, other, hung[0], within=LEASE_S + 2 * RETRY_S)
        pair.bound("trigger")
    finally:
        release.set()


def test_a_standby_keeps_a_current_snapshot_writes_nothing_and_binds_once_it_leads(
    pair: Pair,
) -> None:
    """The standby's binder is warm: every order the leader binds is in its snapshot as
    Bound there, while it has turned no deciding loop and sent no write; the leader killed
    (its binder stopped, its Lease left to expire), the standby binds on that snapshot."""
    leader, other, standby = pair.leader()
    pair.order("held")
    held = pair.bound("held")
    warm = standby.binder
    assert warm is not None
    key = ClaimKey(pair.tenant, "held")

    def in_standby_snapshot() -> bool:
        claim = warm.snapshot.claim(key)
        return claim is not None and claim.node == held["status"]["nodeName"]

    wait_for(in_standby_snapshot, 10, "the bind in the standby's snapshot")
    assert warm.synced.is_set()
    assert (warm.stats.loops, sum(warm.writer.sent.values()), warm.stats.binds) == (0, 0, 0), (
        "a standby decided or wrote"
    )
    assert not standby.elector.is_leader()
    # A standby's loop turns once per tick or batch of the leader's echoes, and does not
    # spin (it once turned without waiting, a core's worth of CPU for nothing).
    turns = warm.stats.standby_turns
    time.sleep(2.0)
    idle = warm.stats.standby_turns - turns
    assert idle <= 10 * (2.0 / loop.TICK_S), f"the standby's loop turned {idle} times in 2 s"
    # The leader goes without handing the Lease back, as a killed process does.
    leader.elector.stop(release=False)
    leader._stop_binding()
    wait_for(lambda: pair.holder() == other, 4 * LEASE_S, f"{other} holding the lease")
    assert standby.binder is warm, "the standby's binder was replaced instead of leading"
    pair.order("after")
    pair.bound("after")
    # The binder counts a bind when it takes the write's answer, which may come after the
    # watch event the test saw: wait for the count, then it must be exactly this one.
    wait_for(lambda: warm.stats.binds >= 1, 10, "the new leader's binder to count its bind")
    assert warm.stats.binds == 1


def test_kopfs_part_waits_until_the_first_bind_is_answered(
    control_plane: ControlPlane, kube: Kube, corner: Corner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A starting leader's first bind is not kept waiting by the webhooks' part: kopf's
    import and the admission snapshot come once the first pass's first write is answered,
    not while it is in flight (they would share the interpreter with that answer)."""
    monkeypatch.setattr(controller_module, "FEED_WAIT_S", 120.0)
    corner.nodes(1, 2)
    gpu_class = corner.gpu_class()
    kube.claim(corner.tenant, "first", gpu_class, 1)
    release = threading.Event()
    held: list[float] = []
    real_patch = client.CustomObjectsApi.patch_namespaced_custom_object_status

    def held_patch(self: client.CustomObjectsApi, *args: Any, **kwargs: Any) -> Any:
        held.append(time.monotonic())
        release.wait(30)
        return real_patch(self, *args, **kwargs)

    monkeypatch.setattr(
        client.CustomObjectsApi, "patch_namespaced_custom_object_status", held_patch
    )
    replica = Controller(
        control_plane.api_client(),
        binder_config(
            corner.controller_ns,
            identity="alone",
            lease_duration=LEASE_S,
            renew_deadline=RENEW_S,
            retry_period=RETRY_S,
        ),
    )
    replica.start()
    try:
        wait_for(lambda: held, 30, "the first bind sent")
        binder = replica.binder
        assert binder is not None and binder.stats.passes > 0 and binder.inflight
        assert not replica.first_pass_or_standby(), "kopf's part came while the bind was out"
        # A slow API server does not keep the webhooks out for good: FEED_WAIT_S after the
        # start they come whatever the bind's answer.
        monkeypatch.setattr(controller_module, "FEED_WAIT_S", 0.0)
        assert replica.first_pass_or_standby(), "an unanswered bind kept the webhooks out"
        monkeypatch.setattr(controller_module, "FEED_WAIT_S", 120.0)
        assert binder.inflight, "the bind was answered before the release"
        release.set()
        wait_for(lambda: binder.stats.binds > 0, 30, "the first bind answered")
        assert replica.first_pass_or_standby()
    finally:
        release.set()
        replica.stop()
