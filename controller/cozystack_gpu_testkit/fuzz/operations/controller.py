"""What happens to the controller: the leader SIGKILLed (the driver starts it again later; the
webhooks' Service then routes to the replica left)."""

from __future__ import annotations

import time

from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage


def kill_leader(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    holder = run.holder()
    if holder is None or any(killed[0] == holder for killed in stage.killed):
        return "", "no leader to kill", set()
    run.replicas[holder].kill()
    if stage.service.serving == holder:  # the Service routes to the replica left
        stage.service.move_to(run, next(r for r in run.replicas if r != holder))
    stage.killed.append((holder, time.monotonic() + stage.rng.uniform(0.5, 3.0)))
    stage.kills += 1
    stage.faults += 1
    return holder, "SIGKILL", {holder}
