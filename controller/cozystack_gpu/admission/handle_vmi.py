"""The VMI webhook's work: read, judge (``vmi_rules``), answer with the VMI's GPU entries.

For a VMI naming claims, every read goes to the API server in parallel (the claims, the
classes, the settings, the namespace for the vGPU entitlement, the instance type, and for
a licensed class the namespace's licence copy and the hoster's token Secret), the rules
judge, and the answer says what the VMI must carry. Nothing is written: the binder attaches
the held claims once it sees the VMI stored (SPEC §7), so a review that did not come from
the API server (anything on the pod network can post one) changes nothing in the cluster,
and its answer goes only to whoever sent it. Two VMIs admitted for one claim before either
is attached are the binder's to tell apart: one gets the claim, the other waits at the gate
and says why. Nothing here creates a claim or waits for one.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from cozystack_gpu import keys
from cozystack_gpu.admission import vmi_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.objects import MutableObj, annotation
from cozystack_gpu.objects.translate import meta

VMI_NOT_SYNCED = (
    "this controller replica is starting and has not finished reading the cluster, so it "
    "cannot check the VM's GPUs yet; try again in a few seconds (virt-controller does)"
)


def label_without_annotation(kind: str, name: str) -> str:
    return (
        f"{kind} {name} carries the label {keys.LABEL_CLAIMS_REF}="
        f"{keys.LABEL_CLAIMS_REF_VALUE} but no {keys.ANNOTATION_CLAIMS} annotation naming its "
        "GPU claims; add the annotation, or remove the label"
    )


def vmi_claims_request(vmi: MutableObj) -> annotation.ClaimsRequest:
    """What a labelled VMI's claims annotation asks for, or the refusal both the VMI and
    the pod webhook give when it has none or it cannot be read."""
    name = str(meta(vmi).get("name", ""))
    raw = (meta(vmi).get("annotations") or {}).get(keys.ANNOTATION_CLAIMS)
    if raw is None:
        raise Refused(
            label_without_annotation("VirtualMachineInstance", name),
            AdmissionReason.LABEL_WITHOUT_ANNOTATION,
            400,
        )
    try:
        return annotation.parse(str(raw))
    except annotation.AnnotationError as exc:
        raise Refused(str(exc), AdmissionReason.MALFORMED_ANNOTATION, 400) from None


def admit_vm_template(vm: MutableObj) -> None:
    """A VirtualMachine whose template uses claims, refused (``Refused``) at create or
    update when its VMIs would be: an annotation that cannot be read (malformed, ``{}``, a
    name shaped ``namespace/name``: claims are named in the VM's own namespace) gets the VMI
    webhook's own message now, not a VMI refused at each start and a VM that says so only in
    its status. The claims-label policy already refuses the label and the annotation apart;
    what they name is judged when the VMI starts."""
    template = (vm.get("spec") or {}).get("template") or {}
    metadata = template.get("metadata") or {}
    if not keys.uses_claims(metadata.get("labels")):
        return
    raw = (metadata.get("annotations") or {}).get(keys.ANNOTATION_CLAIMS)
    if raw is None:
        return  # the claims-label policy refuses it, with its own message
    try:
        annotation.parse(str(raw))
    except annotation.AnnotationError as exc:
        name = str(meta(vm).get("name", ""))
        raise Refused(
            f"VirtualMachine {name} (spec.template): {exc}",
            AdmissionReason.MALFORMED_ANNOTATION,
            400,
        ) from None


def instancetype_ref(vmi: MutableObj) -> tuple[keys.ApiKind, str] | None:
    """The instance type KubeVirt says the VMI was made from, if any."""
    annotations = meta(vmi).get("annotations") or {}
    if annotations.get(keys.ANNOTATION_INSTANCETYPE):
        return keys.INSTANCETYPE, str(annotations[keys.ANNOTATION_INSTANCETYPE])
    if annotations.get(keys.ANNOTATION_CLUSTER_INSTANCETYPE):
        return keys.CLUSTER_INSTANCETYPE, str(annotations[keys.ANNOTATION_CLUSTER_INSTANCETYPE])
    return None


@dataclass(frozen=True)
class Admitted:
    """What an admitted VMI must carry: one gpus entry per unit, and the licence copy's
    volume for a licensed vGPU class."""

    gpus: list[dict[str, str]]
    license_copy: str | None = None
    resource_claims: list[dict[str, str]] = field(default_factory=list)


class VMIWebhook:
    """Judges the start of one VMI per call; writes nothing."""

    def __init__(
        self,
        access: ApiAccess,
        pool: ThreadPoolExecutor,
        largest_node: Callable[[str], int | None],
        gpu_names: Callable[[], frozenset[str] | None],
    ) -> None:
        self.access = access
        self.pool = pool
        self.largest_node = largest_node
        self.gpu_names = gpu_names

    def admit(self, vmi: MutableObj) -> Admitted:
        """The gpus entries the VMI must carry; ``Refused`` when it may not start. The
        same answer on a dry run: nothing is written either way."""
        name = str(meta(vmi).get("name", ""))
        namespace = str(meta(vmi).get("namespace", ""))
        request = vmi_claims_request(vmi)
        # GPU names and node sizes come from this replica's view (SPEC.md §6): before its
        # first listing it cannot judge the start, and says so retryably rather than
        # judging with less (virt-controller creates the VMI again).
        names = self.gpu_names()
        if names is None:
            raise Refused(VMI_NOT_SYNCED, AdmissionReason.REPLICA_NOT_SYNCED, 503)
        facts = self._read(vmi, namespace, name, request, names)
        decision = vmi_rules.judge(vmi, request, facts)
        if isinstance(decision, vmi_rules.Refusal):
            raise Refused(decision.message, decision.reason, 403)
        return Admitted(list(decision.gpus), decision.license_copy, list(decision.resource_claims))

    # --- reads -----------------------------------------------------------------------

    def _read(
        self,
        vmi: MutableObj,
        namespace: str,
        name: str,
        request: annotation.ClaimsRequest,
        names: frozenset[str],
    ) -> vmi_rules.VMIFacts:
        access, submit = self.access, self.pool.submit
        claims = {c: submit(access.claim, namespace, c) for c in request.claims}
        classes = submit(access.classes)
        # The GPU name set (``names``) changes with classes and inventories, not with
        # claims: this replica's synced view has it (the leader publishes the same set in
        # the settings ConfigMap), which saves a request.
        labels: Future[dict[str, str]] | None = None
        if request.templates:
            labels = submit(access.namespace_labels, namespace)
        ref = instancetype_ref(vmi)
        itype: Future[MutableObj | None] | None = None
        if ref is not None:
            itype = submit(access.get, ref[0], namespace, ref[1])
        instancetype = None
        if ref is not None and itype is not None:
            spec = itype.result()
            if spec is None:
                which = (
                    keys.ANNOTATION_INSTANCETYPE
                    if ref[0].namespaced
                    else keys.ANNOTATION_CLUSTER_INSTANCETYPE
                )
                raise Refused(
                    f"{ref[0].kind} {ref[1]}, named by the VMI's {which} annotation, does not "
                    "exist, so its GPU entries cannot be checked",
                    AdmissionReason.INSTANCETYPE_MISSING,
                )
            instancetype = vmi_rules.InstanceType(ref[0].kind, ref[1], spec.get("spec") or {})
        read = {c: f.result() for c, f in claims.items()}
        # A held claim not there yet may be a window's, made at its reservation's start.
        missing = [c for c, obj in read.items() if obj is None]
        booked = {c: submit(access.get, keys.GPU_RESERVATION, namespace, c) for c in missing}
        known = classes.result()
        # A licensed class's copy, and the labels that say why one is missing: only for a
        # set of a licensed vGPU class.
        wanted = {str((c.get("spec") or {}).get("class", "")) for c in read.values() if c}
        wanted |= {entry.gpu_class for entry in request.templates}
        licensed = vmi_rules.licensed_classes(wanted, known)
        # The copy, and the hoster's Secret it must match: a Secret of the copy's name may
        # be a tenant's own, labels and all.
        copies = {n: submit(access.secret, namespace, keys.license_copy_name(n)) for n in licensed}
        sources = {
            n: submit(access.secret, access.settings_namespace, source)
            for n in licensed
            if (source := vmi_rules.license_secret_name(known[n]))
        }
        if licensed and labels is None:
            labels = submit(access.namespace_labels, namespace)
        networks = {
            (ns, nad): submit(access.nad_resource, ns, nad)
            for _index, ns, nad in vmi_rules.network_refs(vmi)
        }
        same_name = None
        if vmi_rules.needs_same_name_check(read.values(), name):
            same_name = access.vmi(namespace, name)
        return vmi_rules.VMIFacts(
            claims=read,
            same_name_vmi=same_name,
            classes=known,
            license_copies={n: f.result() for n, f in copies.items()},
            license_sources={n: f.result() for n, f in sources.items()},
            settings_names=names,
            namespace_labels=labels.result() if labels is not None else {},
            instancetype=instancetype,
            largest_node=self.largest_node,
            network_resources={ref: f.result() for ref, f in networks.items()},
            reservations={c: f.result() for c, f in booked.items()},
        )
