"""The GPUClass webhook judges a class against the classes stored and writes nothing: a
review from anyone but the API server (a guest on the pod network) changes nothing. Two
classes created at the same moment through two replicas are both admitted (neither is
stored when the other is judged); the binder lets the older serve (test_view_classes)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handle_catalog import ClassWebhook
from cozystack_gpu.keys import AdmissionReason


class StoredClasses:
    """The API server as the webhook reads it: the classes stored, and no write call."""

    def __init__(self, *stored: dict[str, Any]) -> None:
        self.stored = {c["metadata"]["name"]: c for c in stored}

    def classes(self, *, latest: bool = False) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self.stored)


def gpu_class(name: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"source": {"devicePlugin": {"resourceName": "nvidia.com/GH100"}}}
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def test_a_class_sharing_a_stored_classs_name_on_overlapping_nodes_is_refused() -> None:
    api = StoredClasses(gpu_class("a"))
    with pytest.raises(Refused) as refused:
        ClassWebhook(api).admit(gpu_class("b"))  # type: ignore[arg-type]
    assert refused.value.reason == AdmissionReason.RESOURCE_NAME_SHARED.value
    assert "already served by GPUClass a" in refused.value.message


def test_classes_on_disjoint_nodes_pass_and_nothing_is_written() -> None:
    api = StoredClasses(gpu_class("a", {"pool": "x"}))
    before = copy.deepcopy(api.stored)
    ClassWebhook(api).admit(gpu_class("b", {"pool": "y"}))  # type: ignore[arg-type]
    assert api.stored == before
