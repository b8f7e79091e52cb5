"""The VMI webhook's rules: from what was read about a VMI's claims, refuse or plan the start.

Pure: the caller reads the claims, the classes, the settings and the instance type from the
API server, and this module judges them and builds the ``gpus`` entries. The checks run in
a fixed order and the first failure is the answer, so one VMI always gets one message:

1. every held claim exists, is not being deleted, is attached to no other VMI, and is Bound
   (or still attached to an earlier VMI of this name: see 8);
2. the class of every held claim and every claim template exists, and no template orders
   from a class being deleted;
3. the held claims share one node;
4. at most one vGPU class in the set;
5. no class above its maxCount for the set (held and template units together);
6. vGPU templates need the namespace's vGPU entitlement, and a licensed class the
   controller's own licence copy in the namespace (``license_check``);
7. the VMI carries no GPU entry of its own (``gpus``, ``hostDevices``, resource requests or
   limits, or its instance type's ``gpus``/``hostDevices``) whose name is a GPU resource name.

Budgets and capacity of the templates are not judged here: the controller creates and
places them when the launcher pod is gated, so a template that does not fit leaves the VM
starting with a reason instead of refused into KubeVirt's start backoff.

Wording follows the model's refusals where the rule is the same (maxCount, mixed vGPU
classes, entitlement), so a tenant reads one sentence for one rule wherever it is judged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.admission import vmi_dra
from cozystack_gpu.keys import AdmissionReason, Mode
from cozystack_gpu.licensing.rules import (
    Copy,
    TokenProblem,
    class_license,
    copy_problem,
    wanted_copy,
)
from cozystack_gpu.model import Reason
from cozystack_gpu.model.set_shape import ClassShape, SetMember, judge_set_shape
from cozystack_gpu.objects import Obj, attachment
from cozystack_gpu.objects.annotation import ClaimsRequest
from cozystack_gpu.objects.translate import class_resource_name, made_by_template, meta


@dataclass(frozen=True)
class Refusal:
    """A start refused: ``reason`` for machines and metrics, ``message`` for the tenant."""

    reason: str
    message: str


@dataclass(frozen=True)
class Start:
    """An accepted start: the ``gpus`` entries the VMI must carry, one per unit (the binder
    attaches the held claims once the VMI is stored)."""

    gpus: tuple[dict[str, str], ...]
    # The namespace's licence copy the VM gets as a disk (a licensed vGPU class), or None.
    license_copy: str | None = None
    # One spec.resourceClaims entry per held claim of a dra class (``vmi_dra``).
    resource_claims: tuple[dict[str, str], ...] = ()


@dataclass(frozen=True)
class InstanceType:
    """The instance type a VMI was made from: its kind and name, and its spec."""

    kind: str
    name: str
    spec: Obj


@dataclass(frozen=True)
class VMIFacts:
    """What the webhook read about one VMI.

    - ``claims``: every held claim named by the annotation, as read (None: not found).
    - ``classes``: every GPUClass, by name.
    - ``settings_names``: the effective GPU resource-name set the leader publishes as
      ``resourceNames`` in the settings ConfigMap (class names, what GPU nodes advertise,
      the hoster's extra names), from this replica's own view of the same objects.
    - ``namespace_labels``: the VMI's namespace labels (the vGPU entitlement).
    - ``instancetype``: the instance type the VMI names, when it names one.
    - ``largest_node``: units of the largest node serving a class, for a passthrough class
      without maxCount; None when unknown (this replica has not read the cluster yet).
    """

    claims: Mapping[str, Obj | None]
    classes: Mapping[str, Obj]
    settings_names: frozenset[str] = frozenset()
    namespace_labels: Mapping[str, str] = field(default_factory=dict)
    instancetype: InstanceType | None = None
    largest_node: Callable[[str], int | None] = lambda _name: None
    # The VMI of this name as the API server has it now, when a held claim's attachment
    # already names this name (read only then): a VMI of this name that still exists means
    # this create is not the one the attachment belongs to, and will fail anyway.
    same_name_vmi: Obj | None = None
    # For each licensed class of the set (read only for a set of a licensed vGPU class):
    # the Secret of its copy's name in the VMI's namespace, and the hoster's token Secret
    # the class names, in the controller's namespace (None: not found).
    license_copies: Mapping[str, Obj | None] = field(default_factory=dict)
    license_sources: Mapping[str, Obj | None] = field(default_factory=dict)
    # The resource each NetworkAttachmentDefinition the VMI's multus networks name carries
    # (keys.ANNOTATION_NAD_RESOURCE), by (namespace, name): "" none, None not readable.
    network_resources: Mapping[tuple[str, str], str | None] = field(default_factory=dict)
    # The GPUReservation of each held claim's name that does not exist (read only then): a
    # window's claim is made at its start, and before it the VM is told when that is.
    reservations: Mapping[str, Obj | None] = field(default_factory=dict)


def licensed_classes(class_names: Iterable[str], classes: Mapping[str, Obj]) -> list[str]:
    """The classes among ``class_names`` whose guests get a licence (vGPU with license)."""
    return sorted(
        {n for n in class_names if n in classes and class_license(classes[n]) is not None}
    )


def license_secret_name(klass: Obj) -> str | None:
    """The hoster's token Secret a licensed class names, or None."""
    lic = class_license(klass)
    return lic.secret_name if lic is not None else None


def license_check(
    class_name: str, facts: VMIFacts, namespace: str, entitled: bool
) -> Refusal | None:
    """A licensed start refused unless the namespace holds the controller's own copy: the
    copier's labels and hash over data that is the hoster's token now. A tenant may make a
    Secret of the copy's name (the admin role writes Secrets), labels and hash included; its
    data is what gives it away."""
    klass = facts.classes[class_name]
    if not entitled:
        return license_refusal(class_name, klass, namespace, entitled)
    wanted = wanted_copy(klass, namespace, facts.license_sources.get(class_name))
    if isinstance(wanted, TokenProblem):
        return Refusal(
            AdmissionReason.LICENSE_SECRET_REFUSED,
            f"vGPU class {class_name} is licensed, but its licence cannot be handed out: "
            f"{wanted.message} (the class's {keys.CONDITION_LICENSE_READY} condition says the "
            "same); the hoster fixes it, then start again",
        )
    assert isinstance(wanted, Copy)
    found = facts.license_copies.get(class_name)
    if found is None:
        return license_refusal(class_name, klass, namespace, entitled)
    problem = copy_problem(wanted, found)
    if problem is None:
        return None
    return Refusal(
        AdmissionReason.LICENSE_COPY_UNTRUSTED,
        f"Secret {wanted.name} in namespace {namespace} is not the controller's copy of the "
        f"licence of vGPU class {class_name}: {problem}; the guest would boot with it as its "
        "licence, so the start is refused; a Secret of that name made or edited in the "
        "namespace is replaced by the controller within moments: delete it if it is yours, "
        "and start again",
    )


def license_refusal(class_name: str, klass: Obj, namespace: str, entitled: bool) -> Refusal:
    """A licensed start whose namespace has no copy of the class's token."""
    copy = keys.license_copy_name(class_name)
    if not entitled:
        return Refusal(
            AdmissionReason.LICENSE_COPY_MISSING,
            f"vGPU class {class_name} is licensed, and its licence reaches only namespaces "
            f"entitled to vGPU: namespace {namespace} is not entitled to vGPU (any more), so "
            f"it has no Secret {copy}; the parent tenant's administrator grants vGPU on the "
            f"Tenant, and Cozystack then labels the namespace {keys.LABEL_VGPU_ENTITLEMENT}: "
            f'"{keys.VGPU_ENTITLEMENT_VALUE}"',
        )
    lic = class_license(klass)
    ref = f"Secret {lic.secret_name} (key {lic.secret_key})" if lic else "its Secret"
    return Refusal(
        AdmissionReason.LICENSE_COPY_MISSING,
        f"the licence of vGPU class {class_name} has not been copied into namespace "
        f"{namespace} yet (Secret {copy}): the controller copies it there once the namespace "
        f"is entitled to vGPU and the hoster's {ref} exists in the controller's namespace; "
        "try again in a moment",
    )


def gpu_entry_name(index: int) -> str:
    """The name of the ``index``-th unit's gpus entry: deterministic, so a reinvocation
    writes the same entries, and a valid KubeVirt device name."""
    return f"{keys.VMI_GPU_NAME_PREFIX}{index}"


def is_ours(entry: Obj) -> bool:
    """A gpus entry this webhook added (the prefix is reserved for it)."""
    return str(entry.get("name", "")).startswith(keys.VMI_GPU_NAME_PREFIX)


def judge(vmi: Obj, request: ClaimsRequest, facts: VMIFacts) -> Refusal | Start:
    """Refuse the VMI's start with one message, or say what it must carry.

    The refusals, in the order they are judged (the first that holds is said):
    1. a held claim that is missing, not bound, or another VMI's (``held_claim_refusal``);
    2. held claims bound to more than one node;
    3. the set's shape: classes that do not exist, are being deleted, mix modes, or ask more
       than a class's maxCount (``judge_set_shape``), or a template of a ``dra`` class;
    4. a vGPU claim template in a namespace not entitled to vGPU;
    5. a licensed class whose licence copy is missing or not the controller's;
    6. GPU entries the VMI asks for itself beside its claims;
    7. networks whose NetworkAttachmentDefinitions add GPU requests beyond the claims;
    8. a VMI of the same name that still holds the claims.
    """
    namespace = str(meta(vmi).get("namespace", ""))
    name = str(meta(vmi).get("name", ""))
    held = _held_claims(request, facts, namespace, name)  # 1
    if isinstance(held, Refusal):
        return held
    refusal = _on_several_nodes(held)  # 2
    if refusal is not None:
        return refusal
    judged = _set_shape(held, request, facts)  # 3
    if isinstance(judged, Refusal):
        return judged
    demand, modes = judged
    words = vmi_dra.template_refusal(request.templates, facts.classes)  # 3
    if words:
        return Refusal(AdmissionReason.DRA_TEMPLATE.value, words)
    gpu_names = facts.settings_names | {
        res for klass in facts.classes.values() if (res := class_resource_name(klass))
    }
    refusal = (
        _vgpu_not_entitled(request, modes, facts, namespace)  # 4
        or _licence_refused(demand, facts, namespace)  # 5
        or _own_gpu_entries(vmi, facts, name, gpu_names)  # 6
        or _gpus_through_networks(vmi, facts, name, gpu_names)  # 7
        or _same_name_vmi_holds(held, facts, name)  # 8
    )
    if refusal is not None:
        return refusal
    licensed = licensed_classes(demand, facts.classes)
    copy = keys.license_copy_name(licensed[0]) if licensed else None
    templates = [(entry.gpu_class, entry.count) for entry in request.templates]
    made = vmi_dra.entries(held, templates, facts.classes)
    return Start(made.gpus, license_copy=copy, resource_claims=made.resource_claims)


Held = list[tuple[str, Obj]]  # (claim name, claim) of each claim the VMI holds


def _held_claims(
    request: ClaimsRequest, facts: VMIFacts, namespace: str, name: str
) -> Held | Refusal:
    held: Held = []
    for claim_name in request.claims:
        claim = facts.claims.get(claim_name)
        refusal = held_claim_refusal(
            claim_name, claim, namespace, name, facts.reservations.get(claim_name)
        )
        if refusal is not None:
            return refusal
        assert claim is not None
        held.append((claim_name, claim))
    return held


def _on_several_nodes(held: Held) -> Refusal | None:
    nodes = {claim_name: _node_of(claim) for claim_name, claim in held}
    if len(set(nodes.values())) <= 1:
        return None
    where = ", ".join(f"{c} on {n}" for c, n in nodes.items())
    return Refusal(
        AdmissionReason.CLAIMS_ON_SEVERAL_NODES,
        f"the GPUClaims of one VM must be bound to one node, and these are not: {where}; "
        "order claims a VM uses together as one set (a VirtualMachine that names them "
        "keeps them together) or use claimTemplates",
    )


def _set_shape(
    held: Held, request: ClaimsRequest, facts: VMIFacts
) -> tuple[Iterable[str], dict[str, str]] | Refusal:
    """The set's demand by class and each class's mode, or why the set cannot be."""
    members = [
        SetMember(
            str((claim.get("spec") or {}).get("class", "")),
            int((claim.get("spec") or {}).get("count") or 1),
            order=False,
            label=f"GPUClaim {claim_name}",
        )
        for claim_name, claim in held
    ] + [
        SetMember(entry.gpu_class, entry.count, order=True, label=f"claim template {entry.name}")
        for entry in request.templates
    ]
    shapes = {
        name: ClassShape(
            Mode.VGPU
            if (klass.get("spec") or {}).get("mode") == Mode.VGPU.value
            else Mode.PASSTHROUGH,
            bool(meta(klass).get("deletionTimestamp")),
            _max_count(name, klass, facts),
        )
        for name in {m.class_name for m in members}
        if (klass := facts.classes.get(name)) is not None
    }
    # A start is judged whole: the VM uses every unit of the set (maxCount is per VM).
    demand, refusal = judge_set_shape(members, shapes, max_count=True)
    if refusal is not None:
        return Refusal(refusal.reason, refusal.message)
    return demand, {name: shape.mode.value for name, shape in shapes.items()}


def _entitled(facts: VMIFacts) -> bool:
    return facts.namespace_labels.get(keys.LABEL_VGPU_ENTITLEMENT) == keys.VGPU_ENTITLEMENT_VALUE


def _vgpu_not_entitled(
    request: ClaimsRequest, modes: Mapping[str, str], facts: VMIFacts, namespace: str
) -> Refusal | None:
    if _entitled(facts):
        return None
    for entry in request.templates:
        if modes[entry.gpu_class] == keys.Mode.VGPU.value:
            return Refusal(
                Reason.VGPU_NOT_ENTITLED,
                f"vGPU class {entry.gpu_class} needs the vGPU entitlement, which namespace "
                f"{namespace} does not have; a tenant cannot grant it to itself: the parent "
                "tenant's administrator (the platform administrator for the root tenant) grants "
                "vGPU on the Tenant, and Cozystack then labels the namespace "
                f'{keys.LABEL_VGPU_ENTITLEMENT}: "{keys.VGPU_ENTITLEMENT_VALUE}"',
            )
    return None


def _licence_refused(demand: Iterable[str], facts: VMIFacts, namespace: str) -> Refusal | None:
    for class_name in licensed_classes(demand, facts.classes):
        licence = license_check(class_name, facts, namespace, _entitled(facts))
        if licence is not None:
            return licence
    return None


def _own_gpu_entries(
    vmi: Obj, facts: VMIFacts, name: str, gpu_names: frozenset[str]
) -> Refusal | None:
    own = own_gpu_entries(vmi, facts.instancetype, gpu_names)
    if not own:
        return None
    return Refusal(
        AdmissionReason.OWN_GPU_ENTRIES,
        f"VirtualMachineInstance {name} holds GPUs through its claims "
        f"({keys.ANNOTATION_CLAIMS}) and also requests GPU resource names of its own: "
        f"{'; '.join(own)}; a VM with claims gets its GPUs from its claims only: remove "
        "those entries",
    )


def _gpus_through_networks(
    vmi: Obj, facts: VMIFacts, name: str, gpu_names: frozenset[str]
) -> Refusal | None:
    through_networks = network_gpu_requests(vmi, facts.network_resources, gpu_names)
    if not through_networks:
        return None
    return Refusal(
        AdmissionReason.NETWORK_GPU_RESOURCE,
        f"VirtualMachineInstance {name} holds GPUs through its claims, and networks of it "
        f"would add GPU requests beyond them: {'; '.join(through_networks)}; KubeVirt adds "
        "to the launcher pod a request for the resource a NetworkAttachmentDefinition "
        f"names ({keys.ANNOTATION_NAD_RESOURCE}): remove those networks, or the GPU "
        "resource name from their NetworkAttachmentDefinitions",
    )


def _same_name_vmi_holds(held: Held, facts: VMIFacts, name: str) -> Refusal | None:
    if facts.same_name_vmi is None or not any(
        _attached_to(claim) == name for _claim_name, claim in held
    ):
        return None
    phase = str((facts.same_name_vmi.get("status") or {}).get("phase") or "Pending")
    return Refusal(
        AdmissionReason.VMI_EXISTS,
        f"VirtualMachineInstance {name} still exists ({phase}) and holds the GPUClaims "
        "this one names; a new VMI of that name starts once it is gone",
    )


def _attached_to(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("attachedTo") or "")


def needs_same_name_check(claims: Iterable[Obj | None], vmi_name: str) -> bool:
    """A held claim is attached to this name already, by an earlier VMI of the same name:
    whether that VMI still exists decides."""
    return any(claim is not None and _attached_to(claim) == vmi_name for claim in claims)


def held_claim_refusal(
    claim_name: str,
    claim: Obj | None,
    namespace: str,
    vmi_name: str,
    reservation: Obj | None = None,
) -> Refusal | None:
    if claim is None and reservation is not None:
        return Refusal(AdmissionReason.WINDOW_NOT_OPEN, window_not_open(claim_name, reservation))
    if claim is None:
        return Refusal(
            AdmissionReason.CLAIM_NOT_FOUND,
            f"GPUClaim {claim_name} named in {keys.ANNOTATION_CLAIMS} does not exist in "
            f"namespace {namespace}; order it first, or remove it from the annotation",
        )
    if made_by_template(claim):
        # A template claim serves the one VMI it was made for, which is gone or is another
        # VMI: held by name, it would carry its GPUs into a VM unbilled (it has no usage
        # record) and outlive it.
        return Refusal(
            AdmissionReason.CLAIM_IS_TEMPLATE,
            f"GPUClaim {claim_name} named in {keys.ANNOTATION_CLAIMS} is a template claim "
            f"(labelled {keys.LABEL_TEMPLATE_CLAIM}), made by the controller for one VMI "
            f"from its claimTemplates; a VM cannot hold it by name: list the claim template "
            f"in {keys.ANNOTATION_MEMBER_TEMPLATES} instead, or order a claim of your own",
        )
    if meta(claim).get("deletionTimestamp"):
        return Refusal(AdmissionReason.CLAIM_BEING_DELETED, attachment.being_deleted(claim_name))
    status = claim.get("status") or {}
    attached_to = status.get("attachedTo")
    if attached_to and attached_to != vmi_name:
        return Refusal(
            AdmissionReason.CLAIM_ATTACHED_ELSEWHERE,
            attachment.attached_elsewhere(claim_name, str(attached_to)),
        )
    phase = status.get("phase") or keys.Phase.PENDING.value
    if phase == keys.Phase.BOUND.value or (
        phase == keys.Phase.ATTACHED.value and attached_to == vmi_name
    ):
        return None
    why = _condition_message(status, keys.CONDITION_BOUND)
    return Refusal(
        AdmissionReason.CLAIM_NOT_BOUND,
        f"GPUClaim {claim_name} is {phase}, not Bound" + (f": {why}" if why else ""),
    )


def window_not_open(claim_name: str, reservation: Obj) -> str:
    """Why a VM cannot hold a window's claim yet, or any more (SPEC §11)."""
    status = reservation.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    spec = reservation.get("spec") or {}
    start, end = spec.get("start", "?"), spec.get("end", "?")
    head = (
        f"GPUClaim {claim_name} named in {keys.ANNOTATION_CLAIMS} is GPUReservation {claim_name}'s"
    )
    if phase == "Ended":
        return f"{head}, whose window ended at {end}; book another window, or order a claim"
    if phase in ("Booked", "Active"):
        return (
            f"{head}, made when its window opens at {start} (it ends at {end}); start the VM then"
        )
    why = _condition_message(status, keys.CONDITION_BOOKED)
    return (
        f"{head}, which is {phase}, not booked"
        + (f": {why}" if why else "")
        + f"; its window opens at {start} once it is booked"
    )


def _condition_message(status: Obj, kind: str) -> str:
    for cond in status.get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("message") or "")
    return ""


