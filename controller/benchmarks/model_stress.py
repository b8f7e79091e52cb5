"""Stress the placement model with random operations (not part of CI).

Drives many small random clusters through random operations (node, class, claim and
namespace events, orders judged by check_order and bound, template sets placed together,
binder passes) and checks every decision against the brute-force oracle of the property
tests: no node over capacity, no budget key over its limit on any ancestor, a set on one node
serving all its classes, best fit, plan idempotent, capacity and budgets at every step of
a pass, packing moves only unattached holds and finds room whenever the brute-force
packing oracle does; every ``--rebuild-every`` operations
the incremental snapshot is compared with a full rebuild.

    cd controller && ../.venv/bin/python benchmarks/model_stress.py --ops 1000000

Exits non-zero on the first violation, printing the seed and operation to replay it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

# The operations and the oracle live with the property tests; the stress command reuses
# them so both check the same things.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "unit" / "model"))

from model_digest import digest
from model_world import Checker, random_op, random_world


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000, help="operations in all")
    parser.add_argument("--per-world", type=int, default=300, help="operations per cluster")
    parser.add_argument("--rebuild-every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0, help="first cluster seed")
    args = parser.parse_args()

    start = time.perf_counter()
    done = decisions = plans = rebuilds = moves = judged = 0
    seed = args.seed
    while done < args.ops:
        r = random.Random(seed)
        checker = Checker.of(
            random_world(r, nodes=r.randrange(2, 9)), orders=r.randrange(16), seed=seed
        )
        for i in range(min(args.per_world, args.ops - done)):
            op = random_op(r)
            try:
                checker.apply(op)
                if (i + 1) % args.rebuild_every == 0:
                    rebuilds += 1
                    assert digest(checker.snap) == digest(checker.world.snapshot()), (
                        "rebuild differs"
                    )
            except AssertionError as err:
                print(f"VIOLATION seed={seed} op#{i} {op}: {err}", file=sys.stderr)
                return 1
            done += 1
        checker.plan_and_commit()
        decisions += checker.decisions
        plans += checker.plans
        moves += checker.packing_moves
        judged += checker.packing_judged
        seed += 1
        if seed % 50 == 0:
            rate = done / (time.perf_counter() - start)
            print(f"{done:>9} ops  {rate:,.0f} ops/s", flush=True)
    elapsed = time.perf_counter() - start
    print(
        f"stress: {done:,} random operations on {seed - args.seed} clusters in {elapsed:.0f} s; "
        f"{decisions:,} placements checked against the oracle, {plans:,} passes checked "
        f"for idempotence, {rebuilds:,} rebuild comparisons; {moves:,} packing moves checked, "
        f"{judged:,} orders left waiting for capacity checked against the packing oracle; "
        "no violation"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
