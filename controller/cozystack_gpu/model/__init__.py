"""Placement, capacity and budgets: dataclasses in, decisions out.

This package answers one question for the binder, the admission webhooks and the class
status: does this order fit, where, and why not. It imports no Kubernetes client and does no
I/O; the current time is always an argument (float seconds since the epoch), so the same
input gives the same answer.

Typical use by a controller::

    snap = Snapshot.build(nodes=..., classes=..., claims=..., namespaces=...)
    snap.upsert_claim(claim)                 # for every watch event, one call
    decision = check_order(snap, claim, now)  # Placement(node) or Refusal(reason, message)
    result = plan(snap, now)                 # the binder's pass; write result.updates
    for claim in result.updates.values():    # record own writes before their events return
        snap.upsert_claim(claim)
    snap.class_status("l40s-24c")            # ClassStatus(free, max_free_per_node)

A live migration's target (SPEC §12) goes to another node, recorded on each claim of the set
as ``ClaimInfo.migration``; while it is recorded its units count on both nodes::

    decision = place_migration(snap, members, now)  # Placement(target) or Refusal
    snap.upsert_claim(replace(member, migration=MigrationTarget(node, uid, now)))

Reservations (SPEC §11) hold units over a window; ``Bookings`` indexes them over time::

    bookings = Bookings.build(snap, reservations)
    decision = check_booking(snap, bookings, reservation, now)  # Placement or BookingRefusal
    order_headroom(snap, bookings, node, resource, now)         # what an order leaves free
    booked_by_class(bookings)  # per class, a Timeline of the units booked on nodes
"""

from cozystack_gpu.model.booking import (
    budget_headroom,
    check_booking,
    earliest_window,
    order_headroom,
)
from cozystack_gpu.model.eligibility import selector_matches, serves, untolerated_taint
from cozystack_gpu.model.packing import MAX_MOVES, Move, Room, make_room
from cozystack_gpu.model.planner import Action, Plan, Step, plan
from cozystack_gpu.model.reservations import (
    BookingRefusal,
    Bookings,
    BookingSettings,
    ReservationInfo,
    ReservationPhase,
    booked_by_class,
)
from cozystack_gpu.model.set_placement import (
    check_order,
    place_for_start,
    place_migration,
    place_set,
)
from cozystack_gpu.model.snapshot import Snapshot
from cozystack_gpu.model.types import (
    WINDOW_REASONS,
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    ClassStatus,
    Decision,
    Device,
    MigrationTarget,
    NamespaceInfo,
    NodeInfo,
    NodeRequirement,
    Placement,
    Reason,
    Refusal,
    RejectedNode,
    Taint,
    Toleration,
    VolumeAffinity,
    merge_quotas,
)

__all__ = [
    "MAX_MOVES",
    "WINDOW_REASONS",
    "Action",
    "BookingRefusal",
    "BookingSettings",
    "Bookings",
    "ClaimInfo",
    "ClaimKey",
    "ClassInfo",
    "ClassStatus",
    "Decision",
    "Device",
    "MigrationTarget",
    "Move",
    "NamespaceInfo",
    "NodeInfo",
    "NodeRequirement",
    "Placement",
    "Plan",
    "Reason",
    "Refusal",
    "RejectedNode",
    "ReservationInfo",
    "ReservationPhase",
    "Room",
    "Snapshot",
    "Step",
    "Taint",
    "Toleration",
    "VolumeAffinity",
    "booked_by_class",
    "budget_headroom",
    "check_booking",
    "check_order",
    "earliest_window",
    "make_room",
    "merge_quotas",
    "order_headroom",
    "place_for_start",
    "place_migration",
    "place_set",
    "plan",
    "selector_matches",
    "serves",
    "untolerated_taint",
]
