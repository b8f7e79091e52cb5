"""How the rules read objects: the binder's pod roles (``launcher.pod_role``) on one
moment of the cluster, owners, the claims a VMI's annotation names, the VMIs that run,
timestamps, a node's readiness, and a launcher pod's pins."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj, annotation, dra
from cozystack_gpu.objects.launcher import PodRole, launcher_usage, migration_of, pod_role
from cozystack_gpu.objects.pod_usage import PodUsage, claims_cover, template_owner
from cozystack_gpu.objects.translate import dra_units_key, vmi_state
from cozystack_gpu_testkit.invariants.state import State, _meta

HOLDING = ("Bound", "Attached")  # claim phases that hold units on their node
FINAL_VMI = ("Succeeded", "Failed")


def _pod_roles(state: State) -> list[tuple[MutableObj, PodRole]]:
    """How each pod counts, by the binder's rule (``launcher.pod_role``): the one launcher
    pod of a live VMI with claims is covered by them; any other pod is raw usage, whatever
    its labels. The state is one moment and has no history, so a labelled pod of a VMI that
    is final or gone is taken as that VMI's finishing launcher pod (the binder counts more:
    only the pod it saw as the launcher when the VMI ended)."""
    vmis = {(_namespace(v), _name(v)): vmi_state(v) for v in state.vmis}
    live_uids = {(_namespace(v), _meta(v).get("uid")) for v in state.vmis}
    siblings: dict[tuple[str, str], list[MutableObj]] = {}
    for pod in state.pods:
        owner = _owning_vmi(pod)
        if owner is not None:
            siblings.setdefault((_namespace(pod), owner), []).append(pod)
    roles: list[tuple[MutableObj, PodRole]] = []
    for pod in state.pods:
        owner = _owning_vmi(pod)
        vmi = vmis.get((_namespace(pod), owner)) if owner is not None else None
        uid = (_owner_ref(pod, "VirtualMachineInstance") or {}).get("uid")
        ended = (vmi is not None and vmi.uid == uid and vmi.final) or (
            uid and (_namespace(pod), uid) not in live_uids
        )
        labelled = keys.uses_claims(_meta(pod).get("labels"))
        finishing = _name(pod) if ended and labelled else None
        mates = siblings.get((_namespace(pod), owner), []) if owner is not None else []
        roles.append((pod, pod_role(pod, vmi, mates, finishing)))
    return roles


def _raw_pods(state: State) -> list[MutableObj]:
    return [pod for pod, role in _pod_roles(state) if role is PodRole.RAW]


def _uncovered_launcher_usage(
    state: State, resource_of: Mapping[str, str]
) -> list[tuple[str, PodUsage]]:
    """What the launcher pods of live VMIs with claims use beyond the units their VMI's
    claims hold on their node: a claim deleted by force, moved or stripped leaves the pod
    using GPUs that no claim counts, and they are still occupied there."""
    serving: dict[tuple[str, str], list[MutableObj]] = {}
    for claim in state.claims:
        vmis = {(claim.get("status") or {}).get("attachedTo"), template_owner(claim)}
        for vmi in vmis - {None, ""}:
            serving.setdefault((_namespace(claim), str(vmi)), []).append(claim)
    found: list[tuple[str, PodUsage]] = []
    for pod, role in _pod_roles(state):
        owner = _owning_vmi(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        if role is not PodRole.COVERED or owner is None or not node:
            continue
        claims = serving.get((_namespace(pod), owner), [])
        # A live migration's target pod is covered by the target its claims record there.
        cover = claims_cover(claims, resource_of.get, str(node), migration_of(pod))
        usage = launcher_usage(pod, cover)
        if usage is not None:
            found.append((f"{_namespace(pod)}/{_name(pod)}", usage))
    return found


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name", ""))


def _namespace(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("namespace", ""))


def _count(claim: Mapping[str, Any]) -> int:
    return int((claim.get("spec") or {}).get("count") or 1)


def _class_resource(gpu_class: Mapping[str, Any]) -> str:
    """What the class's units are counted under: its resource name, or for a ``dra``
    class its own key (its devices serve no other class)."""
    source = (gpu_class.get("spec") or {}).get("source") or {}
    if "dra" in source:
        return dra_units_key(_name(gpu_class))
    return str((source.get("devicePlugin") or {}).get("resourceName") or "")


def _resource_name(resource: str) -> bool:
    """A resource name a pod or a quota may ask for (not a dra class's units key)."""
    return bool(resource) and not resource.startswith(dra_units_key(""))


def _ancestors(namespace: Mapping[str, Any]) -> frozenset[str]:
    labels = _meta(namespace).get("labels") or {}
    return keys.tenant_ancestors(dict(labels)) | {_name(namespace)}


def _template(claim: Mapping[str, Any]) -> bool:
    labels = _meta(claim).get("labels") or {}
    return bool(labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE)


def _bound_reason(status: Mapping[str, Any]) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == keys.CONDITION_BOUND:
            return str(cond.get("reason") or "")
    return ""


def _budget_key(key: str, gpu_names: set[str]) -> bool:
    return key.startswith(keys.QUOTA_KEY_PREFIX) or (
        key.removeprefix(keys.QUOTA_RAW_REQUESTS_PREFIX) in gpu_names
    )


def _owning_vmi(pod: Mapping[str, Any]) -> str | None:
    for ref in _meta(pod).get("ownerReferences") or []:
        if ref.get("kind") == "VirtualMachineInstance":
            return str(ref.get("name"))
    return None


def _owner_ref(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The controlling owner reference of ``kind`` (or the first of that kind)."""
    refs = [r for r in _meta(obj).get("ownerReferences") or [] if r.get("kind") == kind]
    return next((r for r in refs if r.get("controller")), refs[0] if refs else None)


def _claims_request(vmi: Mapping[str, Any]) -> annotation.ClaimsRequest | None:
    """The claims a VMI's annotation names, or None (none, or unreadable)."""
    raw = (_meta(vmi).get("annotations") or {}).get(keys.ANNOTATION_CLAIMS)
    if not raw:
        return None
    try:
        return annotation.parse(str(raw))
    except annotation.AnnotationError:
        return None


def _running_vmis(state: State) -> Iterator[tuple[MutableObj, str]]:
    """(VMI, node) for every VMI marked Running whose launcher pod (owned by its uid) is
    bound to a node. During a live migration a VMI has two bound pods (source and target,
    until the source pod goes): it runs on the one its ``status.nodeName`` names, which
    virt-handler moves when it lands; failing that, the first by name."""
    bound: dict[tuple[str, str], set[str]] = {}
    for pod in state.pods:
        node = (pod.get("spec") or {}).get("nodeName")
        owner = _owner_ref(pod, "VirtualMachineInstance")
        if node and owner is not None and not _meta(pod).get("deletionTimestamp"):
            bound.setdefault((_namespace(pod), str(owner.get("uid"))), set()).add(str(node))
    for vmi in state.vmis:
        status = vmi.get("status") or {}
        if status.get("phase") != "Running":
            continue
        nodes = bound.get((_namespace(vmi), str(_meta(vmi).get("uid"))))
        if nodes:
            named = status.get("nodeName")
            yield vmi, str(named) if named in nodes else min(nodes)


def _epoch(stamp: object) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _running_since(vmi: Mapping[str, Any]) -> float | None:
    """When the VMI turned Running, as KubeVirt records it (phaseTransitionTimestamps)."""
    stamps = (vmi.get("status") or {}).get("phaseTransitionTimestamps") or []
    running = [
        _epoch(t.get("phaseTransitionTimestamp")) for t in stamps if t.get("phase") == "Running"
    ]
    found = [t for t in running if t is not None]
    return max(found) if found else _epoch(_meta(vmi).get("creationTimestamp"))


def _node_ready(node: Mapping[str, Any] | None) -> tuple[bool, float | None]:
    """Whether the node is Ready, and when its Ready condition last changed."""
    if node is None:
        return False, None
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True", _epoch(cond.get("lastTransitionTime"))
    return False, None


def _foreign_template(
    claim: Mapping[str, Any], vmi: Mapping[str, Any], gpu_class: str, count: int
) -> str:
    """Why a claim named like a VMI's template claim is not the one its entry makes ('' when
    it is): the label, the VMI's uid as controlling owner, the entry's class and count."""
    problems = []
    if not _template(claim):
        problems.append(f"no {keys.LABEL_TEMPLATE_CLAIM} label")
    owner = _owner_ref(claim, "VirtualMachineInstance")
    if owner is None or not owner.get("controller"):
        problems.append("no controlling VMI owner")
    elif owner.get("uid") != _meta(vmi).get("uid"):
        problems.append(f"owned by VMI uid {owner.get('uid')}, not {_meta(vmi).get('uid')}")
    spec = claim.get("spec") or {}
    if spec.get("class") != gpu_class or _count(claim) != count:
        problems.append(
            f"class {spec.get('class')} x{_count(claim)} where the entry asks {gpu_class} x{count}"
        )
    return "; ".join(problems)


def required_pins(spec: Mapping[str, Any]) -> list[str | None]:
    """Per required node-selector term, the one node its ``metadata.name`` In pins (None
    for a term without a pin); empty when the pod has no required term."""
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    pins: list[str | None] = []
    for term in required.get("nodeSelectorTerms") or []:
        pin = None
        for match in term.get("matchFields") or []:
            values = match.get("values") or []
            if (
                match.get("key") == "metadata.name"
                and match.get("operator") == "In"
                and len(values) == 1
            ):
                pin = str(values[0])
        pins.append(pin)
    return pins


def _dra_capacity(state: State) -> dict[tuple[str, str], int]:
    """Each node's devices of each ``dra`` class, by (node, the class's units key): those of
    its slices that the class's DeviceClass and selectors match (CEL judged by the
    product's matcher, the count by this rule). An upper bound: it keeps the devices other
    ResourceClaims hold, which the fuzz's world never makes."""
    sources = {_name(c): dra.dra_source(c) for c in state.classes}
    device_classes = {_name(d): d for d in state.device_classes}
    matchers = {
        name: dra.compile_matcher(device_classes.get(source.device_class), source.selectors, name)
        for name, source in sources.items()
        if source is not None
    }
    capacity: dict[tuple[str, str], int] = {}
    for node, devices in dra.node_devices(state.resource_slices).items():
        for name, matcher in matchers.items():
            capacity[(node, dra_units_key(name))] = sum(1 for d in devices if matcher.matches(d))
    return capacity