def _node_of(claim: Obj) -> str:
    return str((claim.get("status") or {}).get("nodeName") or "")


def _max_count(class_name: str, klass: Obj, facts: VMIFacts) -> int | None:
    """maxCount resolved as the model resolves it (``keys.effective_max_count``); None when
    a passthrough class without maxCount meets a replica that does not know its nodes yet
    (the controller judges the set again when it places it)."""
    spec = klass.get("spec") or {}
    mode = str(spec.get("mode", ""))
    written = spec.get("maxCount")
    if written is None and mode == keys.Mode.PASSTHROUGH.value:
        largest = facts.largest_node(class_name)
        if largest is None:
            return None
        return keys.effective_max_count(mode, None, largest)
    return keys.effective_max_count(mode, written, 0)


def own_gpu_entries(
    vmi: Obj, instancetype: InstanceType | None, gpu_names: frozenset[str] | set[str]
) -> list[str]:
    """Where a VMI asks for a GPU resource name itself, as "<path> <name>" descriptions.

    The webhook's own gpus entries (the reserved name prefix) are not the VMI's: on a
    reinvocation they are already there.
    """
    found: list[str] = []
    domain = (vmi.get("spec") or {}).get("domain") or {}
    devices = domain.get("devices") or {}
    for index, entry in enumerate(devices.get("gpus") or []):
        if not is_ours(entry) and entry.get("deviceName") in gpu_names:
            found.append(f"spec.domain.devices.gpus[{index}] {entry['deviceName']}")
    for index, entry in enumerate(devices.get("hostDevices") or []):
        if entry.get("deviceName") in gpu_names:
            found.append(f"spec.domain.devices.hostDevices[{index}] {entry['deviceName']}")
    resources = domain.get("resources") or {}
    for part in ("requests", "limits"):
        for res in sorted(resources.get(part) or {}):
            if res in gpu_names:
                found.append(f"spec.domain.resources.{part} {res}")
    if instancetype is not None:
        where = f"{instancetype.kind} {instancetype.name}"
        for member in ("gpus", "hostDevices"):
            for index, entry in enumerate(instancetype.spec.get(member) or []):
                if entry.get("deviceName") in gpu_names:
                    found.append(f"{where} spec.{member}[{index}] {entry['deviceName']}")
    return found


