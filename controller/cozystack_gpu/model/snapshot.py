"""The cluster as the binder sees it, kept up to date one watch event at a time.

A ``Snapshot`` holds the nodes, classes, claims and namespaces, and beside them the indexes a
decision needs: per class, the serving nodes bucketed by free units (best fit without a
scan); per node and resource name, the units claims hold; per tenant and budget key, the
units its subtree uses. Every ``upsert_*``/``remove_*`` call keeps them exact, so a decision
costs the same at 500 nodes as at 50,000, and ``Snapshot.build`` of the same objects gives
the same indexes (``digest`` compares them).

Nothing here does I/O or reads a clock: ``now`` is passed to every call whose answer depends
on time (rejected-node expiry).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from cozystack_gpu.keys import (
    LABEL_VGPU_ENTITLEMENT,
    QUOTA_KEY_TOTAL,
    QUOTA_RAW_REQUESTS_PREFIX,
    VGPU_ENTITLEMENT_VALUE,
    Mode,
    Phase,
    class_of_quota_key,
    effective_max_count,
    quota_key,
    raw_quota_keys,
)
from cozystack_gpu.model._index import ClassIndex
from cozystack_gpu.model.eligibility import selector_matches, why_not_placeable
from cozystack_gpu.model.types import (
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    ClassStatus,
    Decision,
    NamespaceInfo,
    NodeInfo,
    Placement,
    Reason,
    Refusal,
)


class _Acct(NamedTuple):
    """What one claim added to the counters, so removing it takes back exactly that."""

    ancestors: tuple[str, ...]
    class_name: str
    resource: str | None
    node: str | None  # set when the claim takes capacity there
    units: int
    budget: bool


def _bump(table: dict[str, dict[str, int]], outer: str, inner: str, delta: int) -> None:
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


def _ordered_ancestors(ns: NamespaceInfo) -> tuple[str, ...]:
    # The namespace itself first, so a refusal names the nearest tenant when several limit.
    return (ns.name, *sorted(ns.ancestors - {ns.name}))


class Snapshot:
    """Nodes, classes, claims and namespaces, with the indexes decisions read.

    Build one with ``Snapshot.build(...)`` or empty with ``Snapshot()``, then feed every
    watch event to ``upsert_node``/``remove_node``, ``upsert_class``/``remove_class``,
    ``upsert_claim``/``remove_claim`` and ``upsert_namespace``/``remove_namespace``.
    Decisions (``check_order``, ``place_set``, ``class_status``, ``plan``) never change it;
    ``bind`` and ``commit`` record the binder's own writes before their watch events return.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._cap: dict[str, dict[str, int]] = {}
        self._classes: dict[str, ClassInfo] = {}
        self._classes_by_res: dict[str, set[str]] = {}
        self._claims: dict[ClaimKey, ClaimInfo] = {}
        self._namespaces: dict[str, NamespaceInfo] = {}
        self._ancestors: dict[str, tuple[str, ...]] = {}
        self._idx: dict[str, ClassIndex] = {}
        self._served: dict[str, set[str]] = {}
        self._used: dict[str, dict[str, int]] = {}
        self._node_claims: dict[str, set[ClaimKey]] = {}
        self._class_claims: dict[str, set[ClaimKey]] = {}
        self._ns_claims: dict[str, set[ClaimKey]] = {}
        self._set_claims: dict[tuple[str, str], set[ClaimKey]] = {}
        self._pending: set[ClaimKey] = set()
        self._lost: set[ClaimKey] = set()
        self._acct: dict[ClaimKey, _Acct] = {}
        self._bud_class: dict[str, dict[str, int]] = {}
        self._bud_total: dict[str, dict[str, int]] = {}
        self._bud_res: dict[str, dict[str, int]] = {}
        self._bud_raw: dict[str, dict[str, int]] = {}
        self._dirty: set[str] = set()
        self._unsettled: set[str] = set()

    @classmethod
    def build(
        cls,
        *,
        nodes: Iterable[NodeInfo] = (),
        classes: Iterable[ClassInfo] = (),
        claims: Iterable[ClaimInfo] = (),
        namespaces: Iterable[NamespaceInfo] = (),
    ) -> Snapshot:
        """A snapshot of these objects; the same as upserting them one by one."""
        snap = cls()
        for klass in classes:
            snap.upsert_class(klass)
        for ns in namespaces:
            snap.upsert_namespace(ns)
        # Claims before nodes: each node then enters its class indexes once, with its final
        # free units, instead of moving between buckets for every claim on it.
        for claim in claims:
            snap.upsert_claim(claim)
        for node in nodes:
            snap.upsert_node(node)
        return snap

    # --- reading ---------------------------------------------------------------------------

    def node(self, name: str) -> NodeInfo | None:
        return self._nodes.get(name)

    def gpu_class(self, name: str) -> ClassInfo | None:
        return self._classes.get(name)

    def claim(self, key: ClaimKey) -> ClaimInfo | None:
        return self._claims.get(key)

    def namespace(self, name: str) -> NamespaceInfo | None:
        return self._namespaces.get(name)

    def nodes(self) -> Iterator[NodeInfo]:
        return iter(self._nodes.values())

    def classes(self) -> Iterator[ClassInfo]:
        return iter(self._classes.values())

    def claims(self) -> Iterator[ClaimInfo]:
        return iter(self._claims.values())

    def namespaces(self) -> Iterator[NamespaceInfo]:
        return iter(self._namespaces.values())

    def claims_on(self, node: str) -> frozenset[ClaimKey]:
        """Claims whose status names this node, in any phase."""
        return frozenset(self._node_claims.get(node, ()))

    def set_members(self, set_key: tuple[str, str]) -> frozenset[ClaimKey]:
        return frozenset(self._set_claims.get(set_key, ()))

    def pending_keys(self) -> frozenset[ClaimKey]:
        return frozenset(self._pending)

    def lost_keys(self) -> frozenset[ClaimKey]:
        return frozenset(self._lost)

    def serves(self, node: str, class_name: str) -> bool:
        """The node serves the class now (Ready, uncordoned, selector, taints, layout)."""
        return class_name in self._served.get(node, ())

    def why_not_placeable(self, node: NodeInfo, klass: ClassInfo) -> str | None:
        """Why a node cannot take the class whatever its Ready and cordon state; None if it can."""
        names = self._classes_by_res.get(klass.resource_name, ())
        same = [self._classes[c] for c in names] if len(names) > 1 else ()
        return why_not_placeable(node, klass, same)

    def capacity(self, node: str, resource: str) -> int:
        return self._cap.get(node, {}).get(resource, 0)

    def used(self, node: str, resource: str) -> int:
        """Units claims hold on the node, raw-name pods excluded."""
        return self._used.get(node, {}).get(resource, 0)

    def free(self, node: str, resource: str) -> int:
        info = self._nodes.get(node)
        if info is None:
            return 0
        raw = info.raw_used.get(resource, 0)
        return max(0, self.capacity(node, resource) - self.used(node, resource) - raw)

    def over_capacity(self, node: str) -> dict[str, int]:
        """Resource names whose held units exceed capacity there, with the excess."""
        info = self._nodes.get(node)
        if info is None:
            return {}
        excess: dict[str, int] = {}
        for res, units in self._used.get(node, {}).items():
            over = units + info.raw_used.get(res, 0) - self.capacity(node, res)
            if over > 0:
                excess[res] = over
        return excess

    def budget_used(self, tenant: str, key: str) -> int:
        """Units counted against one budget key of one tenant, over its whole subtree.

        ``key`` is ``gpu.cozystack.io/<class>``, ``gpu.cozystack.io/total`` or a raw key
        (``requests.<resource>`` or ``<resource>``, raw-name pods included).
        """
        if key == QUOTA_KEY_TOTAL:
            return self._bud_total.get(tenant, {}).get("", 0)
        class_name = class_of_quota_key(key)
        if class_name is not None:
            return self._bud_class.get(tenant, {}).get(class_name, 0)
        res = key.removeprefix(QUOTA_RAW_REQUESTS_PREFIX)
        return self._bud_res.get(tenant, {}).get(res, 0) + self._bud_raw.get(tenant, {}).get(res, 0)

    def max_count(self, class_name: str) -> int:
        """maxCount resolved: the spec value, else 1 for vGPU and the largest node's units of
        the class for passthrough (0 while no node serves it)."""
        klass = self._classes[class_name]
        return effective_max_count(
            klass.mode.value, klass.max_count, self._idx[class_name].max_cap()
        )

    def class_status(self, class_name: str) -> ClassStatus:
        """``free`` and ``maxFreePerNode`` for GPUClass status, over serving nodes only."""
        idx = self._idx.get(class_name)
        if idx is None:
            return ClassStatus(free=0, max_free_per_node=0)
        return ClassStatus(free=idx.total_free, max_free_per_node=idx.max_free())

    def unsettled_nodes(self) -> frozenset[str]:
        """Nodes where a claim may have to change: an attached claim on a node gone or not
        Ready, or an unattached one on a node that no longer serves its class (cordon
        included) or holds more than its capacity. ``plan`` looks only at these."""
        self._flush()
        return frozenset(self._unsettled)

    # --- nodes -----------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> None:
        name = node.name
        self._nodes[name] = node
        self._cap[name] = node.capacity()
        for class_name in self._classes:
            self._refresh_eligibility(name, class_name)
        self._dirty.add(name)

    def remove_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is None:
            return
        del self._cap[name]
        for class_name in self._served.pop(name, set()):
            self._idx[class_name].remove(name)
        self._dirty.add(name)

    # --- classes ---------------------------------------------------------------------------

    def upsert_class(self, klass: ClassInfo) -> None:
        old = self._classes.get(klass.name)
        # A claim's counters depend on its class only through the resource name.
        keys: set[ClaimKey] = set()
        if old is None or old.resource_name != klass.resource_name:
            keys = self._class_claims.get(klass.name, set())
        for key in keys:
            self._apply(self._acct[key], -1)
        affected = {klass.name}
        if old is not None:
            self._classes_by_res[old.resource_name].discard(old.name)
            affected |= self._classes_by_res[old.resource_name]
            if not self._classes_by_res[old.resource_name]:
                del self._classes_by_res[old.resource_name]
        self._classes[klass.name] = klass
        self._classes_by_res.setdefault(klass.resource_name, set()).add(klass.name)
        affected |= self._classes_by_res[klass.resource_name]
        self._idx.setdefault(klass.name, ClassIndex())
        for key in keys:
            acct = self._make_acct(self._claims[key])
            self._acct[key] = acct
            self._apply(acct, 1)
        for class_name in sorted(affected):
            for node in self._nodes:
                self._refresh_eligibility(node, class_name)
        self._dirty.update(self._node_claims)

    def remove_class(self, name: str) -> None:
        old = self._classes.get(name)
        if old is None:
            return
        keys = self._class_claims.get(name, set())
        for key in keys:
            self._apply(self._acct[key], -1)
        del self._classes[name]
        same = self._classes_by_res[old.resource_name]
        same.discard(name)
        if not same:
            del self._classes_by_res[old.resource_name]
        idx = self._idx.pop(name)
        for node in idx.free:
            self._served[node].discard(name)
        for key in keys:
            acct = self._make_acct(self._claims[key])
            self._acct[key] = acct
            self._apply(acct, 1)
        for class_name in sorted(same):
            for node in self._nodes:
                self._refresh_eligibility(node, class_name)
        self._dirty.update(self._node_claims)

    # --- namespaces ------------------------------------------------------------------------

    def upsert_namespace(self, ns: NamespaceInfo) -> None:
        old = self._namespaces.get(ns.name)
        old_anc = self._ancestors.get(ns.name, (ns.name,))
        new_anc = _ordered_ancestors(ns)
        if old is not None:
            self._apply_raw(old_anc, old.raw_used, -1)
        self._namespaces[ns.name] = ns
        self._ancestors[ns.name] = new_anc
        self._apply_raw(new_anc, ns.raw_used, 1)
        if new_anc != old_anc:
            self._reaccount(self._ns_claims.get(ns.name, set()))

    def remove_namespace(self, name: str) -> None:
        old = self._namespaces.pop(name, None)
        if old is None:
            return
        old_anc = self._ancestors.pop(name)
        self._apply_raw(old_anc, old.raw_used, -1)
        if old_anc != (name,):
            self._reaccount(self._ns_claims.get(name, set()))

    # --- claims ----------------------------------------------------------------------------

    def upsert_claim(self, claim: ClaimInfo) -> None:
        key = claim.key
        if key in self._claims:
            self._drop_claim(key)
        self._claims[key] = claim
        acct = self._make_acct(claim)
        self._acct[key] = acct
        self._apply(acct, 1)
        self._class_claims.setdefault(claim.class_name, set()).add(key)
        self._ns_claims.setdefault(claim.namespace, set()).add(key)
        self._set_claims.setdefault(claim.set_key, set()).add(key)
        if claim.node is not None:
            self._node_claims.setdefault(claim.node, set()).add(key)
            self._dirty.add(claim.node)
        if claim.phase is Phase.PENDING:
            self._pending.add(key)
        elif claim.phase is Phase.LOST:
            self._lost.add(key)

    def remove_claim(self, key: ClaimKey) -> None:
        if key in self._claims:
            self._drop_claim(key)

    def bind(self, claim: ClaimInfo, node: str, now: float) -> ClaimInfo:
        """Record the binder's bind of a claim to a node (Pending or Lost → Bound) and return
        the claim as its status should be written."""
        bound = _with(claim, phase=Phase.BOUND, node=node, bound_at=now)
        if claim.phase is Phase.LOST:
            bound = _with(bound, attached_to=None, vmi_live=False)
        self.upsert_claim(bound)
        return bound

    def _drop_claim(self, key: ClaimKey) -> None:
        claim = self._claims.pop(key)
        self._apply(self._acct.pop(key), -1)
        _discard(self._class_claims, claim.class_name, key)
        _discard(self._ns_claims, claim.namespace, key)
        _discard(self._set_claims, claim.set_key, key)
        if claim.node is not None:
            _discard(self._node_claims, claim.node, key)
            self._dirty.add(claim.node)
        self._pending.discard(key)
        self._lost.discard(key)

    # --- decisions -------------------------------------------------------------------------

    def check_order(
        self, claim: ClaimInfo, now: float, nodes: Collection[str] | None = None
    ) -> Decision:
        """Judge one order: class, maxCount, vGPU entitlement, budget chain, then capacity
        on one serving node (best fit, skipping the claim's unexpired rejected nodes).

        A claim that already counts (Bound, Attached, Lost) skips the entitlement and
        budget (and maxCount) checks, so moving or rebinding it never fails on them.
        """
        return self.place_set((claim,), now, nodes)

    def place_set(
        self,
        claims: Sequence[ClaimInfo],
        now: float,
        nodes: Collection[str] | None = None,
        exclude: Collection[str] = (),
    ) -> Decision:
        """Place the claims of one VM together on one node serving every class of the set.

        ``nodes`` limits the choice (a WaitForFirstConsumer volume's node affinity);
        ``exclude`` leaves nodes out (a set that must leave its node). Rejected nodes of any
        claim in the set are skipped until their ``until``. Pending claims are judged by
        budget in order, each counted as Bound before the next. A set whose members hold
        units on one node that still takes them all stays there.
        """
        if not claims:
            raise ValueError("place_set needs at least one claim")
        demand: dict[str, int] = {}
        for claim in claims:
            klass = self._classes.get(claim.class_name)
            if klass is None:
                return Refusal(Reason.CLASS_MISSING, f"class {claim.class_name} does not exist")
            if klass.deleting and claim.phase is Phase.PENDING:
                return Refusal(
                    Reason.CLASS_DELETING,
                    f"class {klass.name} is being deleted and takes no new orders",
                )
            demand[klass.name] = demand.get(klass.name, 0) + claim.count
        vgpu = sorted(n for n in demand if self._classes[n].mode is Mode.VGPU)
        if len(vgpu) > 1:
            return Refusal(
                Reason.VGPU_CLASSES_MIXED,
                f"a VM takes one vGPU class; the set asks for {', '.join(vgpu)}",
            )
        # maxCount judges orders; a move or rebind of units already held is judged by
        # capacity alone, so a hold is not refused for what the largest node became.
        ordering = any(not c.counts_budget for c in claims)
        for name in sorted(demand) if ordering else ():
            limit = self.max_count(name)
            if limit > 0 and demand[name] > limit:
                return Refusal(
                    Reason.MAX_COUNT_EXCEEDED,
                    f"class {name} allows at most {_units(limit)} per VM; "
                    f"the set asks for {demand[name]}",
                )
        refusal = self._check_orders([c for c in claims if not c.counts_budget])
        if refusal is not None:
            return refusal
        return self._find_node(demand, claims, now, nodes, exclude)

    # --- budgets ---------------------------------------------------------------------------

    def _check_orders(self, orders: Sequence[ClaimInfo]) -> Refusal | None:
        extra: dict[tuple[str, str], int] = {}
        for claim in orders:
            klass = self._classes[claim.class_name]
            ns = self._namespaces.get(claim.namespace)
            if klass.mode is Mode.VGPU and (ns is None or not ns.vgpu_entitled):
                return Refusal(
                    Reason.VGPU_NOT_ENTITLED,
                    f"namespace {claim.namespace} lacks the label "
                    f'{LABEL_VGPU_ENTITLEMENT}: "{VGPU_ENTITLEMENT_VALUE}" '
                    f"that vGPU class {klass.name} needs",
                )
            refusal = self._check_budget(claim, klass, extra)
            if refusal is not None:
                return refusal
        return None

    def _check_budget(
        self, claim: ClaimInfo, klass: ClassInfo, extra: dict[tuple[str, str], int]
    ) -> Refusal | None:
        class_key = quota_key(klass.name)
        res = klass.resource_name
        count = claim.count
        ancestors = self._ancestors.get(claim.namespace, (claim.namespace,))
        for tenant in ancestors:
            ns = self._namespaces.get(tenant)
            if ns is None or not ns.quota:
                continue
            quota = ns.quota
            checks: list[tuple[str, int, int]] = []
            if class_key in quota:
                used = self._bud_class.get(tenant, {}).get(klass.name, 0)
                checks.append((class_key, quota[class_key], used))
            if QUOTA_KEY_TOTAL in quota:
                used = self._bud_total.get(tenant, {}).get("", 0)
                checks.append((QUOTA_KEY_TOTAL, quota[QUOTA_KEY_TOTAL], used))
            for raw_key in raw_quota_keys(res):
                if raw_key not in quota:
                    continue
                covered = class_key in quota or (
                    klass.mode is Mode.PASSTHROUGH and QUOTA_KEY_TOTAL in quota
                )
                if not covered:
                    also = "" if klass.mode is Mode.VGPU else f" or {QUOTA_KEY_TOTAL}"
                    return Refusal(
                        Reason.RAW_KEY_UNCOVERED,
                        f"{tenant} limits {res} by quota key {raw_key} and has no "
                        f"{class_key}{also} key for class {klass.name}",
                    )
                used = self._bud_res.get(tenant, {}).get(res, 0) + self._bud_raw.get(
                    tenant, {}
                ).get(res, 0)
                checks.append((raw_key, quota[raw_key], used))
            for key, limit, used in checks:
                used += extra.get((tenant, key), 0)
                if used + count > limit:
                    return Refusal(
                        Reason.BUDGET_EXCEEDED,
                        f"{tenant} has {used} of {limit} {key} in use; "
                        f"the order needs {count} more",
                    )
            for key, _limit, _used in checks:
                extra[(tenant, key)] = extra.get((tenant, key), 0) + count
        return None

    # --- capacity --------------------------------------------------------------------------

    def _find_node(
        self,
        demand: dict[str, int],
        claims: Sequence[ClaimInfo],
        now: float,
        nodes: Collection[str] | None,
        exclude: Collection[str],
    ) -> Decision:
        res_of = {name: self._classes[name].resource_name for name in demand}
        by_res: dict[str, str] = {}
        for name in sorted(demand):
            other = by_res.setdefault(res_of[name], name)
            if other != name:
                return Refusal(
                    Reason.NO_NODE_SERVES,
                    f"classes {other} and {name} share resource name {res_of[name]}, "
                    "so no node serves both",
                )
        skip = {r.node for c in claims for r in c.rejected if r.until > now}
        skip.update(exclude)
        credit: dict[str, dict[str, int]] = {}
        for claim in claims:
            if claim.holds_node and claim.node is not None:
                row = credit.setdefault(claim.node, {})
                res = res_of[claim.class_name]
                row[res] = row.get(res, 0) + claim.count
        order = sorted(demand, key=lambda n: (-demand[n], n))
        primary = order[0]
        pidx = self._idx[primary]
        pres = res_of[primary]
        pneed = demand[primary]
        others = [(self._idx[n], demand[n], res_of[n]) for n in order[1:]]
        allowed = None if nodes is None else set(nodes)

        def fits_others(node: str) -> bool:
            row = credit.get(node)
            for idx, need, res in others:
                free = idx.free.get(node)
                if free is None or free + (row.get(res, 0) if row else 0) < need:
                    return False
            return True

        def usable(node: str) -> bool:
            return node not in skip and (allowed is None or node in allowed)

        best: tuple[int, str] | None = None
        for node in sorted(credit):
            free = pidx.free.get(node)
            if free is None or not usable(node):
                continue
            free += credit[node].get(pres, 0)
            if free >= pneed and fits_others(node):
                if len(credit) == 1:
                    return Placement(node)
                if best is None or (free, node) < best:
                    best = (free, node)
        if allowed is not None:
            for node in allowed:
                free = pidx.free.get(node)
                if free is None or free < pneed or node in skip or node in credit:
                    continue
                if others and not fits_others(node):
                    continue
                if best is None or (free, node) < best:
                    best = (free, node)
        else:
            accept: Callable[[str], bool] | None = None
            if skip or credit or others:

                def accept(node: str) -> bool:
                    return node not in skip and node not in credit and fits_others(node)

            found = pidx.best(pneed, accept)
            if found is not None and (best is None or (pidx.free[found], found) < best):
                best = (pidx.free[found], found)
        if best is not None:
            return Placement(best[1])
        return self._capacity_refusal(order, demand, skip, allowed)

    def _capacity_refusal(
        self,
        order: list[str],
        demand: dict[str, int],
        skip: set[str],
        allowed: set[str] | None,
    ) -> Refusal:
        where = ""
        if allowed is not None:
            where += " among the nodes the VM may use"
        if skip:
            where += " apart from " + ", ".join(sorted(skip))

        def usable(node: str) -> bool:
            return node not in skip and (allowed is None or node in allowed)

        pidx = self._idx[order[0]]
        if len(order) == 1:
            if allowed is not None:
                frees = [pidx.free[n] for n in allowed if n in pidx.free and usable(n)]
                largest = max(frees) if frees else None
            else:
                largest = pidx.largest(usable if skip else None)
            if largest is None:
                return Refusal(Reason.NO_NODE_SERVES, f"no node serves class {order[0]}{where}")
            return Refusal(
                Reason.INSUFFICIENT_CAPACITY,
                f"no node serving class {order[0]}{where} has {demand[order[0]]} free "
                f"{'unit' if demand[order[0]] == 1 else 'units'}; "
                f"the largest has {largest}",
            )
        names = sorted(order)
        idxs = [self._idx[n] for n in names]
        smallest = min(idxs, key=len)
        if not any(usable(n) and all(n in i for i in idxs) for n in smallest.free):
            return Refusal(
                Reason.NO_NODE_SERVES,
                f"no node serves every class of the set ({', '.join(names)}){where}",
            )
        wanted = ", ".join(f"{n}: {demand[n]}" for n in names)
        return Refusal(
            Reason.INSUFFICIENT_CAPACITY,
            f"no node serving classes {', '.join(names)}{where} has room for the set ({wanted})",
        )

    # --- bookkeeping -----------------------------------------------------------------------

    def _make_acct(self, claim: ClaimInfo) -> _Acct:
        klass = self._classes.get(claim.class_name)
        res = klass.resource_name if klass is not None else None
        node = claim.node if claim.holds_node and res is not None else None
        return _Acct(
            self._ancestors.get(claim.namespace, (claim.namespace,)),
            claim.class_name,
            res,
            node,
            claim.count,
            claim.counts_budget,
        )

    def _apply(self, acct: _Acct, sign: int) -> None:
        delta = sign * acct.units
        if acct.budget:
            for tenant in acct.ancestors:
                _bump(self._bud_class, tenant, acct.class_name, delta)
                _bump(self._bud_total, tenant, "", delta)
                if acct.resource is not None:
                    _bump(self._bud_res, tenant, acct.resource, delta)
        if acct.node is not None and acct.resource is not None:
            _bump(self._used, acct.node, acct.resource, delta)
            self._refresh_free(acct.node, acct.resource)
            self._dirty.add(acct.node)

    def _apply_raw(self, ancestors: tuple[str, ...], raw: Mapping[str, int], sign: int) -> None:
        for res, units in raw.items():
            for tenant in ancestors:
                _bump(self._bud_raw, tenant, res, sign * units)

    def _reaccount(self, keys: Iterable[ClaimKey]) -> None:
        for key in list(keys):
            self._apply(self._acct[key], -1)
            acct = self._make_acct(self._claims[key])
            self._acct[key] = acct
            self._apply(acct, 1)

    def _refresh_free(self, node: str, res: str) -> None:
        served = self._served.get(node)
        if not served:
            return
        for class_name in served:
            if self._classes[class_name].resource_name == res:
                self._idx[class_name].put(node, self.free(node, res), self.capacity(node, res))

    def _refresh_eligibility(self, node_name: str, class_name: str) -> None:
        node = self._nodes[node_name]
        klass = self._classes[class_name]
        served = self._served.get(node_name)
        # Cheapest tests first: a node event re-judges every class, and most classes fail
        # on the selector; the full rule (with its message) only runs for the rest.
        ok = (
            node.ready
            and not node.unschedulable
            and selector_matches(node, klass)
            and self.why_not_placeable(node, klass) is None
        )
        if ok:
            if served is None:
                served = self._served[node_name] = set()
            served.add(class_name)
            res = klass.resource_name
            self._idx[class_name].put(
                node_name, self.free(node_name, res), self.capacity(node_name, res)
            )
        elif served is not None and class_name in served:
            served.discard(class_name)
            self._idx[class_name].remove(node_name)

    def _flush(self) -> None:
        for node in self._dirty:
            if self._settled(node):
                self._unsettled.discard(node)
            else:
                self._unsettled.add(node)
        self._dirty.clear()

    def _settled(self, name: str) -> bool:
        keys = self._node_claims.get(name)
        if not keys:
            return True
        node = self._nodes.get(name)
        served = self._served.get(name, set())
        has_unattached = False
        for key in keys:
            claim = self._claims[key]
            if claim.phase is Phase.ATTACHED:
                if node is None or not node.ready:
                    return False
            elif claim.phase is Phase.BOUND:
                has_unattached = True
                if claim.class_name in self._classes and claim.class_name not in served:
                    return False
        return not (has_unattached and self.over_capacity(name))

    def digest(self) -> dict[str, Any]:
        """Every derived number, in plain sorted form: two snapshots of the same objects have
        equal digests however they were built. For tests and debugging."""
        self._flush()
        return {
            "free": {c: sorted(i.free.items()) for c, i in sorted(self._idx.items())},
            "cap": {c: sorted(i.cap.items()) for c, i in sorted(self._idx.items())},
            "status": {c: self.class_status(c) for c in sorted(self._idx)},
            "max_count": {c: self.max_count(c) for c in sorted(self._classes)},
            "used": _sorted_table(self._used),
            "budget_class": _sorted_table(self._bud_class),
            "budget_total": _sorted_table(self._bud_total),
            "budget_res": _sorted_table(self._bud_res),
            "budget_raw": _sorted_table(self._bud_raw),
            "pending": sorted(self._pending),
            "lost": sorted(self._lost),
            "node_claims": {n: sorted(k) for n, k in sorted(self._node_claims.items()) if k},
            "sets": {str(s): sorted(k) for s, k in sorted(self._set_claims.items()) if k},
            "unsettled": sorted(self._unsettled),
        }


def _units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def _sorted_table(table: dict[str, dict[str, int]]) -> dict[str, list[tuple[str, int]]]:
    return {
        k: sorted((i, v) for i, v in row.items() if v) for k, row in sorted(table.items()) if row
    }


def _discard(table: dict[Any, set[ClaimKey]], key: Any, item: ClaimKey) -> None:
    members = table.get(key)
    if members is not None:
        members.discard(item)
        if not members:
            del table[key]


def _with(claim: ClaimInfo, **changes: Any) -> ClaimInfo:
    return replace(claim, **changes)
