"""``kubectl gpu list reservations``: the GPUReservations a user can list, one line each with
the columns ``kubectl get gpureservations`` prints (class, count, window, phase, node, age).

Pure: reservations in, rows out. The node shown is the reservation's own ``status.nodeName``
(the user read the object, so the node its booking holds is its own to see, as ``list
claims`` shows a claim's); nothing else names a node. Filters are ``list claims``' own
(``list_claims.Filters``): ``--node`` is sent to the API server as a field selector
(``status.nodeName`` is a selectable field of the CRD), the others are applied here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cozystack_gpu.cli import text
from cozystack_gpu.cli.list_claims import Filters
from cozystack_gpu.model import ReservationPhase
from cozystack_gpu.model.booking import span
from cozystack_gpu.objects import Obj, translate

PHASES = tuple(p.value for p in ReservationPhase)


def phase_of(reservation: Obj) -> str:
    """Its ``status.phase``; Pending before the controller wrote one."""
    status = reservation.get("status") or {}
    return str(status.get("phase") or ReservationPhase.PENDING.value)


def why(reservation: Obj) -> str:
    """The reason of its first condition that is False (why it waits or was refused), or ''
    when none is."""
    for cond in (reservation.get("status") or {}).get("conditions") or []:
        if cond.get("status") == "False" and cond.get("reason"):
            return str(cond["reason"])
    return ""


def window(reservation: Obj) -> tuple[float | None, float | None]:
    """Its window's start and end in epoch seconds; None for a part that cannot be read."""
    spec = reservation.get("spec") or {}
    return translate.timestamp(spec.get("start")), translate.timestamp(spec.get("end"))


def rows(
    reservations: Iterable[Obj],
    filters: Filters,
    now: float,
    tenant_namespaces: frozenset[str] | None,
) -> list[dict[str, Any]]:
    """The reservations that pass ``filters``, by namespace, start and name."""
    kept = []
    for reservation in reservations:
        spec = reservation.get("spec") or {}
        status = reservation.get("status") or {}
        namespace = translate.namespace_of(reservation)
        if not filters.keep(reservation, phase_of(reservation), tenant_namespaces):
            continue
        start, end = window(reservation)
        created = translate.timestamp(translate.meta(reservation).get("creationTimestamp"))
        kept.append(
            {
                "namespace": namespace,
                "name": translate.name_of(reservation),
                "class": spec.get("class"),
                "count": int(spec.get("count") or 1),
                "start": None if start is None else translate.rfc3339(start),
                "end": None if end is None else translate.rfc3339(end),
                "length": None if start is None or end is None else max(end - start, 0.0),
                "phase": phase_of(reservation),
                "node": status.get("nodeName"),
                "bookedAt": status.get("bookedAt"),
                "why": why(reservation) or None,
                "age": None if created is None else max(now - created, 0.0),
            }
        )
    return sorted(kept, key=lambda r: (r["namespace"], r["start"] or "", r["name"]))


def render(report: Mapping[str, Any], *, wide: bool = False) -> list[str]:
    items: Sequence[Mapping[str, Any]] = report["items"]
    if not items:
        return [f"No GPU reservations found{report.get('scope', '')}."]
    header = ["NAMESPACE", "NAME", "CLASS", "COUNT", "START", "END", "PHASE", "NODE", "AGE"]
    if wide:
        header[8:8] = ["LENGTH", "BOOKED", "WHY"]
    out = []
    for r in items:
        row = [
            r["namespace"],
            r["name"],
            r["class"],
            r["count"],
            r["start"] or "-",
            r["end"] or "-",
            r["phase"],
            r["node"] or "-",
            text.age(r["age"]),
        ]
        if wide:
            length = "-" if r["length"] is None else span(r["length"])
            row[8:8] = [length, r["bookedAt"] or "-", r["why"] or "-"]
        out.append(row)
    return text.table(header, out)
