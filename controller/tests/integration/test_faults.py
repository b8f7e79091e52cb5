"""The fault suite, short form: each fault once (SIGKILL a few times), under load, on a
control plane of its own, judged by ``invariants.Invariants`` on the real API server.

The scenarios live in ``cozystack_gpu_testkit.fault_suite``; ``benchmarks/fault_bench.py``
runs them longer and records their figures in BENCHMARKS.md. Each test prints its figures
(``pytest -s``) and fails on any invariant violation, on an order lost, on a replica left
unhealthy, or when the controller took longer than the scenario's stated time to be
healthy again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from admission_env import configurations, install, remove

from cozystack_gpu_testkit import fault_suite
from cozystack_gpu_testkit.fault_suite import Result, WebhookSetup

pytestmark = pytest.mark.apiserver


def clean(result: Result) -> Result:
    print(f"\n[faults] {result.summary()}")
    assert not result.violations, "\n".join(result.violations)
    assert result.decided > 0, "no order was decided during the run"
    return result


def test_a_kube_apiserver_restarted_mid_burst_loses_and_doubles_nothing(tmp_path: Path) -> None:
    clean(fault_suite.apiserver_restarts(tmp_path, restarts=1, burst=100))


def test_etcd_restarted_mid_burst_and_expired_watches_lose_and_double_nothing(
    tmp_path: Path,
) -> None:
    result = clean(fault_suite.etcd_restarts(tmp_path, restarts=1, burst=100, expiries=1))
    assert result.figures["410s"] >= 1, "no watch expired: the scenario did not force a 410"


def test_a_partitioned_leader_stops_and_its_late_writes_are_refused(tmp_path: Path) -> None:
    result = clean(fault_suite.partition(tmp_path, cuts=1, hold_s=6.0, burst=100))
    assert result.figures["take-over s"] <= fault_suite.LEASE_S + 5
    assert result.figures["late writes"] >= 1, "the cut held no write: nothing arrived late"


def test_sigkill_at_random_moments_keeps_every_invariant(tmp_path: Path) -> None:
    result = clean(fault_suite.kills(tmp_path, count=3, gap_s=(0.5, 2.5), burst=40))
    assert result.kills == 3


def test_a_slow_api_server_keeps_the_binder_deciding_with_bounded_writes(
    tmp_path: Path,
) -> None:
    result = clean(fault_suite.slow_api(tmp_path, delay=0.15, span_s=10.0, burst=100))
    assert result.figures["claim writes"] > 0
    assert result.figures["RSS growth MiB"] < 64, result.figures


def test_with_the_webhooks_down_claims_are_refused_and_starts_resume_by_themselves(
    tmp_path: Path,
) -> None:
    # The chart's configurations as the admission tests render them; a Service has what
    # they read of a replica (namespace, port, ca_pem).
    setup = WebhookSetup(
        configurations=lambda service: configurations(service, f"faults-{service.port}"),
        install=install,
        remove=remove,
    )
    result = clean(fault_suite.webhooks_down(tmp_path, setup, outages=1, down_s=6.0))
    assert result.figures["VM starts"] >= 6
