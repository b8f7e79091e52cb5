"""The binder's cluster view: event ordering and tombstones."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.view import ClusterView
from cozystack_gpu.model import ClaimKey
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


def _node_with_pod_usage(view: ClusterView) -> dict[str, int]:
    info = view.node_info("n1")
    assert info is not None
    return dict(info.raw_used)


def test_a_labelled_pod_counts_as_raw_usage_unless_its_vmi_uses_claims() -> None:
    view = _view()
    view.apply(keys.GPU_CLASS.kind, _class(1), deleted=False)  # nvidia.com/X is a GPU name
    view.apply(keys.NODE.kind, {"metadata": {"name": "n1", "resourceVersion": "1"}}, deleted=False)
    pod = {
        "metadata": {
            "name": "p",
            "namespace": "t",
            "resourceVersion": "2",
            "labels": {keys.LABEL_CLAIMS_REF: "true"},
            "ownerReferences": [
                {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "vm"}
            ],
        },
        "spec": {
            "nodeName": "n1",
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/X": "2"}}}],
        },
    }
    view.apply(keys.POD.kind, pod, deleted=False)
    assert _node_with_pod_usage(view) == {}, "its VMI is not seen yet: the label is believed"
    vmi = {"metadata": {"name": "vm", "namespace": "t", "resourceVersion": "3"}}
    view.apply(keys.VMI.kind, vmi, deleted=False)
    assert _node_with_pod_usage(view) == {"nvidia.com/X": 2}, "a VMI without claims"
    with_claims = {
        "metadata": {
            **vmi["metadata"],
            "resourceVersion": "4",
            "annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["c"]}'},
        }
    }
    view.apply(keys.VMI.kind, with_claims, deleted=False)
    assert _node_with_pod_usage(view) == {}, "its units are its claims'"


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
