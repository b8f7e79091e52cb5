"""The binder's cluster view: event ordering and tombstones."""

from __future__ import annotations

from typing import Any

import pytest

from cozystack_gpu import keys
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import translate
from cozystack_gpu_testkit.objects import binder_config


def _class(rv: int, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "h100", "resourceVersion": str(rv), **meta},
        "spec": {
            "mode": "passthrough",
            "source": {"devicePlugin": {"resourceName": "nvidia.com/X"}},
        },
    }


def _view() -> ClusterView:
    return ClusterView(binder_config("ctl"), keys.BINDER_WATCHES)


def test_an_older_event_never_replaces_a_newer_state() -> None:
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(7), deleted=False)
    view.apply(keys.GPU_CLASS.kind, _class(5, labels={"stale": "yes"}), deleted=False)
    assert view.gpu_class("h100") == _class(7)


def test_a_write_answered_before_the_deletion_cannot_bring_the_object_back() -> None:
    # The binder removes a finalizer; the DELETED event (rv 9) is seen before the patch's
    # answer (rv 8, the object as it was with its deletion timestamp).
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(7), deleted=False)
    view.apply(keys.GPU_CLASS.kind, _class(9), deleted=True)
    view.apply(
        keys.GPU_CLASS.kind, _class(8, deletionTimestamp="2026-11-30T10:00:00Z"), deleted=False
    )
    assert view.gpu_class("h100") is None
    assert view.class_info("h100") is None
    # A class created again under the same name is a new object, with a newer revision.
    view.apply(keys.GPU_CLASS.kind, _class(12), deleted=False)
    assert view.gpu_class("h100") == _class(12)


def _claim(
    name: str,
    *,
    node: str,
    count: int = 1,
    phase: str = "Attached",
    attached_to: str | None = None,
    template_of: str | None = None,
    rv: int = 10,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": "t", "resourceVersion": str(rv)}
    if template_of is not None:
        metadata["labels"] = {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE}
        metadata["ownerReferences"] = [
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": template_of}
        ]
    status: dict[str, Any] = {"phase": phase, "nodeName": node}
    if attached_to is not None:
        status["attachedTo"] = attached_to
    return {"metadata": metadata, "spec": {"class": "h100", "count": count}, "status": status}


def _launcher(
    vmi: str = "vm", units: int = 2, phase: str = "Running", rv: int = 2
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"virt-launcher-{vmi}",
            "namespace": "t",
            "resourceVersion": str(rv),
            "labels": {keys.LABEL_CLAIMS_REF: "true"},
            "creationTimestamp": "2026-12-01T10:00:01Z",
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": vmi,
                    "uid": f"u-{vmi}",
                }
            ],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/X": str(units)}}}],
        },
        "status": {"phase": phase},
    }


def _ns_usage(view: ClusterView) -> dict[str, int]:
    info = view.namespace_info("t")
    assert info is not None
    return dict(info.raw_used)