def network_refs(vmi: Obj) -> list[tuple[int, str, str]]:
    """(index in spec.networks, namespace, name) of the NetworkAttachmentDefinition each
    multus network names ("name" is in the VMI's namespace, "namespace/name" anywhere)."""
    namespace = str(meta(vmi).get("namespace", ""))
    found: list[tuple[int, str, str]] = []
    for index, network in enumerate((vmi.get("spec") or {}).get("networks") or []):
        target = str((network.get("multus") or {}).get("networkName") or "")
        if not target:
            continue
        ns, _slash, nad = target.rpartition("/")
        found.append((index, ns or namespace, nad))
    return found


def network_gpu_requests(
    vmi: Obj,
    resources: Mapping[tuple[str, str], str | None],
    gpu_names: frozenset[str] | set[str],
) -> list[str]:
    """Where a VMI's networks would add a GPU request to its launcher pod, as "<path>
    <NAD> <name>" descriptions. A NetworkAttachmentDefinition that could not be read is
    left to the gate, which keeps a pod whose requests exceed its claims gated."""
    found: list[str] = []
    for index, ns, nad in network_refs(vmi):
        resource = resources.get((ns, nad))
        if resource and resource in gpu_names:
            found.append(
                f"spec.networks[{index}] uses NetworkAttachmentDefinition {ns}/{nad}, whose "
                f"{keys.ANNOTATION_NAD_RESOURCE} is {resource}"
            )
    return found


