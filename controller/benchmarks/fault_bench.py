"""The fault suite's long form (issue 14's figures): every scenario, bigger and repeated.

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/fault_bench.py [--scenarios apiserver,etcd,...] [--kills 50]

Each scenario runs on a control plane of its own with two controller replicas under load
(``cozystack_gpu_testkit.fault_suite``; the short form is tests/integration/test_faults.py):

  apiserver  kube-apiserver killed and started again a third into each of 3 bursts;
  etcd       etcd killed and started again in 2 bursts, then 3 rounds of connection resets
             while etcd is compacted under the replicas (their watches expire: 410 Gone);
  partition  the leader's connection held (not closed) 3 times while its writes are on
             the way; its late writes checked in the API server's audit log;
  kills      SIGKILL of a replica (the leader 7 times in 10) at random moments, --kills
             times, bursts of orders throughout; the rules checked after every kill;
  slow       every chunk to and from the API server delayed 0.2 s for a minute of bursts;
  webhooks   the webhooks' endpoint gone 3 times under load.

Prints one line per scenario, a table for BENCHMARKS.md and the totals, and exits 1 when
any invariant was broken. Figures per scenario: seconds until healthy again after each
fault (worst), orders decided, invariant violations, faults injected, kills, invariant
rule evaluations (checks) and load operations whose outcome was checked.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cozystack_gpu_testkit import fault_suite
from cozystack_gpu_testkit.fault_suite import Result, WebhookSetup

# The chart's webhook configurations as the admission tests render them (helm template).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import admission_env


def webhook_setup() -> WebhookSetup:
    return WebhookSetup(
        configurations=lambda service: admission_env.configurations(
            service, f"bench-{service.port}"
        ),
        install=admission_env.install,
        remove=admission_env.remove,
    )


def scenarios(kills: int) -> dict[str, Callable[[Path], Result]]:
    return {
        "apiserver": lambda d: fault_suite.apiserver_restarts(d, restarts=3, burst=300),
        "etcd": lambda d: fault_suite.etcd_restarts(d, restarts=2, burst=300, expiries=3),
        "partition": lambda d: fault_suite.partition(d, cuts=3, hold_s=8.0, burst=300),
        "kills": lambda d: fault_suite.kills(d, count=kills, gap_s=(1.0, 5.0), burst=100),
        "slow": lambda d: fault_suite.slow_api(d, delay=0.2, span_s=60.0, burst=600),
        "webhooks": lambda d: fault_suite.webhooks_down(d, webhook_setup(), outages=3),
    }


def table(results: list[Result]) -> str:
    rows = [
        "| scenario | healthy again (worst / bound) | orders decided | violations | faults | "
        "kills | checks | operations | wall | other figures |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        other = "; ".join(f"{k} {v}" for k, v in r.figures.items())
        rows.append(
            f"| {r.scenario} | {r.worst_healthy_s:.1f} s / {r.healthy_bound_s:.0f} s | "
            f"{r.decided} | {len(r.violations)} | {r.faults} | {r.kills} | {r.checks} | "
            f"{r.operations} | {r.wall_s:.0f} s | {other} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--scenarios", default="apiserver,etcd,partition,kills,slow,webhooks")
    parser.add_argument("--kills", type=int, default=50)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    chosen = args.scenarios.split(",")
    known = scenarios(args.kills)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"unknown scenarios {unknown}; choose from {sorted(known)}")
    results: list[Result] = []
    started = time.monotonic()
    for name in chosen:
        workdir = Path(tempfile.mkdtemp(prefix=f"fault-bench-{name}-"))
        result = known[name](workdir)
        results.append(result)
        print(f"[{name}] {result.summary()}", flush=True)
        for violation in result.violations:
            print(f"    VIOLATION {violation}", flush=True)
    print()
    print(table(results))
    print()
    print(
        f"totals: {sum(r.kills for r in results)} kills survived, "
        f"{sum(r.faults for r in results)} faults injected, "
        f"{sum(r.operations for r in results)} operations checked, "
        f"{sum(r.checks for r in results)} invariant checks, "
        f"{sum(r.decided for r in results)} orders decided, "
        f"{sum(len(r.violations) for r in results)} violations, "
        f"{time.monotonic() - started:.0f} s"
    )
    return 1 if any(r.violations for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
