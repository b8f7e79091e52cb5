"""Prometheus metrics of the controller. Counts that GPUClass status must not show (it is
readable by every authenticated user) are exported here, for the hoster only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge, Histogram

if TYPE_CHECKING:
    from cozystack_gpu.model.timeline import Timeline

CLASS_CAPACITY = Gauge(
    "cozystack_gpu_class_capacity_units",
    "Units of the class on nodes serving it (device-plugin allocatable, capped by the Node)",
    ["class"],
)
CLASS_FREE = Gauge(
    "cozystack_gpu_class_free_units", "Units of the class free on nodes serving it", ["class"]
)
CLASS_CLAIMED = Gauge(
    "cozystack_gpu_class_claimed_units",
    "Units of the class held by claims, by claim phase",
    ["class", "phase"],
)
NODE_UNITS = Gauge(
    "cozystack_gpu_node_units",
    "Units of a GPU resource name on a node: capacity, held by claims, used by raw-name pods",
    ["node", "resource", "state"],
)
NODE_INVENTORY_STALE = Gauge(
    "cozystack_gpu_node_inventory_stale",
    "1 while the node agent's report is older than --inventory-stale-after: the node's holds "
    "stay, but nothing new is placed there",
    ["node"],
)
BIND_LATENCY = Histogram(
    "cozystack_gpu_bind_latency_seconds",
    "Time from a claim's creation to its status write as Bound",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
)
DECISIONS = Counter(
    "cozystack_gpu_binder_decisions_total",
    "Binder decisions written, by step (Bind, Move, Lose, Rebind, Reattach, Attach, Detach)",
    ["step"],
)
REFUSALS = Counter(
    "cozystack_gpu_refusals_total",
    "Orders and sets that did not fit when first judged, by machine reason",
    ["reason"],
)
ADMISSION_REFUSALS = Counter(
    "cozystack_gpu_admission_refusals_total",
    "Requests the admission webhooks refused, by webhook and machine reason",
    ["webhook", "reason"],
)
WRITE_CONFLICTS = Counter(
    "cozystack_gpu_binder_write_conflicts_total",
    "Claim status writes refused because the claim changed after the decision",
)
LEADER = Gauge("cozystack_gpu_binder_leader", "1 while this replica holds the binder Lease")
PENDING = Gauge(
    "cozystack_gpu_claims_pending",
    "Claims waiting for a node: orders not bound yet and VMs' template claims not placed",
)
OLDEST_WAITING = Gauge(
    "cozystack_gpu_class_oldest_waiting_order_timestamp_seconds",
    "Creation time of the class's oldest waiting claim, an order or a VM's template claim "
    "(no series while none waits)",
    ["class"],
)
ADMISSION_ERRORS = Counter(
    "cozystack_gpu_admission_errors_total",
    "Requests a webhook could not judge (answered 5xx: an API read failed, the replica's "
    "feed stopped, a bug), by webhook",
    ["webhook"],
)
SETTINGS_WRITE_FAILING = Gauge(
    "cozystack_gpu_settings_write_failing",
    "1 while the last write of the settings ConfigMap (which the raw-name policy reads) failed",
)
USAGE_RECORD_WRITE_FAILURES = Counter(
    "cozystack_gpu_usage_record_write_failures_total",
    "Writes of usage records (Workload) that failed: a Bound or Attached order or a booked "
    "window unbilled, or a record left over, until a later write lands; by write (create, "
    "status, metadata, delete)",
    ["write"],
)
STATUS_WRITES = Counter(
    "cozystack_gpu_binder_claim_status_writes_total",
    "Claim status writes sent, by purpose (a placement step, or Wait for a refusal note)",
    ["purpose"],
)

RESERVATION_DECISIONS = Counter(
    "cozystack_gpu_reservation_decisions_total",
    "Binder decisions on reservations, by outcome (Booked, Moved, Lost; Waiting: a window "
    "that did not fit when the binder came to it)",
    ["outcome"],
)
BOOKED_UNITS = Gauge(
    "cozystack_gpu_class_booked_units",
    "Units of the class that booked windows (Booked or Active) hold at each whole hour ahead "
    "(0 to 23)",
    ["class", "hours_ahead"],
)
RESERVATION_OUTCOMES = ("Booked", "Moved", "Lost", "Waiting")
HOURS_AHEAD = 24

_waiting_classes: set[str] = set()


def set_oldest_waiting(oldest: Mapping[str, float]) -> None:
    """One series per class with a waiting order (its oldest's creation time); the series of
    a class nothing waits for any more go, so an alert on the age ends with the wait."""
    for class_name, created in oldest.items():
        OLDEST_WAITING.labels(class_name).set(created)
    for gone in _waiting_classes - oldest.keys():
        OLDEST_WAITING.remove(gone)
    _waiting_classes.clear()
    _waiting_classes.update(oldest)


def start_at_zero(
    steps: Iterable[str] = (), reasons: Iterable[str] = (), webhooks: Iterable[str] = ()
) -> None:
    """Series at 0 for every label value known up front: a labelled counter's series is
    otherwise born at its first increment, already 1, and ``rate()`` or ``increase()``
    (the dashboard's, the alerts') never see that first decision, refusal or error."""
    for outcome in RESERVATION_OUTCOMES:
        RESERVATION_DECISIONS.labels(outcome)
    for step in steps:
        DECISIONS.labels(step)
    for reason in reasons:
        REFUSALS.labels(reason)
    for webhook in webhooks:
        ADMISSION_ERRORS.labels(webhook)


def booked_by_hour(booked: Mapping[str, Timeline], now: float) -> dict[str, list[int]]:
    """Per class, the units booked (``model.booked_by_class``) at each whole hour from the
    next one on, for ``HOURS_AHEAD`` hours."""
    first = (int(now) // 3600 + 1) * 3600
    return {
        class_name: [timeline.value_at(first + hour * 3600) for hour in range(HOURS_AHEAD)]
        for class_name, timeline in booked.items()
    }