def test_a_running_launcher_pod_occupies_the_units_its_claims_no_longer_cover() -> None:
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(1), deleted=False)
    view.apply(keys.NODE.kind, {"metadata": {"name": "n1", "resourceVersion": "1"}}, deleted=False)
    view.apply(
        keys.NAMESPACE.kind, {"metadata": {"name": "t", "resourceVersion": "1"}}, deleted=False
    )
    vmi = {
        "metadata": {
            "name": "vm",
            "namespace": "t",
            "uid": "u-vm",
            "resourceVersion": "3",
            "labels": {keys.LABEL_CLAIMS_REF: "true"},
            "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["c"]}'},
        },
        "status": {"phase": "Running", "nodeName": "n1"},
    }
    view.apply(keys.VMI.kind, vmi, deleted=False)
    view.apply(
        keys.GPU_CLAIM.kind, _claim("c", node="n1", count=2, attached_to="vm"), deleted=False
    )
    view.apply(keys.POD.kind, _launcher(), deleted=False)
    assert _node_with_pod_usage(view) == {}, "its claim covers it"
    # The claim deleted by force (its finalizer stripped): the pod still uses both units.
    view.apply(keys.GPU_CLAIM.kind, _claim("c", node="n1", rv=11), deleted=True)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 2}
    assert _ns_usage(view) == {}, "occupied on the node, not charged to the tenant twice"
    # A claim of one unit attached there covers one; one moved elsewhere covers none.
    view.apply(keys.GPU_CLAIM.kind, _claim("d", node="n1", attached_to="vm", rv=12), deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 1}
    view.apply(keys.GPU_CLAIM.kind, _claim("d", node="n2", attached_to="vm", rv=13), deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 2}
    # The VMI's template claims cover it too.
    owned = _claim("vm-g", node="n1", count=2, phase="Bound", template_of="vm", rv=14)
    view.apply(keys.GPU_CLAIM.kind, owned, deleted=False)
    assert _node_with_pod_usage(view) == {}
    view.apply(
        keys.GPU_CLAIM.kind,
        {**owned, "metadata": {**owned["metadata"], "resourceVersion": "15"}},
        deleted=True,
    )
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 2}
    # Once the VMI is final the VM has stopped: its finishing pod holds nothing.
    stopped = {**vmi, "metadata": {**vmi["metadata"], "resourceVersion": "16"}}
    view.apply(keys.VMI.kind, {**stopped, "status": {"phase": "Succeeded"}}, deleted=False)
    assert _node_with_pod_usage(view) == {}
    assert _ns_usage(view) == {}
    # A final pod uses nothing.
    view.apply(keys.POD.kind, _launcher(phase="Succeeded", rv=20), deleted=False)
    assert _node_with_pod_usage(view) == {}


def _vmi(uid: str, phase: str, rv: int, created: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vm",
            "namespace": "t",
            "uid": uid,
            "resourceVersion": str(rv),
            "creationTimestamp": created,
            "labels": {keys.LABEL_CLAIMS_REF: "true"},
            "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": []}'},
        },
        "status": {"phase": phase, "nodeName": "n1"},
    }


def _launcher_of(uid: str, created: str, rv: int, name: str = "virt-launcher-vm") -> dict[str, Any]:
    pod = _launcher(units=1, rv=rv)
    pod["metadata"] = {**pod["metadata"], "name": name, "creationTimestamp": created}
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm", "uid": uid}
    ]
    return pod


def test_the_launcher_pod_of_an_ended_vmi_holds_nothing_when_the_next_of_its_name_runs() -> None:
    """A restart under the same name: the first VMI ends and goes while its launcher pod is
    still finishing, and the next VMI of that name runs with its claims elsewhere. The old
    pod belongs to the first VMI (its owner uid), not to the next: it holds nothing, and no
    flip of the next VMI's claims makes it hold again."""
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(1), deleted=False)
    view.apply(keys.NODE.kind, {"metadata": {"name": "n1", "resourceVersion": "1"}}, deleted=False)
    view.apply(keys.VMI.kind, _vmi("u1", "Running", 2, "2026-12-01T10:00:00Z"), deleted=False)
    view.apply(keys.POD.kind, _launcher_of("u1", "2026-12-01T10:00:01Z", 3), deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 1}, "no claim covers it: it holds"
    view.apply(keys.VMI.kind, _vmi("u1", "Succeeded", 4, "2026-12-01T10:00:00Z"), deleted=False)
    assert _node_with_pod_usage(view) == {}
    view.apply(keys.VMI.kind, _vmi("u1", "Succeeded", 5, "2026-12-01T10:00:00Z"), deleted=True)
    assert _node_with_pod_usage(view) == {}, "its VMI ended before it went"
    view.apply(keys.VMI.kind, _vmi("u2", "Running", 6, "2026-12-01T10:05:00Z"), deleted=False)
    assert _node_with_pod_usage(view) == {}, "the next VMI of that name is not the pod's"
    # A pod naming that VMI with another uid, made after it (no launcher of an earlier VMI
    # is): nothing of the VMI's covers it, and it holds all it asks.
    forged = _launcher_of("u9", "2026-12-01T10:06:00Z", 7, name="forged")
    view.apply(keys.POD.kind, forged, deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 1}


