"""Which pod the claims of a VMI cover, and what a pod asks for, container by container.

SPEC §7: a pod is covered by claims only as the one launcher pod of a live VMI; every
other pod requesting a GPU name is raw usage on its node and in its namespace, whatever
its labels. Labels and owner references are the tenant's to write (with pod create rights),
so neither alone says a pod is a launcher: only a VMI that exists, is not final, has that
uid and uses claims, and only one pod of it. The cluster view counts with ``pod_role``; the
gate pins only the pod ``launcher_of`` picks, and only when ``request_mismatch`` finds its
GPU requests equal to what its claims cover (SPEC §6: KubeVirt adds a request per network
whose NetworkAttachmentDefinition names a resource).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from cozystack_gpu import keys
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.pod_usage import PodUsage
from cozystack_gpu.objects.translate import (
    FINAL_POD_PHASES,
    VMIState,
    meta,
    name_of,
    namespace_of,
    whole_quantity,
)
from cozystack_gpu.objects.vmi_pods import is_gated, owning_vmi_uid

# A VirtualMachineInstanceMigration in one of these phases is over (KubeVirt's own words).
MIGRATION_FINAL_PHASES = ("Succeeded", "Failed")

# --- what a pod asks for ------------------------------------------------------------------


@dataclass(frozen=True)
class ContainerRequest:
    """The extended resources (names with a "/") one container of a pod asks for:
    ``where`` says which ("container compute", "init container setup")."""

    where: str
    requests: Mapping[str, int]


def container_requests(pod: Obj) -> tuple[ContainerRequest, ...]:
    """Every container's extended-resource requests, init containers (sidecars are init
    containers that keep running) included: kubelet's device manager allocates devices to
    each of them, so each may hold a GPU. Extended resources must have requests == limits;
    either may be written alone, and the larger one is taken."""
    spec = pod.get("spec") or {}
    found: list[ContainerRequest] = []
    for member, label in (("initContainers", "init container"), ("containers", "container")):
        for container in spec.get(member) or []:
            resources = container.get("resources") or {}
            units: dict[str, int] = {}
            for part in ("requests", "limits"):
                for name, value in (resources.get(part) or {}).items():
                    whole = whole_quantity(value)
                    if "/" in name and whole:
                        units[name] = max(units.get(name, 0), whole)
            if units:
                found.append(ContainerRequest(f"{label} {container.get('name', '')}", units))
    return tuple(found)


def extended_requests(pod: Obj) -> dict[str, int]:
    """Units of every extended resource the pod's containers ask for, summed over all of
    them (an init container's devices may be reused later, so this is at most an
    over-count, never an under-count)."""
    totals: dict[str, int] = {}
    for container in container_requests(pod):
        for name, units in container.requests.items():
            totals[name] = totals.get(name, 0) + units
    return totals


def request_mismatch(pod: Obj, gpu_names: frozenset[str], cover: Mapping[str, int]) -> str | None:
    """Why the GPU names a launcher pod requests do not add up to exactly what its claims
    cover (``cover``: units by resource name), naming each surplus or shortfall and the
    containers it comes from; None when they do. A surplus is a GPU outside every budget
    and record (KubeVirt adds one request per network whose NetworkAttachmentDefinition
    carries ``k8s.v1.cni.cncf.io/resourceName``)."""
    by_name: dict[str, list[str]] = {}
    asked: dict[str, int] = {}
    for container in container_requests(pod):
        for name, units in container.requests.items():
            if name in gpu_names or name in cover:
                asked[name] = asked.get(name, 0) + units
                by_name.setdefault(name, []).append(f"{container.where}: {units}")
    problems: list[str] = []
    for name in sorted(set(asked) | set(cover)):
        wanted, covered = asked.get(name, 0), cover.get(name, 0)
        if wanted == covered:
            continue
        where = ", ".join(by_name.get(name, [])) or "no container"
        if wanted > covered:
            problems.append(
                f"{wanted - covered} unit(s) of {name} beyond its claims, which cover "
                f"{covered} ({where})"
            )
        else:
            problems.append(
                f"{covered - wanted} unit(s) of {name} fewer than its claims cover ({covered}; "
                f"the pod asks {where})"
            )
    if not problems:
        return None
    return (
        f"launcher pod {name_of(pod)} requests GPU resource names that do not add up to its "
        f"claims: {'; '.join(problems)}. KubeVirt adds a request for every network whose "
        f"NetworkAttachmentDefinition carries the annotation {keys.ANNOTATION_NAD_RESOURCE}: "
        "remove that network from the VM, or the GPU resource name from that "
        "NetworkAttachmentDefinition, and the VM starts"
    )


def resource_claims_missing(pod: Obj, names: Iterable[str]) -> str | None:
    """Why a launcher pod does not use every ResourceClaim of its ``dra`` claims (named as
    the claims are), or None: virt-controller renders them from the VMI's resourceClaims,
    which the VMI webhook wrote, so a pod without them was not made from that VMI."""
    used = {
        str(entry.get("resourceClaimName") or "")
        for entry in (pod.get("spec") or {}).get("resourceClaims") or ()
    }
    missing = sorted(set(names) - used)
    if not missing:
        return None
    return (
        f"launcher pod {name_of(pod)} does not use the ResourceClaim(s) {', '.join(missing)} "
        "of its claims of a class served by DRA: the VM's GPUs would not be its claims'. "
        "Start the VM again so that its VMI carries them"
    )


# --- whose a pod is ----------------------------------------------------------------------


def _candidate(pod: Obj, vmi_uid: str) -> bool:
    """A pod that can be a VMI's launcher pod: it names the VMI by uid, is not final, and
    is not a migration target (whose VMI already runs elsewhere, on its own pod)."""
    labels = meta(pod).get("labels") or {}
    return (
        bool(vmi_uid)
        and owning_vmi_uid(pod) == vmi_uid
        and (pod.get("status") or {}).get("phase") not in FINAL_POD_PHASES
        and keys.LABEL_MIGRATION_JOB_UID not in labels
    )


def migration_of(pod: Obj) -> str | None:
    """The uid of the VirtualMachineInstanceMigration a pod is the target pod of (its
    ``kubevirt.io/migrationJobUID`` label), or None for any other pod."""
    value = (meta(pod).get("labels") or {}).get(keys.LABEL_MIGRATION_JOB_UID)
    return str(value) if value else None


def migration_open(job: Obj) -> bool:
    """Whether a ``VirtualMachineInstanceMigration`` is still under way: not Succeeded or
    Failed, and not being deleted (a tenant cancels a migration by deleting it)."""
    if meta(job).get("deletionTimestamp"):
        return False
    return (job.get("status") or {}).get("phase") not in MIGRATION_FINAL_PHASES


def migration_target_of(pods: Iterable[Obj], vmi_uid: str, migration: str) -> Obj | None:
    """The one target pod of a migration among ``pods``: of those that name the VMI by
    uid, carry the migration's uid and are not final, the one the controller let go (it
    ungated the target it pinned), else the oldest. A second one (or one forged with the
    label later) is not it: it stays gated, and counts as raw usage. The pod let go comes
    first because creationTimestamp has whole seconds: a pod forged in the second the real
    target was made, and named to sort first, would otherwise take its place."""
    candidates = [
        p
        for p in pods
        if vmi_uid
        and owning_vmi_uid(p) == vmi_uid
        and migration_of(p) == migration
        and (p.get("status") or {}).get("phase") not in FINAL_POD_PHASES
    ]
    return min(candidates, key=lambda p: (is_gated(p), *_age_key(p))) if candidates else None


def _age_key(pod: Obj) -> tuple[str, str]:
    return (str(meta(pod).get("creationTimestamp") or ""), name_of(pod))


def launcher_of(pods: Iterable[Obj], vmi_uid: str) -> Obj | None:
    """The one launcher pod of the VMI with ``vmi_uid`` among ``pods``: the oldest (by
    creationTimestamp, then name) of those naming it by uid that are not final and not a
    migration target. virt-controller makes it as soon as the VMI exists, so a pod forged
    later is not picked; one forged earlier only makes the real one count as raw usage."""
    candidates = [p for p in pods if _candidate(p, vmi_uid)]
    return min(candidates, key=_age_key) if candidates else None


class PodRole(Enum):
    """How a pod's GPU requests are counted."""

    COVERED = "covered"  # the one launcher pod of a live VMI with claims: its claims cover it
    FINISHING = "finishing"  # the launcher pod its VMI had when it ended: it holds nothing
    RAW = "raw"  # any other pod: raw usage on its node and in its namespace


