"""What the cluster view counts of pods: the usage each pod holds, by node and namespace,
the pods of each VMI and which of them is its launcher, and the launcher pods the gate
controller looks after.

A pod's usage depends on more than the pod: on its VMI, its siblings and the claims that
cover it. The index keeps the pods and VMIs where the view has them and reads them through
the view, so it only counts; the view tells it what changed (a pod, a VMI's end, the claims
or classes of a VMI) and it marks the nodes and namespaces whose usage moved dirty in the
view.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from cozystack_gpu.objects import MutableObj, launcher, pod_usage, translate, vmi_pods
from cozystack_gpu.objects.translate import VMIState

Key = tuple[str, str]  # (namespace, name), as the view keys objects


class Marks(Protocol):
    """Where the index marks the nodes and namespaces whose usage it moved: the view's
    ``Dirty``, which the loop replaces each time it takes it, so it is asked for anew."""

    nodes: set[str]
    namespaces: set[str]


class PodIndex:
    """Pods' usage by node and namespace, pods by VMI, and the gated and pinned launchers."""

    def __init__(
        self,
        *,
        pod: Callable[[Key], MutableObj | None],
        vmi: Callable[[Key], VMIState | None],
        claims_of: Callable[[Key], Iterable[MutableObj]],
        resource_of: Callable[[str], str | None],
        dirty: Callable[[], Marks],
    ) -> None:
        self._pod = pod
        self._vmi = vmi
        # The claims attached to a VMI or owned by it as templates: what may cover the GPU
        # requests of its launcher pods.
        self._claims_of = claims_of
        self._resource_of = resource_of
        self._dirty = dirty
        self._pods: dict[Key, pod_usage.PodUsage] = {}
        self._pods_on_node: dict[str, set[Key]] = {}
        self._pods_in_ns: dict[str, set[Key]] = {}
        # Launcher pods the gate controller looks after: waiting at the gate, and pinned
        # but not yet bound by the scheduler (a refusal may come).
        self._gated: set[Key] = set()
        self._pinned: set[Key] = set()
        # Pods owned by each VMI: whether a labelled pod's units are its claims' depends on
        # its VMI, so a VMI's change judges its pods again.
        self._pods_of_vmi: dict[Key, set[Key]] = {}
        # VMIs (namespace, uid) seen to end (final, or deleted) while live, with the name of
        # the launcher pod they had then: that pod is finishing and holds nothing, whatever
        # VMI of the same name comes next; any other pod naming the uid is raw usage.
        self._ended_vmis: dict[tuple[str, str], str] = {}

    # --- taking in changes -------------------------------------------------------------

    def on_pod(self, key: Key, old: MutableObj | None, new: MutableObj | None) -> None:
        self._gated.discard(key)
        self._pinned.discard(key)
        owners: set[Key] = set()
        for obj in (old, new):
            owner = vmi_pods.owning_vmi(obj) if obj is not None else None
            if owner is not None:
                owners.add((key[0], owner))
                members = self._pods_of_vmi.setdefault((key[0], owner), set())
                (members.add if obj is new else members.discard)(key)
                if not members:
                    del self._pods_of_vmi[(key[0], owner)]
        if new is None and old is not None:
            uid = vmi_pods.owning_vmi_uid(old)
            owner = vmi_pods.owning_vmi(old)
            if uid and owner and not self._has_pod_of(key[0], owner, uid):
                self._ended_vmis.pop((key[0], uid), None)
        if new is not None and vmi_pods.owning_vmi(new) is not None:
            if vmi_pods.is_gated(new):
                self._gated.add(key)
            elif vmi_pods.pinned_node(new) is not None and not vmi_pods.scheduled(new):
                self._pinned.add(key)
        # Which pod of a VMI is its launcher depends on its siblings: a pod that comes,
        # goes or ends judges them all again.
        self._count_pod(key, new)
        for vmi in owners:
            self.recount_pods_of(vmi)

    def vmi_ended(self, vmi: Key, uid: str) -> None:
        """The live VMI ``vmi`` of ``uid`` ended (final, or deleted): the launcher pod it
        has now is finishing (its pods are judged again when the view recounts them)."""
        chosen = self.launcher_pod(vmi, uid)
        if chosen is not None and (vmi[0], uid) not in self._ended_vmis:
            self._ended_vmis[(vmi[0], uid)] = chosen[1]

    def recount_pods_of(self, vmi: Key) -> None:
        """Count the VMI's pods again: its state, claims or their classes changed."""
        for pod_key in list(self._pods_of_vmi.get(vmi, ())):
            pod = self._pod(pod_key)
            if pod is not None:
                self._count_pod(pod_key, pod)

    def recount_all(self) -> None:
        """Count every VMI's pods again: a class's resource name changed, and with it what
        the claims of that class cover."""
        for vmi in list(self._pods_of_vmi):
            self.recount_pods_of(vmi)

    # --- reading -----------------------------------------------------------------------

    def launcher_pod(self, vmi: Key, uid: str) -> Key | None:
        """The one launcher pod of the VMI ``vmi`` with ``uid`` (``launcher.launcher_of``
        over the pods naming it), or None."""
        pods = [p for k in self._pods_of_vmi.get(vmi, ()) if (p := self._pod(k)) is not None]
        chosen = launcher.launcher_of(pods, uid)
        return None if chosen is None else (vmi[0], translate.name_of(chosen))

    def migration_target(self, vmi: Key, uid: str, migration: str) -> Key | None:
        """The one target pod of migration ``migration`` of the VMI ``vmi`` with ``uid``
        (``launcher.migration_target_of``), gated or not, or None."""
        pods = [p for k in self._pods_of_vmi.get(vmi, ()) if (p := self._pod(k)) is not None]
        chosen = launcher.migration_target_of(pods, uid, migration)
        return None if chosen is None else (vmi[0], translate.name_of(chosen))

    def gated_pods(self) -> list[Key]:
        return sorted(self._gated)

    def pinned_pods(self) -> list[Key]:
        return sorted(self._pinned)

    def usage_on_node(self, name: str) -> list[pod_usage.PodUsage]:
        return [self._pods[k] for k in self._pods_on_node.get(name, ())]

    def usage_in_namespace(self, name: str) -> list[pod_usage.PodUsage]:
        return [self._pods[k] for k in self._pods_in_ns.get(name, ())]

    def nodes(self) -> set[str]:
        """The nodes some pod's usage was counted on (and may still be)."""
        return set(self._pods_on_node)

    def namespaces(self) -> set[str]:
        """The namespaces some pod's usage was counted in (and may still be)."""
        return set(self._pods_in_ns)

    # --- counting ----------------------------------------------------------------------

    def _count_pod(self, key: Key, new: MutableObj | None) -> None:
        """Take back what the pod counted, and count it again by ``launcher.pod_role``: the
        one launcher pod of a live VMI with claims uses what its claims do not cover, on its
        node; its VMI's launcher at the VMI's end holds nothing; every other pod is raw
        usage on its node and in its namespace, whatever its labels."""
        previous = self._pods.pop(key, None)
        if previous is not None:
            if previous.node:
                self._pods_on_node.get(previous.node, set()).discard(key)
                self._dirty().nodes.add(previous.node)
            self._pods_in_ns.get(previous.namespace, set()).discard(key)
            self._dirty().namespaces.add(previous.namespace)
        if new is None:
            return
        owner = vmi_pods.owning_vmi(new)
        vmi: VMIState | None = None
        siblings: list[MutableObj] = []
        if owner is not None:
            vmi = self._vmi((key[0], owner))
            siblings = [
                p for k in self._pods_of_vmi.get((key[0], owner), ()) if (p := self._pod(k))
            ]
        ended = self._ended_vmis.get((key[0], vmi_pods.owning_vmi_uid(new)))
        role = launcher.pod_role(new, vmi, siblings, ended)
        if role is launcher.PodRole.FINISHING:
            return  # its VM has stopped: the pod is finishing
        usage: pod_usage.PodUsage | None
        if role is launcher.PodRole.COVERED:
            assert owner is not None
            usage = launcher.launcher_usage(new, self._claims_cover(key[0], owner, new))
        else:
            usage = launcher.raw_usage(new)
        if usage is None:
            return
        self._pods[key] = usage
        if usage.node:
            self._pods_on_node.setdefault(usage.node, set()).add(key)
            self._dirty().nodes.add(usage.node)
        # What a launcher pod uses beyond its claims occupies the node; the tenant's budget
        # is its claims' (and their Lost state), not charged twice.
        if role is launcher.PodRole.RAW:
            self._pods_in_ns.setdefault(usage.namespace, set()).add(key)
            self._dirty().namespaces.add(usage.namespace)

    def _has_pod_of(self, namespace: str, vmi_name: str, uid: str) -> bool:
        return any(
            (pod := self._pod(pod_key)) is not None and vmi_pods.owning_vmi_uid(pod) == uid
            for pod_key in self._pods_of_vmi.get((namespace, vmi_name), ())
        )

    def _claims_cover(self, namespace: str, vmi_name: str, pod: MutableObj) -> dict[str, int]:
        """Units the VMI's claims hold on the pod's node, by resource name."""
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return {}
        claims = [
            obj
            for obj in self._claims_of((namespace, vmi_name))
            if pod_usage.claim_serves_vmi(obj, vmi_name)
        ]
        migration = launcher.migration_of(pod)
        return pod_usage.claims_cover(claims, self._resource_of, str(node), migration)
