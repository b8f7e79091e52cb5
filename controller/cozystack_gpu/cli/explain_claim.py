"""``kubectl gpu explain claim``: a claim's phase and why, and what would make it fit.

Pure: the edge reads what the user may read into ``ClaimReadings``; ``explain`` makes a
report of it (what ``-o json|yaml`` prints) and ``render`` its lines. What the user reads
decides what is said: its own claim (status included: phase, node, conditions), every
GPUClass (free and maxFreePerNode only), the quotas it can read, the claims it can list.
Nothing here names a namespace or a claim the readings do not contain, and a node only where
the user could list everything the binder watches (``cluster``) or the claim's own status
names it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cli import text, whatif
from cozystack_gpu.config import Config
from cozystack_gpu.model import ClaimKey, Reason, Snapshot, merge_quotas
from cozystack_gpu.objects import Obj, translate
from cozystack_gpu.objects.translate import name_of, namespace_of

Report = dict[str, Any]


@dataclass(frozen=True)
class ClaimReadings:
    """What the user could read, for one claim.

    - ``claim``: the GPUClaim (the one read that must succeed).
    - ``classes``: every GPUClass (every authenticated user reads them).
    - ``namespace``: the claim's Namespace; None when the user cannot read it (its tenant
      labels, and so the levels above, are then unknown).
    - ``quotas``: ResourceQuotas per namespace of the chain; None where they are not readable.
    - ``claims``: the claims the user could list; ``claims_namespace`` is the one namespace
      they come from, None when they were listed in every namespace.
    - ``cluster``: for a hoster, everything the binder watches (``whatif.Listing``); None for
      a user who cannot list it all.
    """

    claim: Obj
    classes: Sequence[Obj]
    namespace: Obj | None
    quotas: Mapping[str, Sequence[Obj] | None]
    claims: Sequence[Obj]
    claims_namespace: str | None
    cluster: whatif.Listing | None = None


def chain_of(claim_namespace: str, namespace: Obj | None) -> tuple[str, ...]:
    """The namespaces whose quotas limit the claim: its own, then its tenant ancestors (as
    the binder's ledger orders them). Only its own when its labels cannot be read."""
    if namespace is None:
        return (claim_namespace,)
    labels = dict((namespace.get("metadata") or {}).get("labels") or {})
    return (claim_namespace, *sorted(keys.tenant_ancestors(labels) - {claim_namespace}))


def phase_of(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("phase") or keys.Phase.PENDING.value)


def condition_of(claim: Obj, type_: str) -> dict[str, Any] | None:
    for cond in (claim.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return {
                "type": type_,
                "status": cond.get("status"),
                "reason": cond.get("reason"),
                "message": cond.get("message"),
                "lastTransitionTime": cond.get("lastTransitionTime"),
            }
    return None


def _count(claim: Obj) -> int:
    return int((claim.get("spec") or {}).get("count") or 1)


def _class_name(claim: Obj) -> str:
    return str((claim.get("spec") or {}).get("class") or "")


def class_words(klass: Mapping[str, Any] | None, name: str) -> str:
    """A class summary (``class_summary``) in words, for the ``Class:`` line of a report."""
    if klass is None:
        return f"{name} does not exist"
    return (
        f"{klass['name']} ({klass['mode']}): {klass['free']} free, "
        f"{klass['maxFreePerNode']} on one node"
        + (f", maxCount {klass['maxCount']}" if klass["maxCount"] else "")
        + (", being deleted" if klass["deleting"] else "")
    )


def class_summary(gpu_class: Obj) -> dict[str, Any]:
    spec = gpu_class.get("spec") or {}
    status = gpu_class.get("status") or {}
    return {
        "name": name_of(gpu_class),
        "mode": spec.get("mode"),
        "maxCount": spec.get("maxCount"),
        "free": int(status.get("free") or 0),
        "maxFreePerNode": int(status.get("maxFreePerNode") or 0),
        "deleting": bool((gpu_class.get("metadata") or {}).get("deletionTimestamp")),
    }


def budget_levels(
    readings: ClaimReadings, chain: Sequence[str], class_name: str, snap: Snapshot | None
) -> list[dict[str, Any]]:
    """Each level's class key and total key: its limit (None: the level has no such key) and
    what is used under it: exact from a hoster's snapshot, else a lower bound, the claims of
    the claim's own namespace (the only namespace known to be under each level)."""
    own = namespace_of(readings.claim)
    levels = []
    for depth, tenant in enumerate(chain):
        quotas = readings.quotas.get(tenant)
        entry: dict[str, Any] = {"tenant": tenant, "self": depth == 0}
        if quotas is None:
            levels.append({**entry, "readable": False, "keys": []})
            continue
        hard = merge_quotas([translate.quota_hard(q) for q in quotas])
        rows = []
        for key in (keys.quota_key(class_name), keys.QUOTA_KEY_TOTAL):
            if snap is not None:
                used, exact = snap.budget_used(tenant, key), True
            else:
                used = sum(
                    _count(c)
                    for c in readings.claims
                    if namespace_of(c) == own
                    and phase_of(c) != keys.Phase.PENDING.value
                    and (key == keys.QUOTA_KEY_TOTAL or _class_name(c) == class_name)
                )
                exact = False
            rows.append({"key": key, "used": used, "usedExact": exact, "limit": hard.get(key)})
        levels.append({**entry, "readable": True, "keys": rows})
    return levels


def _arrival(claim: Obj) -> tuple[float, str, str]:
    created = translate.timestamp((claim.get("metadata") or {}).get("creationTimestamp"))
    return (created or 0.0, namespace_of(claim), name_of(claim))


def queue(readings: ClaimReadings) -> dict[str, Any] | None:
    """The claim's place among the waiting orders of its class that the user can list, in
    the binder's order (oldest first); None for a claim that does not wait."""
    claim = readings.claim
    if phase_of(claim) != keys.Phase.PENDING.value:
        return None
    template = translate.is_template_claim(claim)
    waiting = sorted(
        (
            c
            for c in readings.claims
            if _class_name(c) == _class_name(claim)
            and phase_of(c) == keys.Phase.PENDING.value
            and translate.is_template_claim(c) == template
        ),
        key=_arrival,
    )
    me = (namespace_of(claim), name_of(claim))
    place = next((i for i, c in enumerate(waiting) if (namespace_of(c), name_of(c)) == me), None)
    if place is None:  # listed before it existed: count it last
        waiting.append(claim)
        place = len(waiting) - 1
    return {
        "position": place + 1,
        "waiting": len(waiting),
        "namespace": readings.claims_namespace,
        "ahead": [
            {"claim": f"{namespace_of(c)}/{name_of(c)}", "count": _count(c)}
            for c in waiting[:place]
        ],
    }


def _headroom(levels: Sequence[Mapping[str, Any]]) -> int | None:
    """Units the readable budget keys leave (an upper bound where a used figure is only a
    lower bound); None when no readable level limits the class."""
    rooms = [
        row["limit"] - row["used"]
        for level in levels
        for row in level["keys"]
        if row["limit"] is not None
    ]
    return max(min(rooms), 0) if rooms else None


def _order_passes(
    c: Mapping[str, Any], count: int, entitled: bool | None, room: int | None
) -> bool:
    """Whether an order of ``count`` units of class ``c`` passes the checks the tenant can
    read: capacity on one node, maxCount (vGPU: one unit unless it says more), the vGPU
    entitlement, and the room its budget keys leave (``room``; None: no readable key
    limits it)."""
    vgpu = c["mode"] == keys.Mode.VGPU.value
    limit = c["maxCount"] or (1 if vgpu else None)
    return (
        not c["deleting"]
        and c["maxFreePerNode"] >= count
        and (limit is None or count <= limit)
        and not (vgpu and entitled is False)
        and (room is None or count <= room)
    )


def suggestions(
    reason: str | None,
    count: int,
    klass: Mapping[str, Any] | None,
    classes: Sequence[Mapping[str, Any]],
    levels: Sequence[Mapping[str, Any]],
    entitled: bool | None,
    class_rooms: Mapping[str, int | None] | None = None,
) -> list[str]:
    """What the tenant could change, from the reason the binder gave and what it can read.
    Another class is offered only when an order of it would pass the same checks
    (``class_rooms``: what each class's budget keys leave, see ``_headroom``), so following
    a hint never meets a second refusal the tenant could have been told of."""
    out: list[str] = []
    rooms = class_rooms or {}
    others = [
        c
        for c in classes
        if klass is None or c["name"] != klass["name"]
        if _order_passes(c, count, entitled, rooms.get(c["name"]))
    ]
    room = _headroom(levels)
    if reason in (Reason.BUDGET_EXCEEDED, Reason.RAW_KEY_UNCOVERED):
        if room:
            out.append(f"a smaller count: at most {room} fits the budgets you can read")
        out.append("ask for a budget: the message above says which key and who can raise it")
    elif reason == Reason.MAX_COUNT_EXCEEDED and klass is not None:
        limit = klass["maxCount"] or 1
        out.append(f"a smaller count: class {klass['name']} allows {text.units(limit)} per VM")
    elif (
        reason
        in (
            Reason.INSUFFICIENT_CAPACITY,
            Reason.CAPACITY_FRAGMENTED,
            Reason.NO_NODE_SERVES,
        )
        and klass is not None
    ):
        largest = klass["maxFreePerNode"]
        if 0 < largest < count:
            fit = "fits" if largest == 1 else "fit"
            out.append(f"a smaller count: {text.units(largest)} {fit} on one node now")
    elif reason == Reason.VGPU_NOT_ENTITLED:
        out.append(
            "ask for the vGPU entitlement: the parent tenant's administrator grants it "
            "(see the message above)"
        )
    elif reason == Reason.VMI_STILL_RUNNING:
        out.append("wait: the claim rebinds once its VMI is final or gone")
    if reason is not None and reason != Reason.VMI_STILL_RUNNING:
        for c in others:
            out.append(
                f"another class with room: {c['name']} ({c['mode']}, {c['free']} free, "
                f"{c['maxFreePerNode']} on one node)"
            )
    if reason in (Reason.INSUFFICIENT_CAPACITY, Reason.CAPACITY_FRAGMENTED):
        out.append("wait: orders of the class bind oldest first as units are released")
    return out


def explain(readings: ClaimReadings, config: Config, now: float) -> Report:
    """The report of one claim: what ``-o json|yaml`` prints and ``render`` writes out."""
    claim = readings.claim
    ns, name = namespace_of(claim), name_of(claim)
    class_name, count, phase = _class_name(claim), _count(claim), phase_of(claim)
    status = claim.get("status") or {}
    summaries = sorted((class_summary(c) for c in readings.classes), key=lambda c: c["name"])
    klass = next((c for c in summaries if c["name"] == class_name), None)
    snap = None
    view = None
    if readings.cluster is not None:
        view, snap = whatif.build(readings.cluster, config, now)
    chain = chain_of(ns, readings.namespace)
    if snap is not None and snap.namespace(ns) is not None:
        info = snap.namespace(ns)
        assert info is not None
        chain = (ns, *sorted(info.ancestors - {ns}))
    levels = budget_levels(readings, chain, class_name, snap)
    bound = condition_of(claim, keys.CONDITION_BOUND)
    if bound is None and translate.is_template_claim(claim):
        # A template claim is judged with its VM's whole set: the binder's reason is on
        # Placed (False while the set fits nowhere), and no Bound is written meanwhile.
        placed = condition_of(claim, keys.CONDITION_PLACED)
        bound = placed if placed is not None and placed["status"] == "False" else None
    reason = None
    if phase in (keys.Phase.PENDING.value, keys.Phase.LOST.value) and bound is not None:
        reason = bound["reason"]
    entitled = None
    if readings.namespace is not None:
        labels = (readings.namespace.get("metadata") or {}).get("labels") or {}
        entitled = labels.get(keys.LABEL_VGPU_ENTITLEMENT) == keys.VGPU_ENTITLEMENT_VALUE
    report: Report = {
        "claim": {
            "namespace": ns,
            "name": name,
            "class": class_name,
            "count": count,
            "phase": phase,
            "node": status.get("nodeName"),
            "attachedTo": status.get("attachedTo"),
            "template": translate.is_template_claim(claim),
        },
        "conditions": [
            c
            for t in (keys.CONDITION_BOUND, keys.CONDITION_PLACED, keys.CONDITION_DELETING)
            if (c := condition_of(claim, t)) is not None
        ],
        "class": klass,
        "budget": {"levels": levels, "ancestorsKnown": readings.namespace is not None},
        "queue": queue(readings),
        "toFit": [],
    }
    if phase == keys.Phase.PENDING.value and bound is None:
        report["toFit"] = ["wait: the binder has not judged this order yet"]
    elif phase in (keys.Phase.PENDING.value, keys.Phase.LOST.value):
        rooms = {
            c["name"]: _headroom(budget_levels(readings, chain, c["name"], snap))
            for c in summaries
            if c["name"] != class_name
        }
        report["toFit"] = suggestions(reason, count, klass, summaries, levels, entitled, rooms)
    if snap is not None and view is not None:
        key = ClaimKey(ns, name)
        info_claim = snap.claim(key)
        report["nodes"] = (
            [r.as_dict() for r in whatif.node_rows(snap, info_claim, now)]
            if info_claim is not None
            else []
        )
        answer = whatif.what_if(snap, key, now)
        report["whatIf"] = answer.as_dict() if answer is not None else None
    return report


# --- text --------------------------------------------------------------------------------


def render(report: Report, *, wide: bool = False) -> list[str]:
    claim = report["claim"]
    lines = [
        f"Claim:      {claim['namespace']}/{claim['name']} "
        f"(class {claim['class']}, {text.units(claim['count'])})",
        f"Phase:      {claim['phase']}" + _where(claim),
    ]
    for cond in report["conditions"]:
        since = (
            f" (since {cond['lastTransitionTime']})" if wide and cond["lastTransitionTime"] else ""
        )
        lines.append(
            f"{cond['type'] + ':':<11} {cond['status']} {cond['reason']}: {cond['message']}{since}"
        )
    lines.append(f"Class:      {class_words(report['class'], claim['class'])}")
    lines.append("Budget:")
    rows = []
    for level in report["budget"]["levels"]:
        where = f"{level['tenant']} (this namespace)" if level["self"] else level["tenant"]
        if not level["readable"]:
            rows.append([where, "(quotas not readable)", "", ""])
            continue
        for row in level["keys"]:
            used = str(row["used"]) if row["usedExact"] else f">={row['used']}"
            limit = "-" if row["limit"] is None else str(row["limit"])
            rows.append([where, row["key"], used, limit])
    lines += text.table(["LEVEL", "KEY", "USED", "LIMIT"], rows, indent="  ")
    if not report["budget"]["ancestorsKnown"]:
        lines.append("  levels above: not readable (the namespace's tenant labels)")
    if any(not r["usedExact"] for lv in report["budget"]["levels"] for r in lv["keys"]):
        lines.append(
            "  >=: counts this namespace's claims only (others under a level are not readable)"
        )
    place = report["queue"]
    if place is not None:
        scope = (
            "in every namespace"
            if place["namespace"] is None
            else f"in namespace {place['namespace']} (the namespace you can list)"
        )
        lines.append(
            f"Queue:      {text.ordinal(place['position'])} of {place['waiting']} waiting "
            f"orders of class {claim['class']} {scope}"
        )
        if place["namespace"] is None:
            for ahead in place["ahead"]:
                lines.append(f"  ahead: {ahead['claim']} ({text.units(ahead['count'])})")
    if report["toFit"]:
        lines.append("To fit:")
        lines += [f"  - {s}" for s in report["toFit"]]
    if "nodes" in report:
        lines += _render_nodes(report["nodes"])
    if report.get("whatIf"):
        lines += _render_what_if(report["whatIf"])
    return lines


def _where(claim: Mapping[str, Any]) -> str:
    parts = []
    if claim["node"]:
        parts.append(f"on node {claim['node']}")
    if claim["attachedTo"]:
        parts.append(f"attached to VMI {claim['attachedTo']}")
    return f" ({', '.join(parts)})" if parts else ""


def _render_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    lines = ["Nodes (closest first):"]
    if not nodes:
        return [*lines, "  none has units of the class or matches its nodeSelector"]
    rows = []
    for n in nodes:
        state = "serves" if n["serves"] else f"no: {n['whyNot']}"
        if n["rejectedUntil"] is not None:
            state += f", rejected until {translate.rfc3339(n['rejectedUntil'])}"
        rows.append([n["node"], n["capacity"], n["held"], n["raw"], n["free"], n["short"], state])
    return lines + text.table(
        ["NODE", "ALLOCATABLE", "HELD", "RAW", "FREE", "SHORT", "TAKES THE CLASS"],
        rows,
        indent="  ",
    )


def _render_what_if(answer: Mapping[str, Any]) -> list[str]:
    verdict = answer["verdict"]
    if verdict == "holds":
        return [f"What-if:    it holds its units on node {answer['node']}"]
    if verdict == "fits":
        return [f"What-if:    fits now on node {answer['node']}: the binder's next pass binds it"]
    lines = [f"What-if:    refused now: {answer['reason']}: {answer['message']}"]
    if answer["roomOn"]:
        lines.append(f"  moves that make room on node {answer['roomOn']}:")
        lines += [
            f"    {m['claim']} ({text.units(m['units'])}) {m['from']} -> {m['to']}"
            for m in answer["moves"]
        ]
    if answer["smallerCount"]:
        small = answer["smallerCount"]
        lines.append(f"  a count of {small['count']} fits now on node {small['node']}")
    for other in answer["otherClasses"]:
        lines.append(f"  class {other['class']} fits now on node {other['node']}")
    return lines