def gpus_with(existing: Iterable[Obj], ours: Iterable[Mapping[str, str]]) -> list[dict[str, Any]]:
    """The VMI's gpus list: its own entries as they are, then this webhook's, replacing
    any entry with the reserved prefix (so calling it again changes nothing)."""
    return [dict(e) for e in existing if not is_ours(e)] + [dict(e) for e in ours]


def set_license(body: dict[str, Any], copy: str | None) -> None:
    """Give the VMI body the licence copy as a secret volume and a virtio disk with the
    fixed serial, replacing any volume or disk of the reserved name (so calling it again
    changes nothing); nothing without a copy."""
    if copy is None:
        return
    spec = body.setdefault("spec", {})
    name = keys.LICENSE_VOLUME_NAME
    volumes = [dict(v) for v in spec.get("volumes") or [] if v.get("name") != name]
    spec["volumes"] = [*volumes, {"name": name, "secret": {"secretName": copy}}]
    devices = spec.setdefault("domain", {}).setdefault("devices", {})
    disks = [dict(d) for d in devices.get("disks") or [] if d.get("name") != name]
    disk = {"name": name, "serial": keys.LICENSE_DISK_SERIAL, "disk": {"bus": "virtio"}}
    devices["disks"] = [*disks, disk]


def set_gpus(body: dict[str, Any], ours: Iterable[Mapping[str, str]]) -> None:
    """Write the gpus entries into a VMI body in place (kopf turns the change into the
    webhook's JSON patch). An attachment id the VMI carries is dropped: only an earlier
    release's webhook wrote one, and the binder reads it to tell which VMI an attachment of
    that release belongs to, so a VMI must not bring its own."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if keys.ANNOTATION_ATTACHMENT_ID in annotations:
        del annotations[keys.ANNOTATION_ATTACHMENT_ID]
    spec = body.setdefault("spec", {})
    domain = spec.setdefault("domain", {})
    devices = domain.setdefault("devices", {})
    devices["gpus"] = gpus_with(devices.get("gpus") or [], ours)
