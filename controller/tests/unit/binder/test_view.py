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
