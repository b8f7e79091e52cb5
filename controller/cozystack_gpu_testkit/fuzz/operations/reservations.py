"""What tenants do with reservations (SPEC §11): book a window a few hours ahead, and cancel
one. The windows start after the run ends, so what the invariants check is that no order,
move or other booking ever leaves a booked window short of its units or a budget over."""

from __future__ import annotations

import datetime

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage
from cozystack_gpu_testkit.objects import message_of

HOUR = 3600


def book(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    world = run.world
    rng = stage.rng
    namespace = rng.choice(world.tenants)
    name = stage.next_name("w")
    gpu_class = rng.choice(world.classes)
    count = 2 if rng.random() < 0.3 else 1
    # On the hour, 1 to 12 hours ahead, for 1 to 6 hours: windows overlap often.
    first = (int(datetime.datetime.now(datetime.UTC).timestamp()) // HOUR + 1) * HOUR
    start = first + rng.randrange(0, 12) * HOUR
    end = start + rng.randrange(1, 7) * HOUR
    ahead, length = (start - first) // HOUR, (end - start) // HOUR
    args = f"{namespace}/{name} {gpu_class} x{count} +{ahead}h {length}h"
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
