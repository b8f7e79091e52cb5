"""The VMI webhook's work: read, judge (``vmi_rules``), write the attachments.

For a VMI naming claims, every read goes to the API server in parallel (the claims, the
classes, the settings, the namespace for the vGPU entitlement, the instance type, and for
a licensed class the namespace's licence copy and the hoster's token Secret), the rules
judge, and unless it is a dry run each held claim not yet attached to this VMI gets
``status.attachedTo``/``attachedAt`` (with the resourceVersion read, so a concurrent start
of another VMI gets 409 and this one is judged again) and the claim-protection finalizer.
The finalizer is the binder's too; written here it closes the window before the binder
sees the attachment, in which a deleted claim would vanish from under a starting VM.

When one claim cannot be held, the attachments written in this call are taken back before
the refusal, so a refused start does not block the claims for the attachment grace.
Nothing here creates a claim or waits for one.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.admission import vmi_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.objects import MutableObj, annotation
from cozystack_gpu.objects.patches import ATTACHMENT_CLEARED, attachment, finalizer_patch
from cozystack_gpu.objects.translate import meta, rfc3339

log = logging.getLogger(__name__)

Claim = Mapping[str, Any]
ATTEMPTS = 3  # writes that lose a race are judged again this often
# A write that lost a race: 409 (resourceVersion) or 422 (a JSON patch test failed).
LOST_RACE = frozenset({409, 422})
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


class _LostRace(Exception):
    """An attachment write found the claim changed since it was read."""


@dataclass(frozen=True)
class Admitted:
    """What an admitted VMI must carry: one gpus entry per unit, and the attachment id its
    held claims were attached with ("" on a dry run or without held claims)."""

    gpus: list[dict[str, str]]
    attachment_id: str
    license_copy: str | None = None


class VMIWebhook:
    """Judges and records the start of one VMI per call."""

    def __init__(
        self,
        access: ApiAccess,
        pool: ThreadPoolExecutor,
        largest_node: Callable[[str], int | None],
        clock: Callable[[], float],
        gpu_names: Callable[[], frozenset[str] | None],
    ) -> None:
        self.access = access
        self.pool = pool
        self.largest_node = largest_node
        self.clock = clock
        self.gpu_names = gpu_names

    def admit(self, vmi: MutableObj, *, dry_run: bool) -> Admitted:
        """The gpus entries (and attachment id) the VMI must carry; ``Refused`` when it
        may not start.

        The whole set is read and judged again after a write that lost a race (another VMI
        took a claim, the binder moved one): a set that changed meanwhile is judged as it
        is now, co-location and classes included, never admitted on what was read before.
        """
        name = str(meta(vmi).get("name", ""))
        namespace = str(meta(vmi).get("namespace", ""))
        request = vmi_claims_request(vmi)
        # GPU names and node sizes come from this replica's view (SPEC.md §6): before its
        # first listing it cannot judge the start, and says so retryably rather than
        # judging with less (virt-controller creates the VMI again).
        names = self.gpu_names()
        if names is None:
            raise Refused(VMI_NOT_SYNCED, AdmissionReason.REPLICA_NOT_SYNCED, 503)
        carried = vmi_rules.attachment_id_of(vmi)
        for attempt in range(ATTEMPTS):
            facts = self._read(vmi, namespace, name, request, carried, names)
            # An id this admission wrote before (a reinvocation) is kept; any other start
            # gets a new one, so no earlier VMI of this name can pass for this one.
            ours = any(
                vmi_rules.is_reinvocation(c, name, carried)
                for c in facts.claims.values()
                if c is not None
            )
            attachment_id = carried if ours else uuid.uuid4().hex
            decision = vmi_rules.judge(vmi, request, facts, attachment_id)
            if isinstance(decision, vmi_rules.Refusal):
                raise Refused(decision.message, decision.reason, 409 if attempt else 403)
            if dry_run:
                return Admitted(list(decision.gpus), "", decision.license_copy)
            held = {c: facts.claims[c] for c in request.claims}
            try:
                self._hold(namespace, name, held, decision.attach, attachment_id)
            except _LostRace:
                continue
            return Admitted(
                list(decision.gpus),
                attachment_id if request.claims else "",
                decision.license_copy,
            )
        raise Refused(
            f"the GPUClaims of VirtualMachineInstance {name} kept changing while it was "
            f"admitted ({ATTEMPTS} tries); try again",
            AdmissionReason.ATTACHMENT_RACE_LOST,
            409,
        )

    # --- reads -----------------------------------------------------------------------

    def _read(
        self,
        vmi: MutableObj,
        namespace: str,
        name: str,
        request: annotation.ClaimsRequest,
        attachment_id: str,
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
        if vmi_rules.needs_same_name_check(read.values(), name, attachment_id):
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
        )

    # --- writes ----------------------------------------------------------------------

    def _hold(
        self,
        namespace: str,
        vmi_name: str,
        held: Mapping[str, Claim | None],
        attach: tuple[str, ...],
        attachment_id: str,
    ) -> None:
        """Attach every claim in ``attach`` and put the finalizer on every held claim, all
        writes at once; on any failure take back the attachments this call wrote. A lost
        race raises ``_LostRace`` for the caller to judge the set again."""
        attaching = {
            c: self.pool.submit(self._attach, namespace, vmi_name, c, obj, attachment_id)
            for c, obj in held.items()
            if obj is not None and c in attach
        }
        protecting = [
            self.pool.submit(self._protect, namespace, vmi_name, c, obj)
            for c, obj in held.items()
            if obj is not None
        ]
        written: dict[str, Claim] = {}
        failure: BaseException | None = None
        for claim_name, future in attaching.items():
            try:
                written[claim_name] = future.result()
            except BaseException as exc:  # every future is collected before the rollback
                failure = failure or exc
        for protected in protecting:
            try:
                protected.result()
            except BaseException as exc:
                failure = failure or exc
        if failure is None:
            return
        for claim_name in written:
            self._release(namespace, vmi_name, claim_name, attachment_id)
        raise failure

    def _attach(
        self, namespace: str, vmi_name: str, claim_name: str, obj: Claim, attachment_id: str
    ) -> Claim:
        """Write the attachment if the claim's status is still what was judged (a JSON patch
        ``test`` of the whole status, so the finalizer can be written beside it at the same
        time). Any earlier attachment of this name (an earlier VMI of the VM) is replaced,
        its recorded uid with it; a claim changed meanwhile raises ``_LostRace``."""
        status = dict(obj.get("status") or {})
        fields = attachment(vmi_name, attachment_id=attachment_id, at=rfc3339(self.clock()))
        ops: list[MutableObj] = [{"op": "test", "path": "/status", "value": status}]
        for field, value in fields.items():
            if value is not None:
                ops.append({"op": "add", "path": f"/status/{field}", "value": value})
            elif field in status:
                ops.append({"op": "remove", "path": f"/status/{field}"})
        if not status:
            # A claim no controller has written yet has no status object to test or add to.
            ops = [
                {"op": "test", "path": "/metadata/uid", "value": meta(obj).get("uid")},
                {
                    "op": "add",
                    "path": "/status",
                    "value": {k: v for k, v in fields.items() if v is not None},
                },
            ]
        try:
            return self.access.claim_status(namespace, claim_name, ops)
        except ApiException as exc:
            if exc.status in LOST_RACE:
                raise _LostRace(claim_name) from None
            raise

    def _protect(self, namespace: str, vmi_name: str, claim_name: str, obj: Claim) -> None:
        """Add the claim-protection finalizer unless the claim has it.

        The first try tests the finalizer list as read (or the uid, when there is none)
        instead of the resourceVersion, for the same reason as ``_attach``.
        """
        current = list(meta(obj).get("finalizers") or [])
        if keys.FINALIZER_CLAIM in current:
            return
        ops: list[MutableObj]
        if current:
            ops = [
                {"op": "test", "path": "/metadata/finalizers", "value": current},
                {"op": "add", "path": "/metadata/finalizers/-", "value": keys.FINALIZER_CLAIM},
            ]
        else:
            ops = [
                {"op": "test", "path": "/metadata/uid", "value": meta(obj).get("uid")},
                {"op": "add", "path": "/metadata/finalizers", "value": [keys.FINALIZER_CLAIM]},
            ]
        try:
            self.access.claim_meta(namespace, claim_name, ops)
            return
        except ApiException as exc:
            if exc.status not in LOST_RACE:
                raise
        for attempt in range(ATTEMPTS):
            obj = self._reread(namespace, vmi_name, claim_name)
            patch = finalizer_patch(obj, keys.FINALIZER_CLAIM, True)
            if patch is None:
                return
            try:
                self.access.claim_meta(namespace, claim_name, patch)
                return
            except ApiException as exc:
                if exc.status not in LOST_RACE or attempt == ATTEMPTS - 1:
                    raise

    def _reread(self, namespace: str, vmi_name: str, claim_name: str) -> Claim:
        """The claim after a finalizer write lost a race, if it may still be held by this
        VMI."""
        obj = self.access.claim(namespace, claim_name)
        refusal = vmi_rules.held_claim_refusal(claim_name, obj, namespace, vmi_name)
        if refusal is not None:
            raise Refused(refusal.message, AdmissionReason.ATTACHMENT_RACE_LOST, 409)
        assert obj is not None
        return obj

    def _release(self, namespace: str, vmi_name: str, claim_name: str, attachment_id: str) -> None:
        """Take back an attachment this call wrote, if it is still this admission's."""
        try:
            for _attempt in range(ATTEMPTS):
                obj = self.access.claim(namespace, claim_name)
                status = (obj or {}).get("status") or {}
                if obj is None or status.get("attachmentID") != attachment_id:
                    return
                body = {
                    "metadata": {"resourceVersion": meta(obj).get("resourceVersion")},
                    "status": dict(ATTACHMENT_CLEARED),
                }
                try:
                    self.access.claim_status(namespace, claim_name, body)
                    return
                except ApiException as exc:
                    if exc.status != 409:
                        raise
        except ApiException as exc:
            # The binder clears an attachment whose VMI never appears, after the grace.
            log.warning(
                "could not take back the attachment of %s/%s: %s", namespace, claim_name, exc
            )
