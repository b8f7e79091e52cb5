"""Two GPUClasses sharing a resource name on overlapping nodes, admitted at the same moment
through two replicas: a class is stored only after every webhook answered, so each replica's
listing lacks the other. The record of admissions, written with the resourceVersion read,
lets the second see the first."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from cozystack_gpu.admission.errors import Refused
from cozystack_gpu.admission.handle_catalog import ClassWebhook
from cozystack_gpu.keys import AdmissionReason

NOW = 1_800_000_000.0


class SharedApi:
    """The API server two replicas talk to: classes stored after admission, and the
    admissions ConfigMap with its resourceVersion."""

    def __init__(self) -> None:
        self.stored: dict[str, dict[str, Any]] = {}
        self.record: dict[str, str] = {}
        self.version = 0
        self.exists = False

    def classes(self, *, latest: bool = False) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self.stored)

    def class_admissions(self) -> tuple[dict[str, str], str | None]:
        return dict(self.record), (str(self.version) if self.exists else None)

    def write_class_admissions(self, data: dict[str, str], version: str | None) -> None:
        current = str(self.version) if self.exists else None
        if version != current:
            raise ApiException(status=409, reason="Conflict")
        self.record, self.version, self.exists = dict(data), self.version + 1, True


class Replica:
    """One replica's view of the API: it reads before the other replica writes."""

    def __init__(self, api: SharedApi) -> None:
        self.api = api
        self.before_read: list[tuple[dict[str, str], str | None]] = []

    def classes(self, *, latest: bool = False) -> dict[str, dict[str, Any]]:
        return self.api.classes(latest=latest)

    def class_admissions(self) -> tuple[dict[str, str], str | None]:
        if self.before_read:
            return self.before_read.pop(0)
        return self.api.class_admissions()

    def write_class_admissions(self, data: dict[str, str], version: str | None) -> None:
        self.api.write_class_admissions(data, version)


def gpu_class(name: str, selector: dict[str, str] | None = None) -> dict[str, Any]:
    spec = {"source": {"devicePlugin": {"resourceName": "nvidia.com/GH100"}}}
    if selector is not None:
        spec["nodeSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def test_two_classes_sharing_a_name_admitted_at_once_cannot_both_pass() -> None:
    api = SharedApi()
    first, second = Replica(api), Replica(api)
    # Both replicas read the record before either writes.
    second.before_read.append(api.class_admissions())
    ClassWebhook(first, lambda: NOW).admit(gpu_class("a"))  # type: ignore[arg-type]
    with pytest.raises(Refused) as refused:
        ClassWebhook(second, lambda: NOW).admit(gpu_class("b"))  # type: ignore[arg-type]
    assert refused.value.reason == AdmissionReason.RESOURCE_NAME_SHARED.value
    assert "already served by GPUClass a" in refused.value.message


def test_classes_on_disjoint_nodes_and_old_admissions_do_not_conflict() -> None:
    api = SharedApi()
    replica = Replica(api)
    ClassWebhook(replica, lambda: NOW).admit(  # type: ignore[arg-type]
        gpu_class("a", {"pool": "x"})
    )
    ClassWebhook(replica, lambda: NOW).admit(  # type: ignore[arg-type]
        gpu_class("b", {"pool": "y"})
    )
    # An admission long past whose create never stored a class is no conflict any more.
    later = NOW + 3600
    ClassWebhook(replica, lambda: later).admit(gpu_class("c", {"pool": "x"}))  # type: ignore[arg-type]
    assert set(api.record) == {"c"}


def test_a_dry_run_records_nothing() -> None:
    api = SharedApi()
    ClassWebhook(Replica(api), lambda: NOW).admit(  # type: ignore[arg-type]
        gpu_class("a"), dry_run=True
    )
    assert api.record == {} and not api.exists
