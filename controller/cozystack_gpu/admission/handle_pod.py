"""The pod webhook's work: find the pod's VMI, its claims' classes, and what to add.

Only pods with the reference label reach it (the object selector); KubeVirt copies it from
the VMI onto the virt-launcher pod and the WaitForFirstConsumer temporary pod. The VMI and
its held claims are read from the API server: the VMI was created a moment ago, and a
watch-fed cache may not have it yet.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from cozystack_gpu import keys
from cozystack_gpu.admission import pod_rules
from cozystack_gpu.admission.access import ApiAccess
from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handle_vmi import vmi_claims_request
from cozystack_gpu.keys import AdmissionReason
from cozystack_gpu.objects import MutableObj
from cozystack_gpu.objects.translate import meta


class PodWebhook:
    def __init__(self, access: ApiAccess, pool: ThreadPoolExecutor) -> None:
        self.access = access
        self.pool = pool

    def admit(self, pod: MutableObj) -> pod_rules.PodChanges:
        # A live migration's target pod is gated as a launcher pod is (SPEC §12): the leader
        # places the set's target and pins it, so its GPU request never lands on units
        # another claim holds.
        namespace = str(meta(pod).get("namespace", ""))
        name = str(meta(pod).get("name") or meta(pod).get("generateName") or "")
        vmi_name = pod_rules.owner_vmi(pod)
        if vmi_name is None:
            raise Refused(
                f"pod {name} carries the label {keys.LABEL_CLAIMS_REF}="
                f"{keys.LABEL_CLAIMS_REF_VALUE}, which only KubeVirt's virt-launcher pods of "
                "VMIs with GPU claims may carry (the controller does not count their GPU "
                "requests as raw usage); remove the label",
                AdmissionReason.LABEL_ON_FOREIGN_POD,
            )
        vmi = self.access.vmi(namespace, vmi_name)
        if vmi is None:
            raise Refused(
                f"VirtualMachineInstance {vmi_name}, the owner of pod {name}, does not exist",
                AdmissionReason.OWNER_VMI_MISSING,
                404,
            )
        if not keys.uses_claims(meta(vmi).get("labels")):
            # virt-controller copies the VMI's labels: only a forged pod differs, and its
            # VMI was never judged by the VMI webhook.
            raise Refused(
                f"pod {name} carries the label {keys.LABEL_CLAIMS_REF}="
                f"{keys.LABEL_CLAIMS_REF_VALUE}, but its VirtualMachineInstance {vmi_name} "
                "does not, so it uses no claims; remove the label from the pod, or start the "
                "VM with the label and its claims",
                AdmissionReason.LABEL_ON_FOREIGN_POD,
                400,
            )
        request = vmi_claims_request(vmi)
        claims = [self.pool.submit(self.access.claim, namespace, c) for c in request.claims]
        classes = self.access.classes()
        names = {t.gpu_class for t in request.templates}
        for future in claims:
            claim = future.result()
            if claim is not None:
                names.add(str((claim.get("spec") or {}).get("class", "")))
        tolerations = pod_rules.class_tolerations(classes[n] for n in names if n in classes)
        return pod_rules.changes(pod, tolerations)
