"""What tenants do with reservations (SPEC §11): book a window a few hours ahead, or one
that opens and ends within the run (minutes ahead, minutes long), and cancel one. The
invariants check that no order, move or other booking ever leaves a booked window short of
its units or a budget over, and, once settled, that every window that opened holds its
claim on its node and every window that ended is Ended."""

from __future__ import annotations

import datetime

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage
from cozystack_gpu_testkit.objects import message_of

HOUR = 3600
MINUTE = 60


def book(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    world = run.world
    rng = stage.rng
    namespace = rng.choice(world.tenants)
    name = stage.next_name("w")
    gpu_class = rng.choice(world.classes)
    count = 2 if rng.random() < 0.3 else 1
    now = int(datetime.datetime.now(datetime.UTC).timestamp())
    if rng.random() < 0.5:
        # On the hour, 1 to 12 hours ahead, for 1 to 6 hours: windows overlap often.
        unit, label = HOUR, "h"
        first = (now // HOUR + 1) * HOUR
        start = first + rng.randrange(0, 12) * HOUR
        end = start + rng.randrange(1, 7) * HOUR
    else:
        # On the minute, 1 to 3 minutes ahead, for 1 to 4 minutes: it opens and ends in the run.
        unit, label = MINUTE, "m"
        first = (now // MINUTE + 1) * MINUTE
        start = first + rng.randrange(1, 4) * MINUTE
        end = start + rng.randrange(1, 5) * MINUTE
    ahead, length = (start - first) // unit, (end - start) // unit
    args = f"{namespace}/{name} {gpu_class} x{count} +{ahead}{label} {length}{label}"
    try:
        stage.tenant.reservation(namespace, name, gpu_class, count, start, end)
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    stage.reservations.add((namespace, name))
    return args, "accepted", {name}


def cancel_booking(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    if not stage.reservations:
        return "", "no reservation", set()
    namespace, name = stage.rng.choice(sorted(stage.reservations))
    stage.reservations.discard((namespace, name))
    try:
        stage.tenant.custom.delete_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, name
        )
    except ApiException as exc:
        return f"{namespace}/{name}", f"refused: {message_of(exc)}", {name}
    return f"{namespace}/{name}", "cancelled", {name}
