"""The cluster as the binder sees it, kept up to date one watch event at a time.

A ``Snapshot`` holds the nodes, classes, claims and namespaces, and beside them the indexes a
decision needs: per class, the serving nodes bucketed by free units (best fit without a
scan); per node and resource name, the units claims hold; per tenant and budget key, the
units its subtree uses (the budget ``Ledger``). Every ``upsert_*``/``remove_*`` call keeps
them exact, so a decision costs the same at 500 nodes as at 50,000, and ``Snapshot.build`` of
the same objects gives the same indexes (the model tests compare an incremental snapshot with
a rebuild through the public reads). What one claim adds to them is in ``accounts``, node
search in ``search``, set placement in ``set_placement``, budget arithmetic in ``budgets``.

Nothing here does I/O or reads a clock: ``now`` is passed to every call whose answer depends
on time (rejected-node expiry).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from operator import itemgetter

from cozystack_gpu.keys import Phase, effective_max_count
from cozystack_gpu.model._index import ClassIndex, discard_member, remove_sorted
from cozystack_gpu.model.accounts import Account, account
from cozystack_gpu.model.budgets import Ledger, bump
from cozystack_gpu.model.eligibility import (
    LeftOut,
    left_out_by,
    left_out_words,
    selector_matches,
    takes_new,
    why_not_placeable,
)
from cozystack_gpu.model.held_back import HeldBack
from cozystack_gpu.model.reservations import Bookings, ReservationInfo
from cozystack_gpu.model.types import (
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    ClassStatus,
    NamespaceInfo,
    NodeInfo,
    OrderShape,
)


class Snapshot:
    """Nodes, classes, claims and namespaces, with the indexes decisions read.

    Build one with ``Snapshot.build(...)`` or empty with ``Snapshot()``, then feed every
    watch event to ``upsert_node``/``remove_node``, ``upsert_class``/``remove_class``,
    ``upsert_claim``/``remove_claim`` and ``upsert_namespace``/``remove_namespace``.
    Decisions (``set_placement``'s ``check_order``, ``place_set`` and ``place_for_start``;
    ``class_status``; ``plan``) never change it. The binder records its own writes with
    ``upsert_claim`` before their watch events return.
    """

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._cap: dict[str, dict[str, int]] = {}
        self._classes: dict[str, ClassInfo] = {}
        self._classes_by_res: dict[str, set[str]] = {}
        self._claims: dict[ClaimKey, ClaimInfo] = {}
        self._namespaces: dict[str, NamespaceInfo] = {}
        self._ledger = Ledger()
        self._idx: dict[str, ClassIndex] = {}
        # The same nodes by the units an order may take (free, less what booked windows
        # hold back there): order decisions read these, bookings the free units above.
        self._oidx: dict[str, ClassIndex] = {}
        self._served: dict[str, set[str]] = {}
        self._used: dict[str, dict[str, int]] = {}
        self._pinned: dict[str, dict[str, int]] = {}
        self._node_claims: dict[str, set[ClaimKey]] = {}
        self._class_claims: dict[str, set[ClaimKey]] = {}
        # Kept per event: the binder asks several times a second, over every class.
        self._class_holds: dict[str, int] = {}
        self._ns_claims: dict[str, set[ClaimKey]] = {}
        self._set_claims: dict[tuple[str, str], set[ClaimKey]] = {}
        self._pending: set[ClaimKey] = set()
        # The orders among them (not VMs' template claims), oldest first per shape as
        # (created, key), kept sorted as they come and go: a pass judges a shape's oldest
        # order and, once one is refused, none of the rest (sorting 10,000 waiting orders on
        # every pass was most of what the binder spent behind a backlog).
        self._orders: dict[OrderShape | None, list[tuple[float, ClaimKey]]] = {}
        # Their keys, built when a pass first asks and kept until the shape's queue changes:
        # a pass reports a refused shape's queue as one Wait, and behind a backlog that
        # shape is the same 10,000 orders pass after pass.
        self._order_keys: dict[OrderShape | None, tuple[ClaimKey, ...]] = {}
        # The waiting claims of a known age per class, oldest first: the oldest-waiting
        # gauge reads each head after every pass, where walking 10,000 waiting claims was
        # most of a pass behind a backlog (and held the orders that fit behind it).
        self._dated: dict[str, list[tuple[float, ClaimKey]]] = {}
        self._lost: set[ClaimKey] = set()
        self._acct: dict[ClaimKey, Account] = {}
        self._dirty: set[str] = set()
        self._unsettled: set[str] = set()
        # Nodes per rule that leaves them out, per class, for refusals; dropped on any node
        # or class change (a refusal's words are worth one walk over the nodes, not more).
        self._left_out: dict[str, dict[LeftOut | None, int]] = {}
        # Reservations (SPEC §11), and what orders must leave free for their windows.
        self.windows = HeldBack(self)

    @classmethod
    def build(
        cls,
        *,
        nodes: Iterable[NodeInfo] = (),
        classes: Iterable[ClassInfo] = (),
        claims: Iterable[ClaimInfo] = (),
        namespaces: Iterable[NamespaceInfo] = (),
        reservations: Iterable[ReservationInfo] = (),
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
        for reservation in reservations:
            snap.windows.upsert(reservation)
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

    def holds_of_class(self, class_name: str) -> int:
        """Claims of the class that hold units (Bound, Attached or Lost)."""
        return self._class_holds.get(class_name, 0)

    def claims_of_class(self, class_name: str) -> frozenset[ClaimKey]:
        """Claims that name the class, in any phase."""
        return frozenset(self._class_claims.get(class_name, ()))

    def set_members(self, set_key: tuple[str, str]) -> frozenset[ClaimKey]:
        return frozenset(self._set_claims.get(set_key, ()))

    def pending_keys(self) -> frozenset[ClaimKey]:
        return frozenset(self._pending)

    def orders_by_shape(
        self,
    ) -> list[tuple[OrderShape | None, list[tuple[float, ClaimKey]], tuple[ClaimKey, ...]]]:
        """The pending orders per shape (``ClaimInfo.shape``), each oldest first as
        (created, key), and the same queue's keys: copies, so the caller may change the
        snapshot while it walks them."""
        return [
            (shape, list(entries), self._keys_of(shape, entries))
            for shape, entries in self._orders.items()
        ]

    def _keys_of(
        self, shape: OrderShape | None, entries: list[tuple[float, ClaimKey]]
    ) -> tuple[ClaimKey, ...]:
        keys = self._order_keys.get(shape)
        if keys is None:
            keys = self._order_keys[shape] = tuple(map(itemgetter(1), entries))
        return keys

    def waiting_count(self) -> int:
        """How many claims wait (``ClaimInfo.waiting``)."""
        return len(self._pending)

    def oldest_waiting(self) -> dict[str, float]:
        """Per class, the creation time of its oldest waiting claim (``ClaimInfo.waiting``:
        orders and VMs' template claims; a Lost claim waiting to rebind has an alert of its
        own). A claim with no creation time known is left out rather than read as 1970."""
        return {class_name: entries[0][0] for class_name, entries in self._dated.items()}

    def lost_keys(self) -> frozenset[ClaimKey]:
        return frozenset(self._lost)

    def serves(self, node: str, class_name: str) -> bool:
        """The node takes new placements of the class now (Ready, uncordoned, a fresh
        inventory, selector, taints, layout)."""
        return class_name in self._served.get(node, ())

    def why_not_placeable(self, node: NodeInfo, klass: ClassInfo) -> str | None:
        """Why a node cannot take the class whatever its Ready and cordon state; None if it can."""
        names = self._classes_by_res.get(klass.resource_name, ())
        same = [self._classes[c] for c in names] if len(names) > 1 else ()
        return why_not_placeable(node, klass, same)

    def why_no_node_serves(self, class_name: str) -> str:
        """Which rule leaves each kind of node out for the class, in counts (no names:
        tenants read this)."""
        klass = self._classes[class_name]
        counts = self._left_out.get(class_name)
        if counts is None:
            names = self._classes_by_res.get(klass.resource_name, ())
            same = [self._classes[c] for c in names] if len(names) > 1 else ()
            counts = {}
            for node in self._nodes.values():
                rule = left_out_by(node, klass, same, self.capacity(node.name, klass.resource_name))
                counts[rule] = counts.get(rule, 0) + 1
            self._left_out[class_name] = counts
        return left_out_words(counts, klass)

    def capacity(self, node: str, resource: str) -> int:
        return self._cap.get(node, {}).get(resource, 0)

    def used(self, node: str, resource: str) -> int:
        """Units claims hold on the node, raw-name pods excluded: those of claims bound there
        and those a live migration's target holds there for its claims (SPEC §12)."""
        return self._used.get(node, {}).get(resource, 0)

    def pinned(self, node: str, resource: str) -> int:
        """Units held on the node by claims no packing move may take away: attached ones,
        those of a starting VM (attachment recorded), template claims, Lost ones whose VMI
        still runs there, those whose VM's volumes are bound to the node, and those of a
        migrating set, on its node and on its migration's target."""
        return self._pinned.get(node, {}).get(resource, 0)

    def free(self, node: str, resource: str) -> int:
        info = self._nodes.get(node)
        if info is None:
            return 0
        raw = info.raw_used.get(resource, 0)
        return max(0, self.capacity(node, resource) - self.used(node, resource) - raw)

    def held_back(self, node: str, resource: str) -> int:
        """Units of the node that orders must leave free for the windows booked there."""
        return self.windows.on_node(node, resource)

    def order_free(self, node: str, resource: str) -> int:
        """Units of the node an order may take: free, less those held back for windows."""
        return max(0, self.free(node, resource) - self.held_back(node, resource))

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
        """Units counted against one budget key of one tenant, over its whole subtree
        (see ``Ledger.used``)."""
        return self._ledger.used(tenant, key)

    def max_count(self, class_name: str) -> int:
        """maxCount resolved: the spec value, else 1 for vGPU and the largest node's units of
        the class for passthrough (0 while no node serves it)."""
        klass = self._classes[class_name]
        return effective_max_count(
            klass.mode.value, klass.max_count, self._idx[class_name].max_cap()
        )

    def class_status(self, class_name: str) -> ClassStatus:
        """``free`` and ``maxFreePerNode`` for GPUClass status, over serving nodes only:
        what orders may take, so units held back for booked windows are not counted."""
        idx = self._oidx.get(class_name)
        if idx is None:
            return ClassStatus(free=0, max_free_per_node=0)
        return ClassStatus(free=idx.total_free, max_free_per_node=idx.max_free())

    def serving_by_free(self, class_name: str) -> Iterator[tuple[str, int]]:
        """(node, units an order may take) of the nodes serving the class, most first, then
        by name. A change to the snapshot must be undone before the next node is read."""
        idx = self._oidx.get(class_name)
        return idx.by_free_desc() if idx is not None else iter(())

    def largest_capacity(self, class_name: str) -> int:
        """The most units of the class one serving node has, free or held (0 when none)."""
        idx = self._idx.get(class_name)
        return idx.max_cap() if idx is not None else 0

    def unsettled_nodes(self) -> frozenset[str]:
        """Nodes where a claim may have to change: an attached claim on a node gone or not
        Ready, or an unattached one on a node that no longer serves its class (cordon
        included) or holds more than its capacity. ``plan`` looks only at these."""
        self._flush()
        return frozenset(self._unsettled)

    # --- nodes -----------------------------------------------------------------------------

    def upsert_node(self, node: NodeInfo) -> None:
        name = node.name
        old = self._nodes.get(name)
        if old != node:  # an agent's refresh changes nothing read here
            self._left_out.clear()
        self._nodes[name] = node
        self._cap[name] = node.capacity()
        if old is None or old.labels != node.labels:
            self._reaccount_volumes(name)
        for class_name in self._classes:
            self._refresh_eligibility(name, class_name)
        self._dirty.add(name)

    def remove_node(self, name: str) -> None:
        if self._nodes.pop(name, None) is None:
            return
        self._left_out.clear()
        del self._cap[name]
        self._reaccount_volumes(name)
        for class_name in self._served.pop(name, set()):
            self._idx[class_name].remove(name)
            self._oidx[class_name].remove(name)
        self._dirty.add(name)

    # --- classes ---------------------------------------------------------------------------

    def upsert_class(self, klass: ClassInfo) -> None:
        self._left_out.clear()
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
        self._oidx.setdefault(klass.name, ClassIndex())
        self._recount(keys, affected)
        if old is None or old.resource_name != klass.resource_name:
            self.windows.recharge(class_name=klass.name)

    def remove_class(self, name: str) -> None:
        old = self._classes.get(name)
        if old is None:
            return
        self._left_out.clear()
        keys = self._class_claims.get(name, set())
        for key in keys:
            self._apply(self._acct[key], -1)
        del self._classes[name]
        same = self._classes_by_res[old.resource_name]
        same.discard(name)
        if not same:
            del self._classes_by_res[old.resource_name]
        idx = self._idx.pop(name)
        del self._oidx[name]
        for node in idx.free:
            self._served[node].discard(name)
        self._recount(keys, same)
        self.windows.recharge(class_name=name)

    def _recount(self, keys: set[ClaimKey], classes: set[str]) -> None:
        """After a class changed: its claims counted again, and where the classes sharing
        its resource name are served judged again on every node."""
        for key in keys:
            acct = self._make_acct(self._claims[key])
            self._acct[key] = acct
            self._apply(acct, 1)
        for class_name in sorted(classes):
            for node in self._nodes:
                self._refresh_eligibility(node, class_name)
        self._dirty.update(self._node_claims)

    # --- namespaces ------------------------------------------------------------------------

    def upsert_namespace(self, ns: NamespaceInfo) -> None:
        self._namespaces[ns.name] = ns
        if self._ledger.set_namespace(ns):
            self._reaccount(self._ns_claims.get(ns.name, set()))
            self.windows.recharge(namespace=ns.name)

    def remove_namespace(self, name: str) -> None:
        if self._namespaces.pop(name, None) is None:
            return
        if self._ledger.remove_namespace(name):
            self._reaccount(self._ns_claims.get(name, set()))
            self.windows.recharge(namespace=name)

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
        if claim.phase is not Phase.PENDING:
            self._class_holds[claim.class_name] = self._class_holds.get(claim.class_name, 0) + 1
        self._ns_claims.setdefault(claim.namespace, set()).add(key)
        self._set_claims.setdefault(claim.set_key, set()).add(key)
        if claim.node is not None:
            self._node_claims.setdefault(claim.node, set()).add(key)
            self._dirty.add(claim.node)
        if claim.phase is Phase.PENDING:
            self._pending.add(key)
            if claim.created > 0:
                bisect.insort(self._dated.setdefault(claim.class_name, []), (claim.created, key))
            if claim.ordered:
                bisect.insort(self._orders.setdefault(claim.shape, []), (claim.created, key))
                self._order_keys.pop(claim.shape, None)
        elif claim.phase is Phase.LOST:
            self._lost.add(key)
        if self.windows.bookings:
            self.windows.claim_changed(key)

    def remove_claim(self, key: ClaimKey) -> None:
        if key in self._claims:
            self._drop_claim(key)
            if self.windows.bookings:
                self.windows.claim_changed(key)

    def _drop_claim(self, key: ClaimKey) -> None:
        claim = self._claims.pop(key)
        self._apply(self._acct.pop(key), -1)
        discard_member(self._class_claims, claim.class_name, key)
        if claim.phase is not Phase.PENDING:
            left = self._class_holds[claim.class_name] - 1
            if left:
                self._class_holds[claim.class_name] = left
            else:
                del self._class_holds[claim.class_name]
        discard_member(self._ns_claims, claim.namespace, key)
        discard_member(self._set_claims, claim.set_key, key)
        if claim.node is not None:
            discard_member(self._node_claims, claim.node, key)
            self._dirty.add(claim.node)
        if key in self._pending:
            self._pending.discard(key)
            if claim.created > 0 and not remove_sorted(
                self._dated[claim.class_name], (claim.created, key)
            ):
                del self._dated[claim.class_name]
            if claim.ordered:
                shape = claim.shape
                self._order_keys.pop(shape, None)
                if not remove_sorted(self._orders[shape], (claim.created, key)):
                    del self._orders[shape]
        self._lost.discard(key)

    # --- reservations ----------------------------------------------------------------------

    @property
    def bookings(self) -> Bookings:
        return self.windows.bookings

    # --- bookkeeping -----------------------------------------------------------------------

    def _make_acct(self, claim: ClaimInfo) -> Account:
        return account(claim, self._classes, self._ledger, self._nodes)

    def _apply(self, acct: Account, sign: int) -> None:
        if acct.charge is not None:
            self._ledger.charge(acct.charge, sign)
        if acct.resource is None:
            return
        # A migration's target units are pinned: packing never moves them.
        for node, pinned in ((acct.node, acct.pinned), (acct.target, True)):
            if node is not None:
                bump(self._used, node, acct.resource, sign * acct.units)
                if pinned:
                    bump(self._pinned, node, acct.resource, sign * acct.units)
                self._refresh_free(node, acct.resource)
                self._dirty.add(node)

    def _reaccount(self, keys: Iterable[ClaimKey]) -> None:
        for key in list(keys):
            self._apply(self._acct[key], -1)
            acct = self._make_acct(self._claims[key])
            self._acct[key] = acct
            self._apply(acct, 1)

    def _reaccount_volumes(self, node: str) -> None:
        """Whether a claim's volumes can be used from its node depends on the node's labels
        (and on the node being there): account those claims again."""
        keys = [k for k in self._node_claims.get(node, ()) if self._claims[k].volumes]
        if keys:
            self._reaccount(keys)

    def _refresh_free(self, node: str, res: str) -> None:
        served = self._served.get(node)
        if not served:
            return
        for class_name in served:
            if self._classes[class_name].resource_name == res:
                self._put(class_name, node, res)

    def _put(self, class_name: str, node: str, res: str) -> None:
        free, cap = self.free(node, res), self.capacity(node, res)
        self._idx[class_name].put(node, free, cap)
        self._oidx[class_name].put(node, max(0, free - self.held_back(node, res)), cap)

    def _refresh_eligibility(self, node_name: str, class_name: str) -> None:
        node = self._nodes[node_name]
        klass = self._classes[class_name]
        served = self._served.get(node_name)
        # Cheapest tests first: a node event re-judges every class, and most classes fail
        # on the selector; the full rule (with its message) only runs for the rest.
        ok = (
            takes_new(node)
            and selector_matches(node, klass)
            and self.why_not_placeable(node, klass) is None
        )
        if ok:
            if served is None:
                served = self._served[node_name] = set()
            served.add(class_name)
            self._put(class_name, node_name, klass.resource_name)
        elif served is not None and class_name in served:
            served.discard(class_name)
            self._idx[class_name].remove(node_name)
            self._oidx[class_name].remove(node_name)

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
                if claim.class_name in served or claim.class_name not in self._classes:
                    continue
                if node is None or not self._keeps_holds(node, claim.class_name):
                    return False
        return not (has_unattached and self.over_capacity(name))

    def _keeps_holds(self, node: NodeInfo, class_name: str) -> bool:
        """A node that serves the class but for its stale inventory: its holds stay."""
        if not (node.inventory_stale and node.ready and not node.unschedulable):
            return False
        return self.why_not_placeable(node, self._classes[class_name]) is None
