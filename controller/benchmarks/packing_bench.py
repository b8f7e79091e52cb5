"""Packing in the pure model: how many large orders bind on a cluster whose free units are
scattered, with and without moves (prints figures; not a timed test).

    cd controller && ../.venv/bin/python benchmarks/packing_bench.py [--nodes 1000] [--runs 3]

Each scenario: ``--nodes`` nodes of one class, filled to ``--fill`` with 1-unit holds each
put on a node drawn at random among those with room (not best fit: what releases leave
behind), a share of them Attached (those never move); then as many 8-unit orders as the
cluster's free units could take if they were gathered (free // 8), all Pending, and
``plan`` passes (each committed, until one changes nothing) with packing off
(``max_moves=0``) and on (``max_moves=8``). Prints, per scenario: orders bound, the share
of the orders that fit the free units in all, moves per
bound order (mean and most, and the mean over the orders that needed any) and the time of
the passes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from cozystack_gpu.keys import Mode, Phase
from cozystack_gpu.model import (
    MAX_MOVES,
    Action,
    ClaimInfo,
    ClassInfo,
    Device,
    NodeInfo,
    Snapshot,
    Step,
    plan,
)

RESOURCE = "nvidia.com/GH100_H100"
ORDER = 8
NOW = 1_000_000.0


def scattered(
    nodes: int, units: int, fill: float, attached: float, seed: int
) -> tuple[list[NodeInfo], list[ClaimInfo]]:
    rng = random.Random(seed)
    infos = [
        NodeInfo(
            name=f"node-{i:05d}",
            allocatable={RESOURCE: units},
            devices=(Device(RESOURCE, units),),
        )
        for i in range(nodes)
    ]
    free = [units] * nodes
    open_nodes = list(range(nodes))
    holds: list[ClaimInfo] = []
    for i in range(int(nodes * units * fill)):
        slot = rng.randrange(len(open_nodes))
        n = open_nodes[slot]
        free[n] -= 1
        if free[n] == 0:
            open_nodes[slot] = open_nodes[-1]
            open_nodes.pop()
        live = rng.random() < attached
        holds.append(
            ClaimInfo(
                namespace=f"tenant-{i % 50}",
                name=f"hold-{i:06d}",
                class_name="h100",
                count=1,
                created=float(i),
                phase=Phase.ATTACHED if live else Phase.BOUND,
                node=infos[n].name,
                attached_to=f"vm-{i}" if live else None,
                vmi_live=live,
                bound_at=float(i),
            )
        )
    return infos, holds


def scenario(args: argparse.Namespace, units: int, attached: float) -> None:
    h100 = ClassInfo("h100", Mode.PASSTHROUGH, RESOURCE, max_count=units)
    print(
        f"{args.nodes} nodes x {units} units, {args.fill:.0%} full with 1-unit holds at random, "
        f"{attached:.0%} of them attached; {ORDER}-unit orders:"
    )
    for seed in range(args.runs):
        nodes, holds = scattered(args.nodes, units, args.fill, attached, seed)
        free = args.nodes * units - len(holds)
        orders = [
            ClaimInfo("tenant-big", f"order-{i:04d}", "h100", ORDER, created=NOW + i)
            for i in range(free // ORDER)
        ]
        line = [f"  run {seed + 1}: {len(orders)} orders fit the {free} free units"]
        if attached:
            # An order as large as a node binds only on a node no attached hold pins.
            pinned = {h.node for h in holds if h.phase is Phase.ATTACHED}
            line[0] += f", {args.nodes - len(pinned)} nodes have no attached hold"
        line[0] += ";"
        for max_moves in (0, MAX_MOVES):
            snap = Snapshot.build(nodes=nodes, classes=[h100], claims=[*holds, *orders])
            # Passes until one changes nothing, as the binder runs them: a hold moved in a
            # pass stays put for the rest of it, so the next pass may free its new node.
            binds: list[Action] = []
            per_order: dict[str, int] = {}
            passes = 0
            elapsed = 0.0
            while True:
                started = time.perf_counter()
                result = plan(snap, NOW, max_moves=max_moves)
                elapsed += time.perf_counter() - started
                if not result.changes:
                    break
                passes += 1
                for updated in result.updates.values():
                    snap.upsert_claim(updated)
                for action in result.actions:
                    if action.step is Step.BIND:
                        binds.append(action)
                    elif action.step is Step.MOVE:
                        order = action.why.rsplit("/", 1)[-1]
                        per_order[order] = per_order.get(order, 0) + len(action.claims)
            moved = [per_order.get(a.claims[0].name, 0) for a in binds]
            share = len(binds) / len(orders) if orders else 1.0
            label = "packing off" if max_moves == 0 else f"packing (<= {max_moves} moves)"
            figures = f"{label}: {len(binds)} bound ({share:.1%})"
            if max_moves and binds:
                needed = [m for m in moved if m]
                figures += (
                    f", moves per bound order mean {statistics.mean(moved):.2f} max {max(moved)}"
                )
                if needed:
                    figures += (
                        f" ({len(needed)} needed moves: mean {statistics.mean(needed):.2f} each)"
                    )
            figures += f", {passes} pass{'' if passes == 1 else 'es'}, {elapsed * 1000:.0f} ms"
            line.append(figures)
        print(" ".join(line[:1]) + "\n    " + "\n    ".join(line[1:]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--fill", type=float, default=0.75)
    parser.add_argument("--runs", type=int, default=3, help="seeds per scenario")
    args = parser.parse_args()
    for units, attached in ((8, 0.0), (8, 0.3), (32, 0.0), (32, 0.3)):
        scenario(args, units, attached)


if __name__ == "__main__":
    main()