def test_a_pod_cannot_be_freed_by_naming_a_vmi_made_after_it() -> None:
    """A tenant makes a labelled pod owned by a VMI name that does not exist yet (it holds
    its units: no claim covers it), then a VMI of that name: the pod is older than the VMI,
    but no VMI it belongs to was ever seen to end, so it keeps holding what it asks. (After
    a leader change, a real earlier VMI's finishing pod is counted so too, until it goes:
    more held than is, never less.)"""
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(1), deleted=False)
    view.apply(keys.NODE.kind, {"metadata": {"name": "n1", "resourceVersion": "1"}}, deleted=False)
    view.apply(keys.POD.kind, _launcher_of("u1", "2026-12-01T10:00:01Z", 3), deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 1}, "a VMI it knows nothing of"
    view.apply(keys.VMI.kind, _vmi("u2", "Running", 6, "2026-12-01T10:05:00Z"), deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 1}


def _node_with_pod_usage(view: ClusterView) -> dict[str, int]:
    info = view.node_info("n1")
    assert info is not None
    return dict(info.raw_used)


def _claims_vmi(uid: str = "u-vm", rv: int = 3, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "vm",
            "namespace": "t",
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {keys.LABEL_CLAIMS_REF: "true"},
            "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["c"]}'},
        },
        "status": {"phase": phase, "nodeName": "n1"},
    }


def _tenant_view() -> ClusterView:
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(1), deleted=False)  # nvidia.com/X is a GPU name
    view.apply(keys.NODE.kind, {"metadata": {"name": "n1", "resourceVersion": "1"}}, deleted=False)
    view.apply(
        keys.NAMESPACE.kind, {"metadata": {"name": "t", "resourceVersion": "1"}}, deleted=False
    )
    return view


def _usage(view: ClusterView) -> tuple[dict[str, int], dict[str, int]]:
    return _node_with_pod_usage(view), _ns_usage(view)


def test_a_pod_is_covered_by_claims_only_as_the_launcher_of_a_live_vmi_with_claims() -> None:
    """The claims label and an owner reference are the pod's own words: a pod's GPU
    requests are its claims' only when the VMI it names exists with that uid, is not final
    and uses claims; until then (and for a VMI without claims) they are raw usage, on the
    node and in the namespace."""
    view = _tenant_view()
    view.apply(keys.POD.kind, _launcher(), deleted=False)
    raw = ({"nvidia.com/X": 2}, {"nvidia.com/X": 2})
    assert _usage(view) == raw, "no VMI of that uid is known: the label proves nothing"
    covering = _claim("c", node="n1", count=2, attached_to="vm")
    view.apply(keys.GPU_CLAIM.kind, covering, deleted=False)
    assert _usage(view) == raw, "a claim attached to the name does not cover a pod of no VMI"
    without = _claims_vmi(rv=3)
    del without["metadata"]["annotations"], without["metadata"]["labels"]
    view.apply(keys.VMI.kind, without, deleted=False)
    assert _usage(view) == raw, "a VMI without claims"
    view.apply(keys.VMI.kind, _claims_vmi(rv=4), deleted=False)
    assert _usage(view) == ({}, {}), "the one launcher pod of a live VMI with claims"
    view.apply(keys.VMI.kind, _claims_vmi(uid="u-other", rv=5), deleted=False)
    assert _usage(view) == raw, "the VMI of that name now has another uid"


