"""The cluster as the binder's watches deliver it, and the model inputs built from it.

The view keeps every watched object as the API has it (or as the binder's own writes
returned it), the indexes derived from them (VMIs and the claims they name, attachments,
pods in its ``PodIndex``, volumes in its ``VolumeIndex``, migrations, reservations), and
the names of what changed since the binder last read it into its model. It decides and
writes nothing: the loop asks it for the model inputs of what is dirty (``node_info``...).

Events older than what the view already holds of an object are dropped (etcd revisions are
integers and grow), so the echo of an old watch event never undoes the binder's own write.
Deletions leave a tombstone with the revision they happened at, so the answer to a write
sent before the deletion (a finalizer removed, a status written) cannot bring the object
back after its DELETED event.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Mapping

from cozystack_gpu import keys
from cozystack_gpu.cluster.claim_links import ClaimLinks
from cozystack_gpu.cluster.counted_union import CountedUnion
from cozystack_gpu.cluster.dirty import Dirty
from cozystack_gpu.cluster.dra_index import DraIndex
from cozystack_gpu.cluster.migration_index import MigrationIndex
from cozystack_gpu.cluster.pod_index import PodIndex
from cozystack_gpu.cluster.reservation_index import ReservationIndex
from cozystack_gpu.cluster.sync import sync_kind
from cozystack_gpu.cluster.volume_index import VolumeIndex
from cozystack_gpu.config import Config
from cozystack_gpu.model import (
    ClaimInfo,
    ClaimKey,
    ClassInfo,
    NamespaceInfo,
    NodeInfo,
    Snapshot,
)
from cozystack_gpu.objects import MutableObj, attachment, pod_usage, translate
from cozystack_gpu.objects.translate import VMIState, object_key

Key = tuple[str, str]  # (namespace, name); cluster-scoped objects use ("", name)
Keys = Collection[ClaimKey]
MAX_TOMBSTONES = 20_000  # per kind; the oldest half goes when a kind has more
Handler = Callable[[Key, MutableObj | None, MutableObj | None], None]


class ClusterView:
    """Raw objects by kind, their indexes, and the model inputs derived from both."""

    def __init__(self, config: Config, kinds: Iterable[keys.ApiKind]) -> None:
        self.config = config
        self.kinds = tuple(k.kind for k in kinds)
        self.raw: dict[str, dict[Key, MutableObj]] = {kind: {} for kind in self.kinds}
        self._tombstones: dict[str, dict[Key, int]] = {kind: {} for kind in self.kinds}
        self.listed: set[str] = set()
        self.dirty = Dirty()
        self._quotas_in_ns: dict[str, set[Key]] = {}
        self._vmis: dict[Key, VMIState] = {}
        # The uids of the VMIs this view holds, by namespace: a template claim is left over
        # once the VMI of the uid it was made for is gone, whatever VMI now has that name.
        self._vmi_uids: set[tuple[str, str]] = set()
        self._claim_vmi: dict[ClaimKey, str] = {}
        # Live VMIs that name claims they hold: the binder attaches those claims.
        self._holding: set[Key] = set()
        self._claim_vm: dict[ClaimKey, str] = {}
        self._links = ClaimLinks()  # claims by the VMI they are attached to or owned by
        # When this binder first saw each claim's current attachment: its grace counts from
        # then too, whatever clock the webhook replica that wrote attachedAt has.
        self._attachment_seen: dict[ClaimKey, tuple[tuple[str, str, str], float]] = {}
        # Where VMs' disks are, so a binding or a PV change re-reads the claims of those VMs.
        self._volumes = VolumeIndex(self.pv)
        # What pods use, by node and namespace, and which pod is each VMI's launcher: the
        # pods and VMIs stay here, the index counts them.
        self._pod_index = PodIndex(
            pod=self.pod,
            vmi=self.vmi,
            claims_of=self._claims_of_vmi,
            resource_of=self._class_resource,
            dirty=lambda: self.dirty,
        )
        # GPU resource names and where each comes from (a class, a GPUNode report, a GPU
        # node's allocatable, the hoster's list), counted so one event updates them.
        self._names = CountedUnion()
        self._gpu_names: frozenset[str] = frozenset()
        self._set_names(("extra", ""), frozenset(config.extra_resource_names))
        # Names node agents found to be other devices' (GPUNode otherResourceNames),
        # counted: a node without an agent leaves them out of its allocatable's GPU names.
        self._others = CountedUnion()
        # Counts changes of the node set or of any node's labels (not status): what is
        # computed from labels alone (where a volume can be used) is kept until it moves.
        self.node_labels_version = 0
        # When each node agent last reported, and which nodes' reports are too old.
        self._reported_at: dict[str, float | None] = {}
        self._stale: set[str] = set()
        self.reservations = ReservationIndex(
            lambda: self.raw.get(keys.GPU_RESERVATION.kind, {}), lambda: self.dirty
        )
        self.migrations = MigrationIndex(lambda: self.raw.get(keys.VMIM.kind, {}))
        self.dra = DraIndex(lambda kind: self.raw.get(kind, {}), lambda: self.dirty, self._labels)
        # Which index each kind feeds; kinds without an entry are only stored.
        self._handlers: dict[str, Handler] = {
            keys.NODE.kind: self._on_node,
            keys.GPU_NODE.kind: self._on_gpunode,
            keys.GPU_CLASS.kind: self._on_class,
            keys.GPU_CLAIM.kind: self._on_claim,
            keys.GPU_RESERVATION.kind: self.reservations.on_event,
            keys.NAMESPACE.kind: self._on_namespace,
            keys.RESOURCE_QUOTA.kind: self._on_quota,
            keys.POD.kind: self._pod_index.on_pod,
            keys.VMI.kind: self._on_vmi,
            keys.VM.kind: self._on_vm,
            keys.VMIM.kind: self.migrations.on_event,
            keys.RESOURCE_SLICE.kind: self.dra.on_slice,
            keys.DEVICE_CLASS.kind: self.dra.on_device_class,
            keys.RESOURCE_CLAIM.kind: self.dra.on_resource_claim,
            keys.PVC.kind: self._on_pvc,
            keys.PV.kind: self._on_pv,
        }

    # --- taking in events ------------------------------------------------------------

    @property
    def fully_listed(self) -> bool:
        """Every kind has been listed once: before that, a claim may be seen without its
        node and read as Lost."""
        return self.listed >= set(self.kinds)

    def relist(self, kind: str, objects: Iterable[MutableObj], version: int | None = None) -> None:
        """A complete listing of one kind, made at ``version`` (its resourceVersion): an
        object newer than the view's copy replaces it, and one the view holds that the
        listing lacks was deleted, unless the view's copy is newer than the listing (an
        answer to a write, or another listing, brought it since: the binder lists the claims
        afresh at a takeover beside its informer's listing). Without ``version`` the listing
        is taken as the newest word on the kind."""
        self.listed.add(kind)
        fresh = {object_key(o): o for o in objects}
        for key, old in list(self.raw[kind].items()):
            if key in fresh:
                continue
            if version is not None and translate.resource_version(old) > version:
                continue  # came after the listing was made
            self.apply(kind, old, deleted=True)
            if version is not None:
                self._bury(kind, key, version)
        for obj in fresh.values():
            self.apply(kind, obj, deleted=False)

    def apply(self, kind: str, obj: MutableObj, *, deleted: bool) -> None:
        key = object_key(obj)
        store = self.raw[kind]
        old = store.get(key)
        version = translate.resource_version(obj)
        if not deleted:
            if old is not None and version < translate.resource_version(old):
                return  # an event older than what we already know (e.g. our own write)
            if old is None and version <= self._tombstones[kind].get(key, -1):
                return  # the answer to a write sent before the object was deleted
        if deleted:
            store.pop(key, None)
            self._bury(kind, key, version)
        else:
            self._tombstones[kind].pop(key, None)
            store[key] = obj
        handler = self._handlers.get(kind)
        if handler is not None:
            handler(key, old, None if deleted else obj)

    def _bury(self, kind: str, key: Key, version: int) -> None:
        graves = self._tombstones[kind]
        graves[key] = max(version, graves.get(key, -1))
        if len(graves) > MAX_TOMBSTONES:
            for old in list(graves)[: MAX_TOMBSTONES // 2]:
                del graves[old]

    def forget(self, kind: str, key: Key) -> None:
        """The API says the object is gone (a write answered 404, a delete was done)."""
        self.apply(kind, {"metadata": {"namespace": key[0], "name": key[1]}}, deleted=True)

    def sizes(self) -> str:
        """How many nodes, classes and claims it holds, for the logs."""
        return ", ".join(
            f"{len(self.raw[kind.kind])} {kind.plural}"
            for kind in (keys.NODE, keys.GPU_CLASS, keys.GPU_CLAIM)
        )

    def take_dirty(self) -> Dirty:
        dirty, self.dirty = self.dirty, Dirty()
        return dirty

    def mark_all_dirty(self) -> None:
        """Every model input is built again (after the first listing)."""
        self.dirty = Dirty(
            nodes=self.node_names(),
            classes={name for _ns, name in self.raw[keys.GPU_CLASS.kind]},
            claims={ClaimKey(*k) for k in self.raw[keys.GPU_CLAIM.kind]},
            namespaces={name for _ns, name in self.raw[keys.NAMESPACE.kind]},
            reservations={ClaimKey(*k) for k in self.raw.get(keys.GPU_RESERVATION.kind, {})},
        )

    # --- index upkeep, one handler per kind -----------------------------------------

    def _on_node(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self.dirty.nodes.add(key[1])
        if (
            old is None
            or new is None
            or translate.meta(old).get("labels") != translate.meta(new).get("labels")
        ):
            self.node_labels_version += 1
            self.dra.on_node_labels(key[1])
        self._node_names(key[1])

    def _on_gpunode(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        name = key[1]
        self.dirty.nodes.add(name)
        status = (new or {}).get("status") or {}
        self._set_names((keys.GPU_NODE.kind, name), frozenset(status.get("resourceNames") or []))
        if new is None:
            self._reported_at.pop(name, None)
            self._stale.discard(name)
        else:
            self._reported_at[name] = translate.inventory_reported_at(new)
        self._node_names(name)
        if self._set_other_names(name, frozenset(status.get("otherResourceNames") or [])):
            for _ns, node in self.raw[keys.NODE.kind]:
                if self.gpunode(node) is None:
                    self._node_names(node)

    def _on_class(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self.dirty.classes.add(key[1])
        self.dra.on_class(key[1], new)
        resource = translate.class_resource_name(new) if new is not None else ""
        self._set_names((keys.GPU_CLASS.kind, key[1]), frozenset({resource} - {""}))
        before = translate.class_resource_name(old) if old is not None else ""
        if resource != before:
            # What the claims of the class cover on their launcher pods' nodes changed.
            self._pod_index.recount_all()

    def _on_claim(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        claim_key = ClaimKey(*key)
        served = self._links.on_claim(claim_key, old, new)
        self.dra.on_claim(key, new)
        if new is None or not (new.get("status") or {}).get("attachedTo"):
            self._attachment_seen.pop(claim_key, None)
        self.dirty.claims.add(claim_key)
        # A claim deleted, moved or detached leaves its VMI's launcher pod using units that
        # no claim covers any more (and one bound covers them again).
        for vmi in served:
            self._pod_index.recount_pods_of(vmi)

    def _claims_of_vmi(self, vmi: Key) -> list[MutableObj]:
        """The claims attached to the VMI or owned by it as templates."""
        members = self._links.members(vmi)
        return [obj for claim_key in members if (obj := self.claim(claim_key)) is not None]

    def _class_resource(self, class_name: str) -> str | None:
        obj = self.gpu_class(class_name)
        return translate.class_resource_name(obj) if obj is not None else None

    def _on_namespace(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self.dirty.namespaces.add(key[1])

    def _on_quota(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        members = self._quotas_in_ns.setdefault(key[0], set())
        (members.add if new is not None else members.discard)(key)
        self.dirty.namespaces.add(key[0])

    def _on_vmi(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        namespace = key[0]
        before = self._vmis.pop(key, None)
        touched: set[ClaimKey] = self._links.attached_to(key)
        # A live VMI that ends (final, or deleted) leaves its launcher pod finishing; a VMI
        # first seen ended names none, and its pods count as raw usage until they go.
        ending = new if new is not None and translate.vmi_state(new).final else None
        if new is None:
            ending = old
        uid = str(translate.meta(ending).get("uid") or "") if ending is not None else ""
        if uid and before is not None and not before.final and before.uid == uid:
            self._pod_index.vmi_ended(key, uid)
        if before is not None:
            self._vmi_uids.discard((namespace, before.uid))
            for claim in before.held_claims:
                claim_key = ClaimKey(namespace, claim)
                if self._claim_vmi.get(claim_key) == key[1]:
                    del self._claim_vmi[claim_key]
                touched.add(claim_key)
        self._holding.discard(key)
        if new is not None:
            state = translate.vmi_state(new)
            self._vmis[key] = state
            if state.held_claims and not state.final:
                self._holding.add(key)
            self._vmi_uids.add((namespace, state.uid))
            for claim in state.held_claims:
                claim_key = ClaimKey(namespace, claim)
                self._claim_vmi[claim_key] = key[1]
                touched.add(claim_key)
        # Template claims are owned by their VMI: their set id does not change, but their
        # liveness (and so their protection) does.
        for obj in (old, new):
            if obj is not None:
                touched |= {ClaimKey(namespace, n) for n in translate.template_claim_names(obj)}
        self.dirty.claims |= touched
        self._pod_index.recount_pods_of(key)

    def _on_vm(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        namespace = key[0]
        touched: set[ClaimKey] = set()
        for obj in (old, new):
            if obj is None:
                continue
            for claim in translate.vm_held_claims(obj):
                touched.add(ClaimKey(namespace, claim))
        for claim_key in touched:
            if self._claim_vm.get(claim_key) == key[1]:
                del self._claim_vm[claim_key]
        if new is not None:
            for claim in translate.vm_held_claims(new):
                self._claim_vm[ClaimKey(namespace, claim)] = key[1]
        self._volumes.on_vm(key, new)
        self.dirty.claims |= touched

    def _on_pvc(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self._volumes_changed(self._volumes.on_pvc(key, new))

    def _on_pv(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self._volumes_changed(self._volumes.on_pv(key, old, new))

    def _volumes_changed(self, vms: Iterable[Key]) -> None:
        """The held claims of these VMs (their volumes moved) are read into the model again."""
        for vm_key in vms:
            vm = self.raw[keys.VM.kind].get(vm_key)
            if vm is not None:
                self.dirty.claims |= {ClaimKey(vm_key[0], c) for c in translate.vm_held_claims(vm)}

    def _node_names(self, name: str) -> None:
        """A node contributes the names it advertises under nvidia.com/ (one that lists
        such a name is a GPU node, even without the layout label and so without an agent),
        so raw requests of a GPU name no agent has seen are still caught under
        ``forbidden``. Names found to be other devices' (a NIC VF, an audio function, an
        NVSwitch) are left out so a NIC VF may go next to a GPU claim (seed 004): by the
        node's own agent (its GPUNode's ``otherResourceNames``), or, on a node without one,
        by any agent."""
        node = self.node(name)
        gpunode = self.gpunode(name)
        names: frozenset[str] = frozenset()
        if node is not None:
            if gpunode is not None:
                other = (gpunode.get("status") or {}).get("otherResourceNames") or []
            else:
                other = list(self._others)
            names = translate.advertised_gpu_names(node, other)
        self._set_names((keys.NODE.kind, name), names)

    def _set_other_names(self, gpunode: str, names: frozenset[str]) -> bool:
        """Record one GPUNode's other-device names; True when the union changed."""
        return self._others.set(gpunode, names)

    def _set_names(self, source: tuple[str, str], names: frozenset[str]) -> None:
        if self._names.set(source, names):
            self._gpu_names = self._names.members()
            # Raw-name usage is counted over GPU names only: re-read every user of it.
            self.dirty.nodes |= self._pod_index.nodes()
            self.dirty.namespaces |= self._pod_index.namespaces()

    def refresh_staleness(self, now: float) -> None:
        """Nodes whose agent report turned stale (or fresh again) since the last look must
        be read into the model again: staleness changes with time, not with events."""
        stale_after = self.config.inventory_stale_after
        for name, reported in self._reported_at.items():
            stale = translate.inventory_stale(reported, now, stale_after)
            if stale != (name in self._stale):
                (self._stale.add if stale else self._stale.discard)(name)
                self.dirty.nodes.add(name)

    # --- reading -----------------------------------------------------------------------

    def node(self, name: str) -> MutableObj | None:
        return self.raw[keys.NODE.kind].get(("", name))

    def _labels(self, name: str) -> Mapping[str, str] | None:
        node = self.node(name)
        return None if node is None else dict(translate.meta(node).get("labels") or {})

    def gpunode(self, name: str) -> MutableObj | None:
        return self.raw[keys.GPU_NODE.kind].get(("", name))

    def gpu_class(self, name: str) -> MutableObj | None:
        return self.raw[keys.GPU_CLASS.kind].get(("", name))

    def claim(self, key: ClaimKey) -> MutableObj | None:
        return self.raw[keys.GPU_CLAIM.kind].get(key)

    def claims(self) -> Iterator[tuple[ClaimKey, MutableObj]]:
        for key, obj in self.raw[keys.GPU_CLAIM.kind].items():
            yield ClaimKey(*key), obj

    def classes(self) -> Iterable[MutableObj]:
        return self.raw[keys.GPU_CLASS.kind].values()

    def gpunodes(self) -> Iterable[MutableObj]:
        return self.raw[keys.GPU_NODE.kind].values()

    def nodes(self) -> Iterable[MutableObj]:
        return self.raw[keys.NODE.kind].values()

    def node_names(self) -> set[str]:
        return {name for _cluster_scope, name in self.raw[keys.NODE.kind]}

    def usage_records(self) -> Mapping[Key, MutableObj]:
        """The Workloads (usage records) by (namespace, name); none when not watched."""
        return self.raw.get(keys.WORKLOAD.kind, {})

    @property
    def gpu_names(self) -> frozenset[str]:
        """The effective GPU resource-name set: class names, what node agents report, what
        nodes advertise under nvidia.com/ (with an agent or without), and the hoster's
        extra names."""
        return self._gpu_names

    def inventory_stale(self, name: str) -> bool:
        return name in self._stale

    def pod(self, key: Key) -> MutableObj | None:
        return self.raw[keys.POD.kind].get(key)

    def vmi_object(self, key: Key) -> MutableObj | None:
        return self.raw[keys.VMI.kind].get(key)

    def pvc(self, namespace: str, name: str) -> MutableObj | None:
        return self.raw.get(keys.PVC.kind, {}).get((namespace, name))

    def pv(self, name: str) -> MutableObj | None:
        return self.raw.get(keys.PV.kind, {}).get(("", name))

    def storage_class(self, name: str) -> MutableObj | None:
        return self.raw.get(keys.STORAGE_CLASS.kind, {}).get(("", name))

    def launcher_pod(self, vmi: Key, uid: str) -> Key | None:
        return self._pod_index.launcher_pod(vmi, uid)  # (``launcher.launcher_of``)

    def migration_target(self, vmi: Key, uid: str, migration: str) -> Key | None:
        return self._pod_index.migration_target(vmi, uid, migration)

    def gated_pods(self) -> list[Key]:
        return self._pod_index.gated_pods()

    def pinned_pods(self) -> list[Key]:
        return self._pod_index.pinned_pods()

    def vmi(self, key: Key) -> VMIState | None:
        return self._vmis.get(key)

    def attachment_seen_at(self, key: ClaimKey, now: float) -> float | None:
        """When this binder first saw the claim's current attachment (``now`` if this is
        the first look), or None when it has none."""
        obj = self.claim(key)
        attached = attachment.attachment_of(obj) if obj is not None else None
        if attached is None:
            return None
        seen = self._attachment_seen.get(key)
        if seen is None or seen[0] != attached.token:
            seen = (attached.token, now)
            self._attachment_seen[key] = seen
        return seen[1]

    def attached_vmi(self, key: ClaimKey) -> VMIState | None:
        """The VMI of the name a claim's attachment names, as this view has it."""
        obj = self.claim(key)
        target = ((obj or {}).get("status") or {}).get("attachedTo")
        return self._vmis.get((key.namespace, str(target))) if target else None

    def vmi_uid_exists(self, namespace: str, uid: str) -> bool:
        """A VMI of this uid is in the namespace (final or not)."""
        return (namespace, uid) in self._vmi_uids

    def template_owner_live(self, key: ClaimKey) -> bool:
        """A template claim whose own VMI (its controlling owner, by uid) exists and is not
        final: it holds that VMI's GPUs from its creation on, attached or not yet."""
        obj = self.claim(key)
        if obj is None or not translate.is_template_claim(obj):
            return False
        owner = translate.controlling_vmi(obj)
        if owner is None:
            return False
        vmi = self._vmis.get((key.namespace, owner[0]))
        return vmi is not None and vmi.uid == owner[1] and not vmi.final

    def holding_vmis(self) -> list[VMIState]:
        """Live VMIs that name claims to hold (the claims annotation's ``claims``)."""
        return [vmi for key in self._holding if (vmi := self._vmis.get(key)) is not None]

    def attachments(self) -> list[tuple[Key, frozenset[ClaimKey]]]:
        """Claims by the VMI their status names as attachedTo (namespace, VMI name)."""
        return self._links.attachments()

    # --- model inputs ----------------------------------------------------------------

    def node_info(self, name: str) -> NodeInfo | None:
        node = self.node(name)
        if node is None:
            return None
        usage = self._pod_index.usage_on_node(name)
        dra_node = self.dra.node(name)
        return translate.node_info(
            node,
            self.gpunode(name),
            pod_usage.sum_usage(usage, self._gpu_names),
            stale=name in self._stale,
            dra_units=dra_node.units if dra_node else None,
            dra_shared=dra_node.shared if dra_node else frozenset(),
        )

    def namespace_info(self, name: str) -> NamespaceInfo | None:
        namespace = self.raw[keys.NAMESPACE.kind].get(("", name))
        if namespace is None:
            return None
        quotas = [self.raw[keys.RESOURCE_QUOTA.kind][k] for k in self._quotas_in_ns.get(name, ())]
        usage = self._pod_index.usage_in_namespace(name)
        return translate.namespace_info(
            namespace, quotas, pod_usage.sum_usage(usage, self._gpu_names)
        )

    def class_info(self, name: str) -> ClassInfo | None:
        obj = self.gpu_class(name)
        return None if obj is None else translate.class_info(obj)

    def claim_info(self, key: ClaimKey, now: float) -> ClaimInfo | None:
        obj = self.claim(key)
        if obj is None:
            return None
        vmi = self.attached_vmi(key)
        seen = self.attachment_seen_at(key, now)
        vm = self._claim_vm.get(key)
        return translate.claim_info(
            obj,
            vmi_live_now=attachment.vmi_live(obj, vmi, now, self.config.attachment_grace, seen),
            set_id=translate.set_id_for(obj, self._claim_vmi.get(key), vm),
            volumes=self._volumes.vm_volumes((key.namespace, vm)) if vm is not None else (),
        )

    # --- the model -------------------------------------------------------------------

    def build_snapshot(self, now: float) -> Snapshot:
        """A snapshot of everything held, once every kind has been listed."""
        self.mark_all_dirty()
        dirty = self.take_dirty()
        return Snapshot.build(
            nodes=[node for name in dirty.nodes if (node := self.node_info(name))],
            classes=[cls for name in dirty.classes if (cls := self.class_info(name))],
            claims=[claim for key in dirty.claims if (claim := self.claim_info(key, now))],
            namespaces=[ns for name in dirty.namespaces if (ns := self.namespace_info(name))],
            reservations=[
                r for key in dirty.reservations if (r := self.reservations.info(key, now))
            ],
        )

    def sync_into(
        self, snap: Snapshot, now: float, *, held: Keys = (), booking: Keys = ()
    ) -> tuple[bool, Dirty]:
        """Bring ``snap`` up to date with what changed since the last call; claims in ``held``
        and reservations in ``booking`` (their writes out) keep their model state, dirty for
        the next call. Returns whether the model saw a change, and what was dirty."""
        self.reservations.ended(now)
        dirty = self.take_dirty()
        changed = sync_kind(
            dirty.classes, self.class_info, snap.gpu_class, snap.upsert_class, snap.remove_class
        )
        changed |= sync_kind(
            dirty.namespaces,
            self.namespace_info,
            snap.namespace,
            snap.upsert_namespace,
            snap.remove_namespace,
        )
        changed |= sync_kind(
            dirty.nodes, self.node_info, snap.node, snap.upsert_node, snap.remove_node
        )
        self.dirty.claims |= dirty.claims & set(held)
        changed |= sync_kind(
            (key for key in dirty.claims if key not in held),
            lambda key: self.claim_info(key, now),
            snap.claim,
            snap.upsert_claim,
            snap.remove_claim,
        )
        self.dirty.reservations |= dirty.reservations & set(booking)
        changed |= sync_kind(
            (key for key in dirty.reservations if key not in booking),
            lambda key: self.reservations.info(key, now),
            snap.windows.get,
            snap.windows.upsert,
            snap.windows.remove,
        )
        return changed, dirty
