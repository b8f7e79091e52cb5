"""The invariant checker reads one moment of the cluster, not a list of moments.

Its rules join kinds (a launcher pod with its VMI's claims): lists read one after another
saw a VM start between them, the claims before they were attached and the launcher pod
after it was bound, and called the pod's GPUs held twice (the fault suite's partition test
failed so, in CI). Every list is served at the first list's resourceVersion.
"""

from __future__ import annotations

from typing import Any

import pytest
from binder_env import Corner

from cozystack_gpu_testkit.invariants import read_state
from cozystack_gpu_testkit.objects import Kube

pytestmark = pytest.mark.apiserver


def names(objects: list[dict[str, Any]], namespace: str) -> set[str]:
    return {o["metadata"]["name"] for o in objects if o["metadata"].get("namespace") == namespace}


def test_every_kind_is_read_at_the_same_revision(
    api_client: Any, kube: Kube, corner: Corner
) -> None:
    before = read_state(api_client)
    assert before.resource_version, "the state names the revision it was read at"
    # Objects of three kinds made after that moment.
    kube.claim(corner.tenant, "late-claim", corner.name("class"))
    kube.pod(corner.tenant, "late-pod")
    later_ns = corner.name("late")
    kube.namespace(later_ns)
    try:
        then = read_state(api_client, at=before.resource_version)
        now = read_state(api_client)
        assert then.resource_version == before.resource_version
        assert not names(then.claims, corner.tenant), "a claim made later is not in the moment"
        assert "late-pod" not in names(then.pods, corner.tenant)
        assert later_ns not in {n["metadata"]["name"] for n in then.namespaces}
        # A fresh read has them all.
        assert names(now.claims, corner.tenant) == {"late-claim"}
        assert "late-pod" in names(now.pods, corner.tenant)
        assert later_ns in {n["metadata"]["name"] for n in now.namespaces}
    finally:
        kube.core.delete_namespace(later_ns)