def test_a_claims_label_on_a_raw_gpu_pod_does_not_hide_it() -> None:
    """A tenant allowed raw names labels its own GPU pod with the claims reference label,
    with no owner or with its owner reference cut: it is counted whole, on the node and in
    the namespace."""
    view = _tenant_view()
    view.apply(keys.VMI.kind, _claims_vmi(), deleted=False)
    covering = _claim("c", node="n1", count=2, attached_to="vm")
    view.apply(keys.GPU_CLAIM.kind, covering, deleted=False)
    pod = _launcher(rv=5)
    view.apply(keys.POD.kind, pod, deleted=False)
    assert _usage(view) == ({}, {})
    cut = {**pod, "metadata": {**pod["metadata"], "resourceVersion": "6", "ownerReferences": []}}
    view.apply(keys.POD.kind, cut, deleted=False)
    assert _usage(view) == ({"nvidia.com/X": 2}, {"nvidia.com/X": 2}), (
        "a labelled pod whose VMI owner was removed took 2 GPUs uncounted"
    )


def test_a_second_pod_of_a_claims_vmi_is_raw_usage() -> None:
    """A forged pod naming a running claims VMI by its uid, made after its launcher pod, is
    not covered by the same claims: it counts whole, and the launcher pod stays covered."""
    view = _tenant_view()
    view.apply(keys.VMI.kind, _claims_vmi(), deleted=False)
    covering = _claim("c", node="n1", count=2, attached_to="vm")
    view.apply(keys.GPU_CLAIM.kind, covering, deleted=False)
    view.apply(keys.POD.kind, _launcher(rv=5), deleted=False)
    forged = _launcher(rv=6)
    forged["metadata"] = {
        **forged["metadata"],
        "name": "forged",
        "creationTimestamp": "2026-12-01T10:00:09Z",
    }
    view.apply(keys.POD.kind, forged, deleted=False)
    assert _usage(view) == ({"nvidia.com/X": 2}, {"nvidia.com/X": 2}), (
        "a second pod of the VMI took 2 GPUs under the launcher's claims"
    )
    assert view.launcher_pod(("t", "vm"), "u-vm") == ("t", "virt-launcher-vm")
    # The launcher pod ends and goes: the forged one is the VMI's only pod now.
    view.apply(keys.POD.kind, _launcher(rv=7), deleted=True)
    assert view.launcher_pod(("t", "vm"), "u-vm") == ("t", "forged")


def test_a_pod_naming_an_ended_vmi_is_raw_usage() -> None:
    """The launcher pod a VMI had when it ended is finishing and holds nothing; a pod made
    afterwards naming that VMI's uid is counted whole, while the VMI is final and after it
    is gone."""
    view = _tenant_view()
    view.apply(keys.VMI.kind, _claims_vmi(), deleted=False)
    view.apply(keys.POD.kind, _launcher(units=0, rv=5), deleted=False)
    view.apply(keys.VMI.kind, _claims_vmi(rv=6, phase="Succeeded"), deleted=False)
    late = _launcher(rv=7)
    late["metadata"] = {**late["metadata"], "name": "late"}
    view.apply(keys.POD.kind, late, deleted=False)
    raw = ({"nvidia.com/X": 2}, {"nvidia.com/X": 2})
    assert _usage(view) == raw, "a pod naming a final VMI's uid took 2 GPUs uncounted"
    view.apply(keys.VMI.kind, _claims_vmi(rv=8, phase="Succeeded"), deleted=True)
    assert _usage(view) == raw, "a pod naming a deleted VMI's uid took 2 GPUs uncounted"


def test_a_name_the_agent_found_to_be_another_devices_is_no_gpu_name() -> None:
    """A GPU node advertises a ConnectX VF under nvidia.com/ beside its GPUs: the agent
    reports it in otherResourceNames, and it leaves the GPU names (seed 004)."""
    view = _view()
    gpu, nic = "nvidia.com/GH100", "nvidia.com/MT2910_Family_ConnectX-7_VF"
    node = {
        "metadata": {"name": "n1", "resourceVersion": "1"},
        "status": {"allocatable": {gpu: "8", nic: "16", "cpu": "64"}},
    }
    view.apply(keys.NODE.kind, node, deleted=False)
    gpunode: dict[str, Any] = {
        "metadata": {"name": "n1", "resourceVersion": "2"},
        "status": {"resourceNames": [gpu]},
    }
    view.apply(keys.GPU_NODE.kind, gpunode, deleted=False)
    assert view.gpu_names == {gpu, nic}, "not judged yet: a name under the prefix counts"
    judged = {
        "metadata": {"name": "n1", "resourceVersion": "3"},
        "status": {"resourceNames": [gpu], "otherResourceNames": [nic]},
    }
    view.apply(keys.GPU_NODE.kind, judged, deleted=False)
    assert view.gpu_names == {gpu}


