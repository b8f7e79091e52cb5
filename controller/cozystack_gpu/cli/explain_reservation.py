"""``kubectl gpu explain reservation``: what a GPUReservation books, where it stands and why,
and (for a hoster) whether the booking model would book it now.

Pure: the edge reads what the user may read into ``ReservationReadings``; ``explain`` makes
a report of it (what ``-o json|yaml`` prints) and ``render`` its lines. A tenant reads its
reservation with its status (the node a booking holds is its own, as a claim's is) and every
GPUClass; nothing else names a node. A hoster, who may list everything the binder watches
and every reservation, also gets the model's judgement of a reservation not yet booked
(Pending, or Lost and being placed again): ``check_booking`` on the snapshot the binder
would decide with (``whatif.build``) and the other reservations' ``Bookings``, with the
earliest window of the same length that fits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozystack_gpu.cli import text, whatif
from cozystack_gpu.cli.explain_claim import class_summary, class_words
from cozystack_gpu.cli.list_reservations import phase_of, window
from cozystack_gpu.config import Config
from cozystack_gpu.model import (
    BookingRefusal,
    Bookings,
    BookingSettings,
    Reason,
    ReservationInfo,
    ReservationPhase,
    Snapshot,
    check_booking,
    earliest_window,
)
from cozystack_gpu.model.booking import span
from cozystack_gpu.objects import Obj, translate

Report = dict[str, Any]

# Phases the booking model still has to place: not yet booked, or booked and lost its node.
UNPLACED = frozenset({ReservationPhase.PENDING.value, ReservationPhase.LOST.value})


@dataclass(frozen=True)
class ReservationReadings:
    """What the user could read, for one reservation.

    - ``reservation``: the GPUReservation (the one read that must succeed).
    - ``classes``: every GPUClass (every authenticated user reads them).
    - ``cluster``: for a hoster, everything the binder watches (``whatif.Listing``); None for
      a user who cannot list it all.
    - ``reservations``: every GPUReservation in every namespace; None when the user may not
      list them all (the model then cannot judge: other windows hold units too).
    """

    reservation: Obj
    classes: Sequence[Obj]
    cluster: whatif.Listing | None = None
    reservations: Sequence[Obj] | None = None


def conditions_of(reservation: Obj) -> list[dict[str, Any]]:
    """Its conditions as written, in the order written."""
    return [
        {
            "type": cond.get("type"),
            "status": cond.get("status"),
            "reason": cond.get("reason"),
            "message": cond.get("message"),
            "lastTransitionTime": cond.get("lastTransitionTime"),
        }
        for cond in (reservation.get("status") or {}).get("conditions") or []
    ]


def waiting(reservation: Obj) -> list[dict[str, Any]] | None:
    """Why a Pending reservation waits: the reason and message of each condition that is
    False ([] when none says yet); None for a reservation that does not wait."""
    if phase_of(reservation) != ReservationPhase.PENDING.value:
        return None
    return [
        {"type": c["type"], "reason": c["reason"], "message": c["message"]}
        for c in conditions_of(reservation)
        if c["status"] == "False"
    ]


def judge(
    info: ReservationInfo,
    snap: Snapshot,
    reservations: Sequence[Obj],
    now: float,
    settings: BookingSettings | None = None,
) -> dict[str, Any]:
    """The booking model's answer for one reservation, on the snapshot the binder would
    decide with and the other reservations (``reservations`` may hold this one: it is left
    out): where it would be booked now, or why not and the earliest window of its length
    that fits."""
    settings = settings or BookingSettings()
    others = [
        r
        for o in reservations
        if (r := translate.reservation_info(o)) is not None and r.key != info.key
    ]
    bookings = Bookings.build(snap, others)
    decision = check_booking(snap, bookings, info, now, settings)
    if not isinstance(decision, BookingRefusal):
        return {
            "verdict": "fits",
            "node": decision.node,
            "reason": None,
            "message": None,
            "earliest": translate.rfc3339(max(info.start, now)),
        }
    earliest = decision.earliest
    if earliest is None and decision.reason == Reason.WINDOW_IN_PAST and not info.counts_budget:
        # A window asked too late: the same length from now on, if one fits.
        earliest = earliest_window(snap, bookings, info, now, settings, not_before=now)
    return {
        "verdict": "refused",
        "node": None,
        "reason": str(decision.reason),
        "message": decision.message,
        "earliest": None if earliest is None else translate.rfc3339(earliest),
    }


def explain(
    readings: ReservationReadings,
    config: Config,
    now: float,
    settings: BookingSettings | None = None,
) -> Report:
    """The report of one reservation: what ``-o json|yaml`` prints and ``render`` writes."""
    reservation = readings.reservation
    spec = reservation.get("spec") or {}
    status = reservation.get("status") or {}
    class_name = str(spec.get("class") or "")
    start, end = window(reservation)
    phase = phase_of(reservation)
    klass = next(
        (class_summary(c) for c in readings.classes if translate.name_of(c) == class_name), None
    )
    report: Report = {
        "reservation": {
            "namespace": translate.namespace_of(reservation),
            "name": translate.name_of(reservation),
            "class": class_name,
            "count": int(spec.get("count") or 1),
            "start": None if start is None else translate.rfc3339(start),
            "end": None if end is None else translate.rfc3339(end),
            "length": None if start is None or end is None else max(end - start, 0.0),
            "startsIn": None if start is None else start - now,
            "endsIn": None if end is None else end - now,
            "phase": phase,
            "node": status.get("nodeName"),
            "bookedAt": status.get("bookedAt"),
        },
        "conditions": conditions_of(reservation),
        "class": klass,
        "waiting": waiting(reservation),
    }
    if readings.cluster is not None and phase in UNPLACED:
        info = translate.reservation_info(reservation)
        if readings.reservations is None:
            report["booking"] = {"verdict": "unknown", "why": "may not list every reservation"}
        elif info is None:
            report["booking"] = {"verdict": "unknown", "why": "its window cannot be read"}
        else:
            _view, snap = whatif.build(readings.cluster, config, now)
            report["booking"] = judge(info, snap, readings.reservations, now, settings)
    return report


# --- text --------------------------------------------------------------------------------


def render(report: Report, *, wide: bool = False) -> list[str]:
    r = report["reservation"]
    lines = [
        f"Reservation: {r['namespace']}/{r['name']} (class {r['class']}, {text.units(r['count'])})",
        f"Window:      {_window(r)}",
        f"Phase:       {r['phase']}" + _where(r),
    ]
    lines.append(f"Class:       {class_words(report['class'], r['class'])}")
    waits = report["waiting"]
    told = {w["type"] for w in waits or []}
    if report["conditions"]:
        lines.append("Conditions:")
    for cond in report["conditions"]:
        line = f"  {cond['type']}: {_said(cond['status'])} ({cond['reason']})"
        if cond["type"] not in told and cond["message"]:
            line += f": {cond['message']}"
        if wide and cond["lastTransitionTime"]:
            line += f", since {cond['lastTransitionTime']}"
        lines.append(line)
    if waits is not None:
        if not waits:
            lines.append("Waiting:     to be judged: no condition says why yet")
        for w in waits:
            lines.append(f"Waiting:     {w['reason']}: {w['message']}")
    if "booking" in report:
        lines += render_booking(report["booking"], r)
    return lines


def _said(status: str | None) -> str:
    return {"True": "yes", "False": "no"}.get(str(status), "unknown")


def _window(r: Mapping[str, Any]) -> str:
    if r["start"] is None or r["end"] is None:
        return "cannot be read"
    when = f"{r['start']} to {r['end']} ({span(r['length'])}"
    if r["startsIn"] > 0:
        return f"{when}; starts in {span(r['startsIn'])})"
    if r["endsIn"] > 0:
        return f"{when}; open, ends in {span(r['endsIn'])})"
    return f"{when}; ended {span(-r['endsIn'])} ago)"


def _where(r: Mapping[str, Any]) -> str:
    parts = []
    if r["node"]:
        parts.append(f"on node {r['node']}")
    if r["bookedAt"]:
        parts.append(f"booked at {r['bookedAt']}")
    return f" ({', '.join(parts)})" if parts else ""


def render_booking(booking: Mapping[str, Any], r: Mapping[str, Any]) -> list[str]:
    verdict = booking["verdict"]
    if verdict == "unknown":
        return [f"Booking:     not judged: {booking['why']}"]
    if verdict == "fits":
        return [f"Booking:     fits now on node {booking['node']}: the model would book it there"]
    lines = [f"Booking:     refused now: {booking['reason']}: {booking['message']}"]
    if booking["earliest"] is not None and r["length"] is not None:
        start = translate.timestamp(booking["earliest"]) or 0.0
        end = translate.rfc3339(start + r["length"])
        lines.append(
            f"  earliest window of {span(r['length'])} that fits: {booking['earliest']} to {end}"
        )
    return lines
