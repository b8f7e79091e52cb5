"""Budget arithmetic: the units each tenant's subtree uses, per budget key, and whether an
order fits under every key on the way up the tenant tree.

Kept apart from placement (the way cozystack keeps ``tenantquota/pool.go`` apart from its
placement code): nothing here knows nodes. The snapshot tells the ledger what each claim
adds or takes back; the ledger answers ``used`` and ``check_orders``.

Rules (SPEC.md §4): a key on a tenant or any ancestor limits the sum over that tenant's
subtree, and a child's key only adds a limit. ``gpu.cozystack.io/<class>`` counts one class,
``gpu.cozystack.io/total`` every class, and a raw key on a resource name
(``requests.<name>`` or ``<name>``) counts claims of classes with that name plus raw-name
pods. Bound, Attached and Lost claims count (a Lost one too, so its rebind never fails a
budget check); a Pending one is judged when it binds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, NamedTuple

from cozystack_gpu.keys import (
    LABEL_VGPU_ENTITLEMENT,
    QUOTA_KEY_TOTAL,
    QUOTA_RAW_REQUESTS_PREFIX,
    VGPU_ENTITLEMENT_VALUE,
    Mode,
    class_of_quota_key,
    quota_key,
    raw_quota_keys,
)
from cozystack_gpu.model.types import ClaimInfo, ClassInfo, NamespaceInfo, Reason, Refusal

Table = dict[str, dict[str, int]]


class Tally(StrEnum):
    """Which count a budget key reads: one class, every class, or one resource name."""

    CLASS = "class"
    TOTAL = "total"
    RESOURCE = "resource"


def tallies(class_name: str, resource: str | None) -> tuple[tuple[Tally, str], ...]:
    """The counts a unit of the class adds to: its class, the total and, when its class is
    known, its resource name (which the raw keys read)."""
    rows = ((Tally.CLASS, class_name), (Tally.TOTAL, ""))
    return rows if resource is None else (*rows, (Tally.RESOURCE, resource))


def tally_of_key(key: str) -> tuple[Tally, str]:
    """The count one budget key reads: ``gpu.cozystack.io/total``, ``gpu.cozystack.io/<class>``
    or a raw key on a resource name (``requests.<name>`` or ``<name>``)."""
    if key == QUOTA_KEY_TOTAL:
        return Tally.TOTAL, ""
    class_name = class_of_quota_key(key)
    if class_name is not None:
        return Tally.CLASS, class_name
    return Tally.RESOURCE, key.removeprefix(QUOTA_RAW_REQUESTS_PREFIX)


class Limit(NamedTuple):
    """One budget key an order must stay under: the tenant that set it, the key, its limit."""

    tenant: str
    key: str
    limit: int


class Charge(NamedTuple):
    """What one claim counts against budgets, so taking it back removes exactly that."""

    ancestors: tuple[str, ...]
    class_name: str
    resource: str | None
    units: int


def vgpu_not_entitled(namespace: str, class_name: str) -> str:
    """Why a namespace may not order a vGPU class, and who can change it: the entitlement is
    the Tenant's, set by its parent (seed 004: no tenant can grant itself vGPU), and
    Cozystack writes its effective value as the namespace label."""
    return (
        f"vGPU class {class_name} needs the vGPU entitlement, which namespace {namespace} "
        "does not have; a tenant cannot grant it to itself: the parent tenant's administrator "
        "(the platform administrator for the root tenant) grants vGPU on the Tenant, and "
        f'Cozystack then labels the namespace {LABEL_VGPU_ENTITLEMENT}: "{VGPU_ENTITLEMENT_VALUE}"'
    )


def bump(table: Table, outer: str, inner: str, delta: int) -> None:
    """Add ``delta`` to ``table[outer][inner]``, dropping rows that reach zero."""
    row = table.get(outer)
    if row is None:
        row = table[outer] = {}
    value = row.get(inner, 0) + delta
    if value:
        row[inner] = value
    else:
        row.pop(inner, None)
        if not row:
            del table[outer]


def ordered_ancestors(ns: NamespaceInfo) -> tuple[str, ...]:
    # The namespace itself first, so a refusal names the nearest tenant when several limit.
    return (ns.name, *sorted(ns.ancestors - {ns.name}))


class Ledger:
    """Units per tenant and budget key, over each tenant's subtree."""

    def __init__(self) -> None:
        self._namespaces: dict[str, NamespaceInfo] = {}
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._by_class: Table = {}  # tenant -> class -> units
        self._total: Table = {}  # tenant -> "" -> units
        self._by_resource: Table = {}  # tenant -> resource name -> units of claims
        self._raw: Table = {}  # tenant -> resource name -> units of raw-name pods
        self._tables = {
            Tally.CLASS: self._by_class,
            Tally.TOTAL: self._total,
            Tally.RESOURCE: self._by_resource,
        }
        # What reservations hold under each count at their busiest moment, beyond what
        # their claims already count (set by the snapshot): an order leaves it free.
        self._booked: dict[tuple[str, Tally, str], int] = {}

    # --- tenants -----------------------------------------------------------------------

    def ancestors(self, namespace: str) -> tuple[str, ...]:
        """The namespace and every tenant above it, nearest first."""
        return self._ancestors.get(namespace, (namespace,))

    def set_namespace(self, ns: NamespaceInfo) -> bool:
        """Take in a namespace's labels, quota and raw-name usage; True when its ancestry
        changed (its claims must then be charged again along the new chain)."""
        old = self._namespaces.get(ns.name)
        old_anc = self.ancestors(ns.name)
        new_anc = ordered_ancestors(ns)
        if old is not None:
            self._charge_raw(old_anc, old.raw_used, -1)
        self._namespaces[ns.name] = ns
        self._ancestors[ns.name] = new_anc
        self._charge_raw(new_anc, ns.raw_used, 1)
        return new_anc != old_anc

    def remove_namespace(self, name: str) -> bool:
        """Forget a namespace; True when its claims must be charged again."""
        old = self._namespaces.pop(name, None)
        if old is None:
            return False
        old_anc = self._ancestors.pop(name)
        self._charge_raw(old_anc, old.raw_used, -1)
        return old_anc != (name,)

    # --- charges -----------------------------------------------------------------------

    def charge(self, charge: Charge, sign: int) -> None:
        delta = sign * charge.units
        rows = [
            (self._tables[t], inner) for t, inner in tallies(charge.class_name, charge.resource)
        ]
        for tenant in charge.ancestors:
            for table, inner in rows:
                bump(table, tenant, inner, delta)

    def _charge_raw(self, ancestors: tuple[str, ...], raw: Mapping[str, int], sign: int) -> None:
        for res, units in raw.items():
            for tenant in ancestors:
                bump(self._raw, tenant, res, sign * units)

    def used(self, tenant: str, key: str) -> int:
        """Units counted against one budget key of one tenant, over its whole subtree.

        ``key`` is ``gpu.cozystack.io/<class>``, ``gpu.cozystack.io/total`` or a raw key
        (``requests.<resource>`` or ``<resource>``, raw-name pods included).
        """
        tally, inner = tally_of_key(key)
        if tally is Tally.TOTAL:
            return self._total.get(tenant, {}).get(inner, 0)
        if tally is Tally.CLASS:
            return self._by_class.get(tenant, {}).get(inner, 0)
        return self._by_resource.get(tenant, {}).get(inner, 0) + self._raw.get(tenant, {}).get(
            inner, 0
        )

    def set_booked(self, tenant: str, tally: Tally, inner: str, units: int) -> None:
        """What reservations keep from orders under one count of a tenant (0 forgets it)."""
        if units:
            self._booked[(tenant, tally, inner)] = units
        else:
            self._booked.pop((tenant, tally, inner), None)

    def booked(self, tenant: str, key: str) -> int:
        """Units an order must leave under one budget key for the windows booked below it."""
        if not self._booked:
            return 0
        return self._booked.get((tenant, *tally_of_key(key)), 0)

    def tables(self) -> dict[str, Any]:
        """Every tally, for comparing two ledgers of the same objects."""
        return {
            "class": self._by_class,
            "total": self._total,
            "resource": self._by_resource,
            "raw": self._raw,
            "booked": self._booked,
        }

    def depth(self, tenant: str) -> int:
        """How far below the root of its tree a tenant is (the root tenant is 0)."""
        return len(self.ancestors(tenant)) - 1

    def parent(self, tenant: str) -> str | None:
        """The tenant right above, the deepest of its ancestors; None for a root."""
        above = [a for a in self.ancestors(tenant) if a != tenant]
        return max(above, key=lambda a: (self.depth(a), a)) if above else None

    def _level(self, tenant: str, namespace: str) -> str:
        if tenant == namespace:
            return "this namespace's own quota"
        levels = self.depth(namespace) - self.depth(tenant)
        return f"{levels} level{'' if levels == 1 else 's'} above {namespace}"

    def _who_raises(self, tenant: str) -> str:
        """Who can raise a budget key: the hoster, who writes the namespace's ResourceQuota
        (any cluster); on Cozystack a tenant's quota is set on its Tenant, by its parent
        tenant, and the root tenant's by the platform administrator. A tenant never raises
        its own."""
        parent = self.parent(tenant)
        if parent is None:
            return "the hoster can raise it (on Cozystack, the platform administrator)"
        return (
            "the hoster can raise it (on Cozystack, the administrator of its parent tenant "
            f"{parent}, on the Tenant)"
        )

    # --- judging orders ----------------------------------------------------------------

    def check_orders(
        self, orders: Sequence[ClaimInfo], classes: Mapping[str, ClassInfo]
    ) -> Refusal | None:
        """Judge orders of one set in turn, each counted as bound before the next: the vGPU
        entitlement of the namespace, then every budget key on the way up."""
        extra: dict[tuple[str, str], int] = {}
        for claim in orders:
            klass = classes[claim.class_name]
            refusal = self.entitlement_refusal(claim.namespace, klass)
            if refusal is not None:
                return refusal
            refusal = self._check_budget(claim, klass, extra)
            if refusal is not None:
                return refusal
        return None

    def entitlement_refusal(self, namespace: str, klass: ClassInfo) -> Refusal | None:
        """A vGPU class needs the namespace's vGPU entitlement; None when it may order."""
        ns = self._namespaces.get(namespace)
        if klass.mode is Mode.VGPU and (ns is None or not ns.vgpu_entitled):
            return Refusal(Reason.VGPU_NOT_ENTITLED, vgpu_not_entitled(namespace, klass.name))
        return None

    def budget_checks(self, namespace: str, klass: ClassInfo) -> tuple[list[Limit], Refusal | None]:
        """Every budget key an order of the class in the namespace must stay under, nearest
        tenant first; and the refusal of a raw key a tenant left without a class key, which
        comes after the keys of the tenants below it (so those are judged first) and stops
        the list there."""
        class_key = quota_key(klass.name)
        res = klass.resource_name
        limits: list[Limit] = []
        for tenant in self.ancestors(namespace):
            ns = self._namespaces.get(tenant)
            if ns is None or not ns.quota:
                continue
            quota = ns.quota
            own: list[Limit] = []
            if class_key in quota:
                own.append(Limit(tenant, class_key, quota[class_key]))
            if QUOTA_KEY_TOTAL in quota:
                own.append(Limit(tenant, QUOTA_KEY_TOTAL, quota[QUOTA_KEY_TOTAL]))
            for raw_key in raw_quota_keys(res):
                if raw_key not in quota:
                    continue
                # A raw key alone would let class orders slip past it: the tenant must say
                # how the class counts (its class key, or total for passthrough).
                covered = class_key in quota or (
                    klass.mode is Mode.PASSTHROUGH and QUOTA_KEY_TOTAL in quota
                )
                if not covered:
                    also = "" if klass.mode is Mode.VGPU else f" or {QUOTA_KEY_TOTAL}"
                    return limits, Refusal(
                        Reason.RAW_KEY_UNCOVERED,
                        f"{tenant} limits {res} by quota key {raw_key} and has no "
                        f"{class_key}{also} key for class {klass.name}",
                    )
                own.append(Limit(tenant, raw_key, quota[raw_key]))
            limits += own
        return limits, None

    def over_budget(self, limit: Limit, namespace: str, held: str, asks: str) -> Refusal:
        """The refusal of a budget key: who set it, how far above the namespace, what it
        allows, what ``held`` already and what ``asks`` more, and who can raise it."""
        return Refusal(
            Reason.BUDGET_EXCEEDED,
            f"budget {limit.key} of {limit.tenant} ({self._level(limit.tenant, namespace)}) "
            f"allows {limit.limit}: {held}, {asks} more; " + self._who_raises(limit.tenant),
        )

    def _check_budget(
        self, claim: ClaimInfo, klass: ClassInfo, extra: dict[tuple[str, str], int]
    ) -> Refusal | None:
        limits, uncovered = self.budget_checks(claim.namespace, klass)
        count = claim.count
        for limit in limits:
            used = self.used(limit.tenant, limit.key) + extra.get((limit.tenant, limit.key), 0)
            booked = self.booked(limit.tenant, limit.key)
            if used + booked + count > limit.limit:
                held = f"{used} in use"
                if booked:
                    held += f" and {booked} booked by reservations at their busiest moment"
                asks = f"the order asks {count}"
                return self.over_budget(limit, claim.namespace, held, asks)
        if uncovered is not None:
            return uncovered
        for limit in limits:
            extra[(limit.tenant, limit.key)] = extra.get((limit.tenant, limit.key), 0) + count
        return None
