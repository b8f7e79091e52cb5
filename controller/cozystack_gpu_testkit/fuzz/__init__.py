"""The start path's lifecycle fuzz (issue 18, "the proof"): seeded random sequences of what
tenants, KubeVirt, nodes and crashes do to VMs that hold GPUs, on the real API server.

One run is one seed on a control plane of its own (``fault_suite.Run``: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager's garbage collector, two replicas
of ``python -m cozystack_gpu`` under ``rawResourceNames: forbidden``), with the chart's
webhook configurations and its ValidatingAdmissionPolicies installed, and GPU nodes with
GPUNodes. Each step is one random operation, drawn from the seed:

- tenants (impersonated tenant admins): order claims; create VMs with held claims and/or
  claim templates; stop, start, restart and delete them; delete claims; try to strip a
  claim's finalizers (delete, then a JSON patch removing ``metadata.finalizers``);
  pre-create a claim named like a VM's template claim with a bigger count; create VMs
  whose claims annotation is odd (empty, whitespace, ``{}``, no claims, malformed, label
  without annotation, annotation without label) with raw GPU entries; cut a running VM's
  template claim from its VMI (owner references removed, a second owner added, the
  template label or the VMI-uid annotation removed); make a pod of their own that forges a
  running VMI's launcher pod (its label, its owner reference, a GPU request); create VMs
  with a claim template and a multus network whose NetworkAttachmentDefinition names the
  GPU resource (KubeVirt then asks a unit more in the launcher pod); take the claims gate
  off a launcher pod of their own (``FORGED_ADMITTED`` if the API server lets them); give
  a VM a preempting priority class; write a claims annotation beyond the limits; order
  under names at the edges of what the API server accepts (253 characters, long names
  that agree up to a usage record's name limit, dots, a trailing newline); cut a usage
  record loose from its claim;
- nodes: NotReady and back, cordoned and back, short of memory (the scheduler refuses the
  launcher pod for a non-GPU resource) or of one GPU (kubelet reports fewer), and back;
- the controller: the leader SIGKILLed and started again (the webhooks' Service then
  routes to the replica left, as a Service with two endpoints would).

KubeVirt is its own virt-controller and virt-api (``kubevirt.stand_in.RealKubeVirt``;
``kubevirt.start``: v1.8.2 built from source; virt-controller as
``system:serviceaccount:kubevirt:kubevirt-controller``, the user the chart's raw-name
policy, rendered here, exempts): virt-controller makes each VM's VMI (named after it, owned
by it, with its template's labels and annotations), renders the VMI's launcher pod, fails
a VMI whose pod went and replaces a VMI that ended while its VM should run, with
KubeVirt's own start backoff; virt-api's webhooks default and judge each VM and VMI. The
kit plays, once per step, only what no real component runs here (``kubevirt``'s helpers):
kubelet (a bound launcher pod running, a deleted one removed) and virt-handler (its node's
labels and devices, a VMI virt-controller handed over reported Running on the pod's node,
with its phase transitions; a deleted VMI's guest shut down; a guest powering itself off).
All of it sits behind ``stage.KubeVirt``, the small interface the driver sees.

``invariants.Invariants`` (its start-path rules included) looks throughout
(``watching``) and once the run has settled; the driver adds what only it can see
(``invariants.driver_looks`` and the rule names there: ``RAW_ADMITTED``: a VMI
virt-controller made from an odd-annotation VM, or its launcher pod, admitted with raw GPU
entries under ``forbidden``; ``STRANDED``: a started VM whose pinned pod a Ready,
schedulable node refused, left as it is; ``FORGED_ADMITTED``: a tenant's own pod
requesting a GPU admitted under ``forbidden``; ``SURPLUS``: a launcher pod ungated while it
asks more GPU units than its VMI's claims hold; ``ORPHANED``, once settled: a template
claim whose VMI, by the uid it was made for, is gone). Every operation, what KubeVirt did
and what the kit played, with its outcome, is logged with the seed, so a violation comes
with the operations that touched its subject.

The package: ``driver`` (``LifecycleFuzz``: the run loop, its looks, the findings),
``setup`` (admission in force and who acts, before the first operation), ``stage`` (what
the operations act on, and the helpers they share), ``operations`` (one function per
operation, by what it touches), ``journal`` (every step with its outcome), ``settings``
(``FuzzSettings``, ``FuzzResult``).
"""

from cozystack_gpu_testkit.fuzz.driver import LifecycleFuzz, run_seed
from cozystack_gpu_testkit.fuzz.settings import FuzzResult, FuzzSettings
from cozystack_gpu_testkit.fuzz.setup import Admission

__all__ = ["Admission", "FuzzResult", "FuzzSettings", "LifecycleFuzz", "run_seed"]
