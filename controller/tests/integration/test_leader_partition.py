"""A leader cut off from the API server stops leading at its renew deadline, not later.

Found by the fault suite (leader partitioned mid-burst): each renewal request had the renew
deadline as its timeout, but the client's connection pool repeats a GET whose read timed
out (three more times by default), so a cut-off leader noticed the loss of its Lease four
deadlines after its last renewal, long after another replica had taken over, and only then
stopped its binder. The elector's client now repeats nothing: a failed round is the next
round's to retry.

The elector reaches the real API server through a proxy; the test cuts it (bytes held, the
connection left open, as behind a partition).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest

from cozystack_gpu.leader import LeaderElector, LeaseTiming
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube
from cozystack_gpu_testkit.proxy import Proxy

pytestmark = pytest.mark.apiserver

TIMING = LeaseTiming(lease_duration=3.0, renew_deadline=2.0, retry_period=0.5)


def test_a_cut_off_leader_stops_leading_by_its_renew_deadline(
    control_plane: ControlPlane, api_client: Any
) -> None:
    namespace = f"ctl-{uuid.uuid4().hex[:8]}"
    Kube(api_client).namespace(namespace)
    port = int(control_plane.server.rsplit(":", 1)[1])
    started, stopped = threading.Event(), threading.Event()
    with Proxy(("127.0.0.1", port)) as proxy:
        api = control_plane.api_client()
        api.configuration.host = f"https://{proxy.address}"
        elector = LeaderElector(
            api,
            namespace=namespace,
            name="partition-test",
            identity="cut-off",
            timing=TIMING,
            on_started=started.set,
            on_stopped=stopped.set,
        )
        elector.start()
        try:
            assert started.wait(15), "the elector never led"
            time.sleep(2 * TIMING.retry_period)  # a few renewals on a healthy link
            assert elector.is_leader()
            proxy.cut()
            cut_at = time.monotonic()
            assert stopped.wait(20), "the cut-off leader never stopped leading"
            took = time.monotonic() - cut_at
            # The last renewal began at most a retry period before the cut; the round that
            # notices times out one renew deadline after it began (a second of slack for
            # a busy machine). Repeated reads took four deadlines.
            assert took <= TIMING.renew_deadline + TIMING.retry_period + 1.0, took
            assert not elector.is_leader()
        finally:
            proxy.heal()
            elector.stop(release=True)


def test_a_leader_behind_a_slow_link_whose_start_takes_long_keeps_leading(
    control_plane: ControlPlane, api_client: Any
) -> None:
    """Starting the binder runs in the elector's thread and may take most of the first
    validity; the next renewal, a slow round trip, must still succeed (a renewal cut to
    the time left made such a leader lose the Lease every two seconds)."""
    namespace = f"ctl-{uuid.uuid4().hex[:8]}"
    Kube(api_client).namespace(namespace)
    port = int(control_plane.server.rsplit(":", 1)[1])
    stops: list[float] = []
    started = threading.Event()

    def slow_start() -> None:
        time.sleep(1.5)
        started.set()

    with Proxy(("127.0.0.1", port)) as proxy, proxy.slowed(0.15):
        api = control_plane.api_client()
        api.configuration.host = f"https://{proxy.address}"
        elector = LeaderElector(
            api,
            namespace=namespace,
            name="slow-test",
            identity="slow",
            timing=TIMING,
            on_started=slow_start,
            on_stopped=lambda: stops.append(time.monotonic()),
        )
        elector.start()
        try:
            assert started.wait(20), "the elector never led"
            time.sleep(3 * TIMING.lease_duration)
            assert not stops, "the leader lost its Lease behind a slow link"
            assert elector.is_leader()
        finally:
            elector.stop(release=True)
