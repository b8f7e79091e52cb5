"""Ready means synced and listening: /readyz says 503, with the reason, until the admission
feed has read the cluster and the webhook server listens on its port, and 200 only then
(kubelet keeps the replica out of the webhook Service, where kube-apiserver would be refused
a connection)."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from kubernetes import client
from test_admission_feed import full_listing

from cozystack_gpu.admission import handlers
from cozystack_gpu.admission.readiness import ReadinessServer
from cozystack_gpu_testkit.objects import binder_config


def get(port: int, path: str = "/readyz") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def admission() -> Iterator[handlers.Admission]:
    # Never started: the test hands the feed the events its informers would.
    built = handlers.build(client.ApiClient(), binder_config("ctl"))
    try:
        yield built
    finally:
        built.pool.shutdown(wait=False)


def test_a_replica_is_ready_only_once_its_feed_has_read_the_cluster_and_its_webhooks_listen(
    admission: handlers.Admission,
) -> None:
    memo: dict[str, handlers.Admission] = {}
    server = ReadinessServer(0, lambda: handlers.not_ready(memo.get("admission")), "127.0.0.1")
    server.start()
    try:
        assert get(server.port) == (503, "not ready: the admission webhooks are starting\n")
        memo["admission"] = admission
        status, body = get(server.port)
        assert status == 503, "ready before the first listing"
        assert "has not finished reading the cluster" in body
        admission.feed.take(full_listing())
        # Synced, but kube-apiserver would be refused at the webhook port: not yet.
        status, body = get(server.port)
        assert status == 503, "ready before the webhook server listens"
        assert "not listening yet" in body
        admission.listening.set()
        assert get(server.port) == (200, "ok\n")
        admission.feed._threads.failure = "RuntimeError: boom"
        assert get(server.port)[0] == 503
        assert get(server.port, "/healthz")[0] == 404
    finally:
        server.stop()
