"""The volumes a VM's disks live on, as they limit where its claims may go: PVC names of
VMs and pods, a PVC's PV and StorageClass, a PV's node affinity."""

from __future__ import annotations

from cozystack_gpu.model import NodeRequirement, VolumeAffinity
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import name_of


def vm_volume_claims(vm: Obj) -> tuple[str, ...]:
    """PVC names of a VirtualMachine's volumes: ``persistentVolumeClaim.claimName``, and
    ``dataVolume.name`` (a DataVolume makes a PVC of its own name)."""
    spec = ((vm.get("spec") or {}).get("template") or {}).get("spec") or {}
    names: list[str] = []
    for volume in spec.get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        data = (volume.get("dataVolume") or {}).get("name")
        for name in (claim, data):
            if name and str(name) not in names:
                names.append(str(name))
    return tuple(names)


def pod_volume_claims(pod: Obj) -> tuple[str, ...]:
    """PVC names of a pod's volumes (KubeVirt renders DataVolumes as their PVCs)."""
    return tuple(
        str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if (v.get("persistentVolumeClaim") or {}).get("claimName")
    )


def pvc_volume_name(pvc: Obj) -> str | None:
    """The PV a PVC is bound to (``spec.volumeName``, set by the binding), or None."""
    return (pvc.get("spec") or {}).get("volumeName") or None


def binds_at_first_consumer(storage_class: Obj | None) -> bool:
    """An unbound PVC whose StorageClass binds WaitForFirstConsumer: the scheduler binds it
    where its first pod goes, so it limits nothing before."""
    return (storage_class or {}).get("volumeBindingMode") == "WaitForFirstConsumer"


def pvc_storage_class(pvc: Obj) -> str:
    return str((pvc.get("spec") or {}).get("storageClassName") or "")


def volume_affinity(pv: Obj) -> VolumeAffinity | None:
    """A PV's required node affinity (local and topology-bound volumes have one), or None
    when it may be used from any node."""
    required = ((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}
    terms = []
    for term in required.get("nodeSelectorTerms") or []:
        requirements = [
            NodeRequirement(
                str(e.get("key", "")),
                str(e.get("operator", "")),
                tuple(str(v) for v in e.get("values") or []),
            )
            for e in term.get("matchExpressions") or []
        ]
        for field in term.get("matchFields") or []:
            if field.get("key") != "metadata.name":
                # No other field can be matched: the term matches no node.
                requirements.append(NodeRequirement("", "In", (), True))
                continue
            requirements.append(
                NodeRequirement(
                    "",
                    str(field.get("operator", "")),
                    tuple(str(v) for v in field.get("values") or []),
                    True,
                )
            )
        if not requirements:
            # An empty term matches no node (as kube-scheduler reads it).
            requirements.append(NodeRequirement("", "In", (), True))
        terms.append(tuple(requirements))
    if not terms:
        return None
    return VolumeAffinity(name_of(pv), tuple(terms))