def test_a_node_without_agent_that_advertises_an_nvidia_name_adds_a_gpu_name() -> None:
    """A GPU node without the layout label runs no agent and has no GPUNode, yet kubelet
    advertises its GPUs: every nvidia.com/ name it lists is a GPU name (so raw requests of
    it are refused under forbidden), unless an agent elsewhere found that name to be
    another device's (a NIC VF, seed 004)."""
    view = _view()
    gpu, nic = "nvidia.com/FOO", "nvidia.com/MT2910_Family_ConnectX-7_VF"
    bare = {
        "metadata": {"name": "bare", "resourceVersion": "1"},
        "status": {"allocatable": {gpu: "1", nic: "4", "cpu": "64"}},
    }
    view.apply(keys.NODE.kind, bare, deleted=False)
    assert gpu in view.gpu_names, f"a node without agent advertises {gpu}, no GPU name: raw use"
    assert nic in view.gpu_names, "not judged by any agent yet: a name under the prefix counts"
    agent_node = {
        "metadata": {"name": "n1", "resourceVersion": "2"},
        "status": {"allocatable": {nic: "16"}},
    }
    view.apply(keys.NODE.kind, agent_node, deleted=False)
    judged: dict[str, Any] = {
        "metadata": {"name": "n1", "resourceVersion": "3"},
        "status": {"resourceNames": [], "otherResourceNames": [nic]},
    }
    view.apply(keys.GPU_NODE.kind, judged, deleted=False)
    assert view.gpu_names == {gpu}, "an agent found the NIC VF's name to be no GPU's"
    view.apply(keys.GPU_NODE.kind, judged, deleted=True)
    assert view.gpu_names == {gpu, nic}, "nobody judges it any more"


def _local_pv(name: str, node: str, rv: int = 1) -> dict[str, Any]:
    term = {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]
    }
    return {
        "metadata": {"name": name, "resourceVersion": str(rv)},
        "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}},
    }


def test_a_stopped_vms_claim_carries_where_its_disks_are_and_follows_their_binding() -> None:
    view = _view()
    claim = {
        "metadata": {"name": "c", "namespace": "t", "resourceVersion": "1"},
        "spec": {"class": "h100", "count": 1},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }
    vm = {
        "metadata": {"name": "vm", "namespace": "t", "resourceVersion": "1"},
        "spec": {
            "template": {
                "metadata": {"annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["c"]}'}},
                "spec": {
                    "volumes": [
                        {"name": "root", "dataVolume": {"name": "root-dv"}},
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "cloudinit", "cloudInitNoCloud": {}},
                    ]
                },
            }
        },
    }
    pvc = {"metadata": {"name": "root-dv", "namespace": "t", "resourceVersion": "1"}, "spec": {}}
    view.apply(keys.GPU_CLAIM.kind, claim, deleted=False)
    view.apply(keys.VM.kind, vm, deleted=False)
    view.apply(keys.PVC.kind, pvc, deleted=False)
    view.apply(keys.PV.kind, _local_pv("pv-1", "n1"), deleted=False)
    key = ClaimKey("t", "c")
    info = view.claim_info(key, 0.0)
    assert info is not None and info.volumes == ()
    view.take_dirty()
    # The DataVolume's PVC binds to a local PV on n1: the claim is read again, with it.
    bound = {**pvc, "metadata": {**pvc["metadata"], "resourceVersion": "2"}}
    bound["spec"] = {"volumeName": "pv-1"}
    view.apply(keys.PVC.kind, bound, deleted=False)
    assert key in view.take_dirty().claims
    info = view.claim_info(key, 0.0)
    assert info is not None and [v.volume for v in info.volumes] == ["pv-1"]
    assert info.volumes[0].admits("n1", {"kubernetes.io/hostname": "n1"})
    # The PV's affinity changes: read again; the PV goes: the claim has no disk left.
    view.apply(keys.PV.kind, _local_pv("pv-1", "n2", rv=2), deleted=False)
    assert key in view.take_dirty().claims
    view.apply(keys.PV.kind, _local_pv("pv-1", "n2", rv=3), deleted=True)
    assert key in view.take_dirty().claims
    info = view.claim_info(key, 0.0)
    assert info is not None and info.volumes == ()


