"""Readers of the pods of VMIs (launcher pods): which VMI owns one, whether our gate holds
it, where it is pinned, whether the scheduler bound it. The binder's gate, the cluster
view, the tests and the kubectl plugin read pods with these."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import Obj

# The node selector field KubeVirt's scheduler-facing pods can be pinned with (matchFields
# supports only metadata.name).
NODE_NAME_FIELD = "metadata.name"


def _meta(obj: Obj) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def owning_vmi(pod: Obj) -> str | None:
    """The VMI a launcher pod (or KubeVirt's temporary WFFC pod) belongs to."""
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("kind") == keys.VMI.kind and str(ref.get("apiVersion", "")).startswith(
            keys.KUBEVIRT_GROUP + "/"
        ):
            return str(ref.get("name"))
    return None


def owning_vmi_uid(obj: Obj) -> str:
    """The uid of the VMI that owns an object ("" when it names none or no uid)."""
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("kind") == keys.VMI.kind and str(ref.get("apiVersion", "")).startswith(
            keys.KUBEVIRT_GROUP + "/"
        ):
            return str(ref.get("uid") or "")
    return ""


def is_gated(pod: Obj) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == keys.SCHEDULING_GATE_CLAIMS for g in gates)


def required_terms(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    return list(required.get("nodeSelectorTerms") or [])


def pinned_node(pod: Obj) -> str | None:
    """The node a pod is pinned to by a ``metadata.name`` requirement, or None."""
    for term in required_terms(pod.get("spec") or {}):
        for field in term.get("matchFields") or []:
            values = field.get("values") or []
            pins = field.get("key") == NODE_NAME_FIELD and field.get("operator") == "In"
            if pins and len(values) == 1:
                return str(values[0])
    return None


def scheduled(pod: Obj) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))
