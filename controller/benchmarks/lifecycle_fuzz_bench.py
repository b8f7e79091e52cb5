"""The start path's lifecycle fuzz, long form (issue 18, "the proof"): N seeds x M
operations, each seed on a control plane of its own with KubeVirt's own virt-controller
(see ``cozystack_gpu_testkit.fuzz``).

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/lifecycle_fuzz_bench.py [--seeds 1,2,3 | --count 5] \
        [--operations 300] [--journal DIR]

The short form is tests/integration/test_lifecycle_fuzz.py (one seed, in ``make test``).
Prints one line per seed (operations run, faults injected, leader kills, VM starts,
invariant rule evaluations and looks, violations), each violation with the operations that
touched its subject, a table for BENCHMARKS.md and the totals; exits 1 when any invariant
was broken. ``--journal`` writes each seed's whole operation log there.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from cozystack_gpu_testkit.fault_suite import WebhookSetup
from cozystack_gpu_testkit.fuzz import Admission, FuzzResult, FuzzSettings, LifecycleFuzz

# The chart's webhook configurations and policies as the admission tests render them.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "integration"))
import admission_env


def chart_admission() -> Admission:
    return Admission(
        webhooks=WebhookSetup(
            configurations=lambda service: admission_env.configurations(
                service, f"bench-{service.port}"
            ),
            install=admission_env.install,
            remove=admission_env.remove,
        ),
        render=admission_env.helm_template,
    )


def table(results: list[FuzzResult]) -> str:
    rows = [
        "| seed | operations | faults | leader kills | VM starts | checks | looks | "
        "violations | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rows.append(
            f"| {r.seed} | {r.operations} | {r.faults} | {r.kills} | {r.starts} | {r.checks} | "
            f"{r.looks} | {len(r.violations)} | {r.wall_s:.0f} s |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--seeds", default="", help="comma-separated seeds")
    parser.add_argument("--count", type=int, default=5, help="seeds 1..N when --seeds is unset")
    parser.add_argument("--operations", type=int, default=300)
    parser.add_argument("--journal", type=Path, default=None, help="write each seed's log here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    seeds = [int(s) for s in args.seeds.split(",") if s] or list(range(1, args.count + 1))
    results = []
    for seed in seeds:
        with tempfile.TemporaryDirectory(prefix=f"lifecycle-fuzz-{seed}-") as workdir:
            settings = FuzzSettings(seed=seed, operations=args.operations)
            fuzz = LifecycleFuzz(Path(workdir), chart_admission(), settings)
            result = fuzz.run()
        results.append(result)
        print(result.report(), flush=True)
        # What each operation came to (refused, accepted, nothing to act on), so a run shows
        # that its tenant moves were made and how the cluster answered them.
        print("  outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(result.outcomes.items())))
        if args.journal is not None:
            args.journal.mkdir(parents=True, exist_ok=True)
            lines = [str(e) for e in fuzz.journal.entries]
            (args.journal / f"seed-{seed}.log").write_text("\n".join(lines) + "\n")
    print()
    print(table(results))
    total = sum(len(r.violations) for r in results)
    print(
        f"\nTotals: {len(results)} seeds, {sum(r.operations for r in results)} operations, "
        f"{sum(r.faults for r in results)} faults ({sum(r.kills for r in results)} leader "
        f"kills), {sum(r.starts for r in results)} VM starts, "
        f"{sum(r.checks for r in results)} invariant checks, {total} violations"
    )
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