def test_what_is_judged_from_node_labels_is_judged_again_only_when_they_change() -> None:
    view = _view()

    def node(rv: int, labels: dict[str, str], ready: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "n1", "resourceVersion": str(rv), "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }

    view.apply(keys.NODE.kind, node(1, {"zone": "a"}, "True"), deleted=False)
    added = view.node_labels_version
    view.apply(keys.NODE.kind, node(2, {"zone": "a"}, "False"), deleted=False)
    assert view.node_labels_version == added  # a heartbeat or a Ready change: labels stay
    view.apply(keys.NODE.kind, node(3, {"zone": "b"}, "False"), deleted=False)
    assert view.node_labels_version > added
    relabelled = view.node_labels_version
    view.apply(keys.NODE.kind, node(4, {"zone": "b"}, "False"), deleted=True)
    assert view.node_labels_version > relabelled


@pytest.mark.parametrize("annotation", ["", " ", "{}", '{"claims": []}', '{"claims": ["c"]}', "x"])
def test_a_vmi_uses_claims_only_with_the_reference_label(annotation: str) -> None:
    """One definition (keys.uses_claims), as the policies and webhooks read it: whatever the
    annotation says, an unlabelled VMI's launcher pod takes its GPUs as raw usage."""
    vmi = {"metadata": {"name": "vm", "namespace": "t", "annotations": {
        keys.ANNOTATION_CLAIMS: annotation}}}  # fmt: skip
    assert not translate.vmi_state(vmi).uses_claims
    labelled = {"metadata": {**vmi["metadata"], "labels": {keys.LABEL_CLAIMS_REF: "true"}}}
    assert translate.vmi_state(labelled).uses_claims
    for value in ("True", "yes", ""):
        other = {"metadata": {**vmi["metadata"], "labels": {keys.LABEL_CLAIMS_REF: value}}}
        assert not translate.vmi_state(other).uses_claims


def _order(name: str, rv: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "t", "resourceVersion": str(rv)},
        "spec": {"class": "h100", "count": 1},
    }


def test_a_listing_older_than_what_the_view_holds_deletes_none_of_the_newer() -> None:
    # The fault suite's etcd restart: the new leader's own claim listing brought order
    # o00173 (rv 619); the informer's listing, made at rv 618 before the order existed,
    # arrived next and deleted it, and its tombstone then refused the watch's ADDED at 619:
    # the order stayed unjudged for good.
    view = _view()
    kind = keys.GPU_CLAIM.kind
    view.relist(kind, [_order("old", 600)], version=610)
    view.relist(kind, [_order("old", 600), _order("o00173", 619)], version=619)
    view.relist(kind, [_order("old", 600)], version=618)  # the informer's, made earlier
    assert view.claim(ClaimKey("t", "o00173")) is not None, "a listing made before it"
    view.apply(kind, _order("o00173", 619), deleted=False)  # the watch's ADDED
    assert view.claim(ClaimKey("t", "o00173")) is not None
    # A listing made after it that lacks it: it was deleted.
    view.relist(kind, [_order("old", 600)], version=700)
    assert view.claim(ClaimKey("t", "o00173")) is None
    view.apply(kind, _order("o00173", 619), deleted=False)  # a late echo of its creation
    assert view.claim(ClaimKey("t", "o00173")) is None
