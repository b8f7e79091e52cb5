"""What a pod uses of the extended resources, and what one VMI's claims cover of it: the
raw-name usage the binder counts, and the units a launcher pod may use without taking
anyone else's."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import is_template_claim, meta


@dataclass(frozen=True)
class PodUsage:
    """Extended resources one running pod requests, and where."""

    namespace: str
    node: str | None
    requests: Mapping[str, int]


# Claim phases whose units a launcher pod on the claim's node is using: Bound and Attached
# claims, and Lost ones (the model counts a Lost claim there while its VMI runs there, and
# a running launcher pod says it does).
_COVERING_PHASES = frozenset({Phase.BOUND.value, Phase.ATTACHED.value, Phase.LOST.value})


def claim_serves_vmi(claim: Obj, vmi_name: str) -> bool:
    """The claim's units are the VMI's: attached to it (``status.attachedTo``), or a
    template claim it owns (the controller creates those, owned by the VMI)."""
    return (claim.get("status") or {}).get("attachedTo") == vmi_name or (
        template_owner(claim) == vmi_name
    )


def template_owner(claim: Obj) -> str | None:
    """The VMI that owns a template claim (the controller makes them so), or None."""
    if not is_template_claim(claim):
        return None
    for ref in meta(claim).get("ownerReferences") or []:
        if ref.get("kind") == keys.VMI.kind and ref.get("name"):
            return str(ref["name"])
    return None


def claims_cover(
    claims: Iterable[Obj],
    resource_of: Callable[[str], str | None],
    node: str,
    migration: str | None = None,
) -> dict[str, int]:
    """Units, by resource name, that one VMI's claims (see ``claim_serves_vmi``) hold on
    ``node``: what its launcher pod there may use without taking anyone else's. For the
    target pod of the migration of uid ``migration`` (SPEC §12), also the units the claims
    hold for that migration's target on ``node``: before the VM lands there, the target
    recorded on them; once it has, the claims themselves (they moved to its node, and the
    pod keeps KubeVirt's migration label for the rest of its life)."""
    cover: dict[str, int] = {}
    for claim in claims:
        status = claim.get("status") or {}
        if status.get("phase") not in _COVERING_PHASES:
            continue
        target = status.get("migration") or {}
        recorded = (
            migration is not None
            and target.get("migrationUID") == migration
            and target.get("node") == node
        )
        if status.get("nodeName") != node and not recorded:
            continue
        resource = resource_of(str((claim.get("spec") or {}).get("class", "")))
        if resource:
            cover[resource] = cover.get(resource, 0) + int(
                (claim.get("spec") or {}).get("count") or 1
            )
    return cover


def sum_usage(usages: Iterable[PodUsage], gpu_names: frozenset[str]) -> dict[str, int]:
    total: dict[str, int] = {}
    for usage in usages:
        for name, units in usage.requests.items():
            if name in gpu_names:
                total[name] = total.get(name, 0) + units
    return total
