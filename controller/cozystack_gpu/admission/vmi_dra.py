"""The VMI webhook's DRA form (SPEC §13): a VMI whose held claims are of a ``dra`` class
carries, for each such claim, a ``spec.resourceClaims`` entry naming the claim's
ResourceClaim and one ``gpus`` entry per unit with its ``claimName`` and ``requestName``
(KubeVirt's ``GPUsWithDRA``), where a ``devicePlugin`` class's unit has a ``deviceName``.
The gate and the pin are the same for both: kube-scheduler allocates the ResourceClaim on
the node the launcher pod is pinned to."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import Obj, dra
from cozystack_gpu.objects.translate import class_resource_name


@dataclass(frozen=True)
class Entries:
    """What the VMI must carry: its gpus entries, one per unit of the set, and its
    resourceClaims entries, one per held claim of a ``dra`` class."""

    gpus: tuple[dict[str, str], ...]
    resource_claims: tuple[dict[str, str], ...] = ()


def entries(
    held: Iterable[tuple[str, Obj]],
    templates: Iterable[tuple[str, int]],
    classes: Mapping[str, Obj],
) -> Entries:
    """Held claims first, then the templates (class, count), each unit named by its place in
    the set (``gpu-cozystack-<i>``) whatever its source."""
    gpus: list[dict[str, str]] = []
    resource_claims: list[dict[str, str]] = []
    for claim_name, claim in held:
        spec = claim.get("spec") or {}
        klass = classes[str(spec.get("class"))]
        count = int(spec.get("count") or 1)
        if dra.dra_source(klass) is not None:
            made = dra.vmi_claim_entries(claim_name, count, first_unit=len(gpus))
            resource_claims.append(made.resource_claim)
            gpus += made.gpus
        else:
            gpus += [_unit(len(gpus) + i, class_resource_name(klass)) for i in range(count)]
    for class_name, count in templates:
        resource = class_resource_name(classes[class_name])
        gpus += [_unit(len(gpus) + i, resource) for i in range(count)]
    return Entries(tuple(gpus), tuple(resource_claims))


def _unit(index: int, resource: str) -> dict[str, str]:
    return {"name": f"{keys.VMI_GPU_NAME_PREFIX}{index}", "deviceName": resource}


def template_refusal(templates: Iterable[Any], classes: Mapping[str, Obj]) -> str | None:
    """Why claim templates (``gpu_class``, ``count``) of a ``dra`` class cannot be: their
    ResourceClaim would be made only once their claim is, after the VMI that must name
    it. None when no template is of one."""
    found = sorted(
        {
            t.gpu_class
            for t in templates
            if (k := classes.get(t.gpu_class)) is not None and dra.dra_source(k)
        }
    )
    if not found:
        return None
    return (
        f"claim templates of class {', '.join(found)} (served by DRA) are not supported: "
        "order a GPUClaim of the class and name it in the annotation's claims instead"
    )


def set_resource_claims(body: dict[str, Any], ours: Iterable[Mapping[str, str]]) -> None:
    """Write this webhook's ``spec.resourceClaims`` entries into a VMI body in place, after
    the VMI's own, replacing any entry of the reserved prefix (so calling it again changes
    nothing); a VMI without any keeps none."""
    spec = body.setdefault("spec", {})
    own = [
        dict(e)
        for e in spec.get("resourceClaims") or []
        if not str(e.get("name", "")).startswith(keys.VMI_RESOURCE_CLAIM_PREFIX)
    ]
    merged = own + [dict(e) for e in ours]
    if merged or "resourceClaims" in spec:
        spec["resourceClaims"] = merged
