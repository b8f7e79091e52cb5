"""The start path's lifecycle fuzz, short form (issue 18, "the proof"): one fixed seed, a
bounded number of random operations (VMs with held and template claims started, stopped,
restarted and deleted; tenants deleting claims, stripping finalizers, squatting template
claim names, writing odd annotations; nodes NotReady, cordoned, short of memory or of a
GPU; the leader killed) on a control plane of its own with two replicas, the chart's
webhooks and its policies, and KubeVirt's own virt-controller making the VMIs and launcher
pods behind its own virt-api's webhooks (the test kit plays only kubelet and virt-handler).
``benchmarks/lifecycle_fuzz_bench.py`` is the long form.

It fails on any violation of the invariants (``invariants.Invariants`` with its start-path
rules, looked at throughout and once settled) or of what only the driver sees (raw GPU
entries admitted without claims, a VM stranded at a refusing node), and prints each with
the operations that led to it (``pytest -s``). Before issue 18's fixes it fails: the
"before" part of BENCHMARKS.md's lifecycle fuzz section says what it finds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from admission_env import configurations, helm_template, install, remove

from cozystack_gpu_testkit.fault_suite import WebhookSetup
from cozystack_gpu_testkit.fuzz import Admission, FuzzSettings, run_seed

pytestmark = pytest.mark.apiserver

SEED = 18
OPERATIONS = 70
SETTLE_S = 90.0  # a run whose rules all hold ends after 20 s of calm


def chart_admission() -> Admission:
    """The chart's webhook configurations and policies, as the admission tests render
    them (``helm template``)."""
    return Admission(
        webhooks=WebhookSetup(
            configurations=lambda service: configurations(service, f"fuzz-{service.port}"),
            install=install,
            remove=remove,
        ),
        render=helm_template,
    )


def test_a_running_vms_hold_is_never_freed_taken_twice_or_lost(tmp_path: Path) -> None:
    settings = FuzzSettings(seed=SEED, operations=OPERATIONS, settle_s=SETTLE_S)
    result = run_seed(tmp_path, chart_admission(), settings)
    print(f"\n[lifecycle fuzz] {result.report()}")
    print(f"[lifecycle fuzz] outcomes: {result.outcomes}")
    assert result.starts > 0, "no VM ever ran: the fuzz exercised nothing"
    assert not result.violations, result.report()
