"""The binder's cluster view: event ordering and tombstones."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.view import ClusterView
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