def pod_role(
    pod: Obj,
    vmi: VMIState | None,
    siblings: Iterable[Obj],
    ended_launcher: str | None = None,
) -> PodRole:
    """How one pod is counted.

    ``vmi``: the VMI of the name the pod's owner reference names, as known (None: none);
    ``siblings``: the pods naming that VMI (the pod itself among them); ``ended_launcher``:
    the name of the pod that was the launcher pod of the VMI with the pod's owner uid when
    that VMI was seen to end (final or deleted), or None. A VMI first seen already ended
    has none: its pods count as raw, which errs on the side of counting.
    """
    uid = owning_vmi_uid(pod)
    if not uid:
        return PodRole.RAW
    if ended_launcher is not None:
        return PodRole.FINISHING if ended_launcher == name_of(pod) else PodRole.RAW
    if vmi is None or vmi.uid != uid or vmi.final or not vmi.uses_claims:
        return PodRole.RAW
    migration = migration_of(pod)
    if migration is not None:
        # A live migration's target pod (SPEC §12): covered by the units its VMI's claims
        # hold for that migration's target (``pod_usage.claims_cover``), and only the one.
        target = migration_target_of(siblings, uid, migration)
        return (
            PodRole.COVERED
            if target is not None and name_of(target) == name_of(pod)
            else (PodRole.RAW)
        )
    launcher = launcher_of(siblings, uid)
    if launcher is not None and name_of(launcher) == name_of(pod):
        return PodRole.COVERED
    return PodRole.RAW


# --- what a pod holds --------------------------------------------------------------------


def raw_usage(pod: Obj) -> PodUsage | None:
    """The extended-resource requests of a pod counted as raw usage (any pod but the one
    launcher pod of a live VMI with claims, see ``pod_role``), or None when it asks for
    none or is final (a final pod holds nothing)."""
    if (pod.get("status") or {}).get("phase") in FINAL_POD_PHASES:
        return None
    totals = extended_requests(pod)
    if not totals:
        return None
    return PodUsage(namespace_of(pod), (pod.get("spec") or {}).get("nodeName") or None, totals)


def launcher_usage(pod: Obj, cover: Mapping[str, int]) -> PodUsage | None:
    """The units the running launcher pod of a live VMI with claims uses beyond what its
    claims hold on its node (``cover``), or None when they cover it all.

    A claim deleted by force, moved or stripped of its protection leaves the pod using
    GPUs that no claim counts: they are still occupied on that node, and no one else may be
    bound to them. Counted only once the pod is on a node and until it is final.
    """
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in FINAL_POD_PHASES:
        return None
    remainder = {
        name: units - cover.get(name, 0)
        for name, units in extended_requests(pod).items()
        if units > cover.get(name, 0)
    }
    if not remainder:
        return None
    return PodUsage(namespace_of(pod), str(node), remainder)
