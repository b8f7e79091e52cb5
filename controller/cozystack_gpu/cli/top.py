"""``kubectl gpu top nodes|classes``: units per node and class, for hosters.

Pure: the listing of everything the binder watches in, rows out. The figures are the
binder's model of that listing (``whatif.build``): allocatable is what the node agent
reports capped at the Node's allocatable, held is what claims hold there (Bound, Attached,
and Lost while their VMI still runs there), raw is what pods using the resource name without
claims take, free is what is left. A class's booked units are the most that its reservations
booked on nodes (Booked or Active) hold at any moment of the next 24 hours, counted as the
metric ``cozystack_gpu_class_booked_units`` counts them (``model.booked_by_class``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cli import text, whatif
from cozystack_gpu.config import Config
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import ClaimInfo, booked_by_class, selector_matches
from cozystack_gpu.objects import translate
from cozystack_gpu.objects.translate import name_of

Row = dict[str, Any]

AHEAD = 24 * 3600  # the booked column's horizon: the next 24 hours
# When the user may not list every GPUReservation, the listing has none: the class's
# booked units are not known, and its free units count those windows hold back as free.
UNLISTED_RESERVATIONS = (
    "BOOKED24H is unknown: this user may not list gpureservations in every namespace, so "
    "FREE and MAXFREE also count as free the units booked windows hold back"
)


def _phase_units(claims: Sequence[ClaimInfo], phase: Phase) -> int:
    return sum(c.count for c in claims if c.phase is phase)


def _ready(gpunode: Mapping[str, Any] | None) -> str:
    for cond in ((gpunode or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == keys.CONDITION_READY:
            return str(cond.get("reason") or cond.get("status") or "")
    return "-"


def node_rows(listing: whatif.Listing, config: Config, now: float) -> list[Row]:
    """One row per node and resource name it has units of (or claims of, or a class
    selecting it), with the classes that offer that name there."""
    _view, snap = whatif.build(listing, config, now)
    gpunodes = {name_of(g): g for g in listing.get(keys.GPU_NODE.kind, ())}
    rows: list[Row] = []
    for node in sorted(snap.nodes(), key=lambda n: n.name):
        claims = [c for k in snap.claims_on(node.name) if (c := snap.claim(k)) is not None]
        by_res: dict[str, list[str]] = {}
        for klass in snap.classes():
            if selector_matches(node, klass) or any(c.class_name == klass.name for c in claims):
                by_res.setdefault(klass.resource_name, []).append(klass.name)
        resources = set(node.capacity()) | set(by_res)
        gpunode = gpunodes.get(node.name)
        if gpunode is None and not by_res:
            continue  # no GPU node: no agent report, no class selects it
        reported = translate.inventory_reported_at(gpunode)
        for res in sorted(resources):
            names = set(by_res.get(res, []))
            mine = [c for c in claims if c.class_name in names]
            if not mine and not snap.capacity(node.name, res) and not node.raw_used.get(res):
                continue  # a class selects the node, which has none of its units
            rows.append(
                {
                    "node": node.name,
                    "classes": sorted(names),
                    "resourceName": res,
                    "allocatable": snap.capacity(node.name, res),
                    "held": snap.used(node.name, res),
                    "attached": _phase_units(mine, Phase.ATTACHED),
                    "lost": _phase_units(mine, Phase.LOST),
                    "free": snap.free(node.name, res),
                    "raw": node.raw_used.get(res, 0),
                    "ready": _ready(gpunode),
                    "layoutState": node.labels.get(keys.LABEL_NODE_LAYOUT_STATE),
                    "inventoryAge": None if reported is None else round(now - reported),
                    "agentVersion": ((gpunode or {}).get("status") or {}).get("agentVersion"),
                }
            )
    return rows


def class_rows(
    listing: whatif.Listing, config: Config, now: float, *, reservations_known: bool = True
) -> list[Row]:
    """One row per class: units over the nodes serving it (those with units of it), held by
    phase, free, the most free on one node, units ordered and waiting, raw use of its
    resource name, and the most units reservations book at any moment of the next 24 hours
    (None unless ``reservations_known``: the listing holds every GPUReservation)."""
    _view, snap = whatif.build(listing, config, now)
    booked = booked_by_class(snap.bookings)
    rows: list[Row] = []
    for klass in sorted(snap.classes(), key=lambda k: k.name):
        res = klass.resource_name
        serving = [
            n
            for n in snap.nodes()
            if snap.serves(n.name, klass.name) and snap.capacity(n.name, res) > 0
        ]
        claims = [c for k in snap.claims_of_class(klass.name) if (c := snap.claim(k)) is not None]
        status = snap.class_status(klass.name)
        timeline = booked.get(klass.name)
        ahead = timeline.peak(now, now + AHEAD) if timeline is not None else 0
        rows.append(
            {
                "class": klass.name,
                "mode": klass.mode.value,
                "resourceName": res,
                "nodes": len(serving),
                "allocatable": sum(snap.capacity(n.name, res) for n in serving),
                "held": sum(c.count for c in claims if c.holds_node),
                "attached": _phase_units(claims, Phase.ATTACHED),
                "lost": _phase_units(claims, Phase.LOST),
                "free": status.free,
                "maxFreePerNode": status.max_free_per_node,
                "pending": sum(c.count for c in claims if c.waiting),
                "raw": sum(n.raw_used.get(res, 0) for n in serving),
                "bookedNext24h": ahead if reservations_known else None,
                "deleting": klass.deleting,
            }
        )
    return rows


def render_nodes(rows: Sequence[Row], *, wide: bool = False) -> list[str]:
    header = ["NODE", "CLASS", "ALLOCATABLE", "HELD", "ATTACHED", "LOST", "FREE", "RAW"]
    header += ["READY", "LAYOUT", "INVENTORY"]
    if wide:
        header += ["RESOURCE", "AGENT"]
    body = []
    for r in rows:
        row = [
            r["node"],
            ",".join(r["classes"]) or "-",
            r["allocatable"],
            r["held"],
            r["attached"],
            r["lost"],
            r["free"],
            r["raw"],
            r["ready"],
            r["layoutState"] or "-",
            "-" if r["inventoryAge"] is None else text.age(r["inventoryAge"]),
        ]
        if wide:
            row += [r["resourceName"], r["agentVersion"] or "-"]
        body.append(row)
    return text.table(header, body)


def class_notes(*, reservations_known: bool) -> list[str]:
    """What the class rows could not count, in words."""
    return [] if reservations_known else [UNLISTED_RESERVATIONS]


def render_class_report(report: Mapping[str, Any], *, wide: bool = False) -> list[str]:
    """The class table, then its notes."""
    notes = [f"Note: {note}" for note in report.get("notes") or ()]
    return render_classes(report["items"], wide=wide) + notes


def render_classes(rows: Sequence[Row], *, wide: bool = False) -> list[str]:
    header = ["CLASS", "MODE", "NODES", "ALLOCATABLE", "HELD", "ATTACHED", "LOST", "FREE"]
    header += ["MAXFREE", "PENDING", "RAW", "BOOKED24H"]
    if wide:
        header += ["RESOURCE"]
    body = []
    for r in rows:
        row = [
            r["class"] + (" (deleting)" if r["deleting"] else ""),
            r["mode"],
            r["nodes"],
            r["allocatable"],
            r["held"],
            r["attached"],
            r["lost"],
            r["free"],
            r["maxFreePerNode"],
            r["pending"],
            r["raw"],
            "<unknown>" if r["bookedNext24h"] is None else r["bookedNext24h"],
        ]
        if wide:
            row.append(r["resourceName"])
        body.append(row)
    return text.table(header, body)
