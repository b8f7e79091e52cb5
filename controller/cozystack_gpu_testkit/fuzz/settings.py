"""What one seed's run is asked (``FuzzSettings``: the seed, the number of operations, the
world's size, the weight of each operation) and what it answers (``FuzzResult``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cozystack_gpu_testkit.fuzz.journal import Finding

SETTLE_S = 150.0


@dataclass
class FuzzSettings:
    seed: int = 1
    operations: int = 80
    nodes: int = 4
    gpus: int = 2
    # Nodes of a third pool served by a DRA driver, with a ``dra`` class beside the two
    # device-plugin ones (SPEC §13): its orders, VMs and faults are drawn as theirs are.
    dra_nodes: int = 2
    pause_s: tuple[float, float] = (0.1, 0.5)  # load between operations, not a wait
    settle_s: float = SETTLE_S
    # Relative weights of each operation.
    weights: Mapping[str, float] = field(
        default_factory=lambda: {
            "order": 3.0,
            "create_vm": 4.0,
            "stop_vm": 1.5,
            "start_vm": 1.5,
            "restart_vm": 2.0,
            "delete_vmi": 1.5,
            "delete_vm": 1.0,
            "delete_claim": 1.5,
            "strip_finalizers": 1.5,
            "squat_template": 1.5,
            "odd_vm": 1.0,
            "cut_owner": 1.2,
            "forged_pod": 0.8,
            # The tenant moves of issue 41: each is refused, or repaired by the binder.
            "ungate_pod": 0.6,
            "preempting_vm": 0.5,
            "huge_annotation_vm": 0.4,
            "odd_name_order": 0.8,
            "orphan_record": 0.5,
            "nad_vm": 0.8,
            "node_not_ready": 0.7,
            "node_cordon": 0.7,
            "node_memory_short": 0.7,
            "node_gpu_short": 0.5,
            "node_restore": 1.2,
            "kill_leader": 0.6,
            # Windows booked ahead (SPEC §11): orders, moves and bookings must leave them.
            "book": 1.2,
            "cancel_booking": 0.4,
            # Live migrations (SPEC §12): the target's units count before the VM moves.
            "migrate_vm": 1.0,
            "cancel_migration": 0.3,
        }
    )


@dataclass
class FuzzResult:
    seed: int
    operations: int
    faults: int
    kills: int
    checks: int
    looks: int
    starts: int
    violations: list[str]
    findings: list[Finding]
    outcomes: dict[str, int]
    wall_s: float

    def summary(self) -> str:
        return (
            f"seed {self.seed}: {self.operations} operations, {self.faults} faults "
            f"({self.kills} leader kills), {self.starts} VM starts, {self.checks} checks in "
            f"{self.looks} looks, {len(self.violations)} violations, {self.wall_s:.0f} s"
        )

    def report(self) -> str:
        lines = [self.summary()]
        for finding in self.findings:
            lines.append(f"  {finding.violation} (first seen after #{finding.first_seen_after})")
            lines += [f"      {step}" for step in finding.sequence]
        return "\n".join(lines)
