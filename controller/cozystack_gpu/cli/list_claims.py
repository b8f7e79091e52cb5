"""``kubectl gpu list claims``: the claims a user can list, filtered by class, phase, tenant
and node, one line each with why a waiting one waits (as ``kubectl kueue list workload``).

Pure: claims and namespaces in, rows out. The node filter is also sent to the API server as
a field selector (``status.nodeName`` is a selectable field), so a node's claims list
without reading every claim; the others are applied here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cli import text
from cozystack_gpu.objects import Obj, translate

PHASES = tuple(p.value for p in keys.Phase)


@dataclass(frozen=True)
class Filters:
    """What to keep; None keeps every value. ``tenant``: the namespaces of a tenant's
    subtree (its own and its descendants', by Cozystack's ancestry labels)."""

    gpu_class: str | None = None
    phase: str | None = None
    tenant: str | None = None
    node: str | None = None

    def field_selector(self) -> str:
        return f"{keys.FIELD_CLAIM_NODE}={self.node}" if self.node else ""

    def keep(self, obj: Obj, phase: str, tenant_namespaces: frozenset[str] | None) -> bool:
        """Whether a claim or reservation (whose phase is ``phase``) passes the filters and
        lies in ``tenant_namespaces`` (None: any namespace)."""
        spec = obj.get("spec") or {}
        node = (obj.get("status") or {}).get("nodeName")
        return (
            (self.gpu_class is None or spec.get("class") == self.gpu_class)
            and (self.phase is None or phase == self.phase)
            and (self.node is None or node == self.node)
            and (tenant_namespaces is None or translate.namespace_of(obj) in tenant_namespaces)
        )


def _status(claim: Obj) -> Mapping[str, Any]:
    return claim.get("status") or {}


def phase_of(claim: Obj) -> str:
    return str(_status(claim).get("phase") or keys.Phase.PENDING.value)


def why(claim: Obj) -> str:
    """The reason of the condition that says why a claim waits (a template claim's Placed,
    an order's Bound), or '' for one that does not."""
    conditions = {c.get("type"): c for c in _status(claim).get("conditions") or []}
    for kind in (keys.CONDITION_PLACED, keys.CONDITION_BOUND):
        cond = conditions.get(kind)
        if cond is not None and cond.get("status") == "False" and cond.get("reason"):
            return str(cond["reason"])
    return ""


def subtree(tenant: str, namespaces: Iterable[Obj]) -> frozenset[str]:
    """The namespaces under ``tenant``: those carrying its ancestry label, and itself."""
    found = {
        translate.name_of(n)
        for n in namespaces
        if tenant in keys.tenant_ancestors(dict((n.get("metadata") or {}).get("labels") or {}))
    }
    return frozenset({tenant, *found})


def rows(
    claims: Iterable[Obj], filters: Filters, now: float, tenant_namespaces: frozenset[str] | None
) -> list[dict[str, Any]]:
    """The claims that pass ``filters``, by namespace and name."""
    kept = []
    for claim in claims:
        spec = claim.get("spec") or {}
        status = _status(claim)
        namespace = translate.namespace_of(claim)
        if not filters.keep(claim, phase_of(claim), tenant_namespaces):
            continue
        created = translate.timestamp((claim.get("metadata") or {}).get("creationTimestamp"))
        kept.append(
            {
                "namespace": namespace,
                "name": translate.name_of(claim),
                "class": spec.get("class"),
                "count": int(spec.get("count") or 1),
                "phase": phase_of(claim),
                "node": status.get("nodeName"),
                "attachedTo": status.get("attachedTo"),
                "template": translate.is_template_claim(claim),
                "why": why(claim) or None,
                "age": None if created is None else max(now - created, 0.0),
            }
        )
    return sorted(kept, key=lambda r: (r["namespace"], r["name"]))


def render(report: Mapping[str, Any], *, wide: bool = False) -> list[str]:
    items: Sequence[Mapping[str, Any]] = report["items"]
    if not items:
        return [f"No GPU claims found{report.get('scope', '')}."]
    header = ["NAMESPACE", "NAME", "CLASS", "COUNT", "PHASE", "NODE", "WHY", "AGE"]
    if wide:
        header[6:6] = ["ATTACHED", "TEMPLATE"]
    out = []
    for r in items:
        row = [
            r["namespace"],
            r["name"],
            r["class"],
            r["count"],
            r["phase"],
            r["node"] or "-",
            r["why"] or "-",
            text.age(r["age"]),
        ]
        if wide:
            row[6:6] = [r["attachedTo"] or "-", "yes" if r["template"] else "-"]
        out.append(row)
    return text.table(header, out)
