"""The pod webhook's rules: which pods get the scheduling gate and the classes' tolerations.

KubeVirt's virt-controller creates the virt-launcher pod of a VMI, and for
WaitForFirstConsumer volumes first a temporary pod (annotation
``kubevirt.io/ephemeral-provisioning: "true"``), from one template
(``TemplateService.renderLaunchManifest``): both copy every VMI label, so both carry the
reference label, and both have the VMI as their controlling ownerReference. That
ownerReference is how a pod is linked to its VMI. A live migration's target pod is rendered
the same way but also labelled ``kubevirt.io/migrationJobUID``: it is gated too, and the
leader places the set's target for it (SPEC §12).

Pure: the caller reads the VMI, its claims and their classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta


@dataclass(frozen=True)
class PodChanges:
    """What the webhook adds to one pod: the gate (only when absent) and tolerations."""

    gate: bool
    tolerations: tuple[dict[str, Any], ...]

    def __bool__(self) -> bool:
        return self.gate or bool(self.tolerations)


def owner_vmi(pod: Obj) -> str | None:
    """The name of the VMI that owns the pod (its controlling ownerReference, or any
    VirtualMachineInstance reference of the kubevirt.io group), or None."""
    refs = [
        ref
        for ref in meta(pod).get("ownerReferences") or []
        if ref.get("kind") == keys.VMI.kind
        and str(ref.get("apiVersion", "")).split("/", maxsplit=1)[0] == keys.KUBEVIRT_GROUP
    ]
    refs.sort(key=lambda ref: not ref.get("controller"))
    return str(refs[0]["name"]) if refs else None


def _normal(toleration: Obj) -> tuple[str, str, str, str, Any]:
    """A toleration as the scheduler reads it (operator Equal when unset)."""
    return (
        str(toleration.get("key") or ""),
        str(toleration.get("operator") or "Equal"),
        str(toleration.get("value") or ""),
        str(toleration.get("effect") or ""),
        toleration.get("tolerationSeconds"),
    )


def class_tolerations(classes: Iterable[Obj]) -> list[dict[str, Any]]:
    """The union of the classes' tolerations, in class-name order, without repeats."""
    seen: set[tuple[str, str, str, str, Any]] = set()
    union: list[dict[str, Any]] = []
    for klass in sorted(classes, key=lambda c: str(meta(c).get("name", ""))):
        for toleration in (klass.get("spec") or {}).get("tolerations") or []:
            normal = _normal(toleration)
            if normal not in seen:
                seen.add(normal)
                union.append(dict(toleration))
    return union


def changes(pod: Obj, tolerations: Iterable[Obj]) -> PodChanges:
    """The gate when the pod lacks it, and the tolerations it does not have yet; calling
    it on the changed pod gives no change (a reinvocation adds nothing twice)."""
    spec = pod.get("spec") or {}
    gates = {g.get("name") for g in spec.get("schedulingGates") or []}
    present = {_normal(t) for t in spec.get("tolerations") or []}
    missing = tuple(dict(t) for t in tolerations if _normal(t) not in present)
    return PodChanges(gate=keys.SCHEDULING_GATE_CLAIMS not in gates, tolerations=missing)


def apply(body: dict[str, Any], change: PodChanges) -> None:
    """Write the changes into a pod body in place (kopf turns it into the JSON patch)."""
    spec = body.setdefault("spec", {})
    if change.gate:
        spec["schedulingGates"] = [
            *(spec.get("schedulingGates") or []),
            {"name": keys.SCHEDULING_GATE_CLAIMS},
        ]
    if change.tolerations:
        spec["tolerations"] = [*(spec.get("tolerations") or []), *change.tolerations]
