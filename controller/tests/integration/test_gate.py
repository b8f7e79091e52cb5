"""The launcher-pod gate against the real API server, kube-scheduler and garbage collector:
template claims created and placed with the set, the pin and the ungating in one pod
update, a set that cannot be placed kept at the gate, and the rejected-node loop driven by
the real scheduler's Unschedulable (SPEC.md §6, seed 000).

The tests play KubeVirt and the webhooks: they write the VMI with its claims annotation and
gpus entries (as the VMI webhook leaves it) and the launcher pod owned by the VMI, with the
gate on (as the pod webhook leaves it).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from binder_env import Env, condition
from kubernetes import watch
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder import gate
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver


@pytest.fixture(autouse=True)
def _scheduler(full_control_plane: ControlPlane) -> None:
    """Every test here needs the real kube-scheduler and garbage collector."""


def make_vmi(
    env: Env,
    name: str,
    *,
    claims: list[str] = (),  # type: ignore[assignment]
    templates: list[dict[str, Any]] = (),  # type: ignore[assignment]
    gpus: list[str] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    """A VMI as the VMI webhook leaves it: claims annotation, reference label, one gpus
    entry per unit."""
    annotation = {"claims": list(claims), "claimTemplates": list(templates)}
    body = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {
            "name": name,
            "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
            "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(annotation)},
        },
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [
                        {"name": f"{keys.VMI_GPU_NAME_PREFIX}{i}", "deviceName": device}
                        for i, device in enumerate(gpus)
                    ]
                }
            }
        },
    }
    created: dict[str, Any] = env.kube.custom.create_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, body
    )
    return created


def launcher_pod(env: Env, vmi: dict[str, Any], name: str, requests: dict[str, int]) -> None:
    """A virt-launcher pod as virt-controller renders it (owned by the VMI, with its labels
    and the gpus entries as extended-resource requests), gated as the pod webhook leaves it."""
    resources = {k: str(v) for k, v in requests.items()}
    body = {
        "metadata": {
            "name": name,
            "labels": {"kubevirt.io": "virt-launcher", **vmi["metadata"].get("labels", {})},
            "ownerReferences": [
                {
                    "apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstance",
                    "name": vmi["metadata"]["name"],
                    "uid": vmi["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "compute",
                    "image": "virt-launcher",
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
            "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
        },
    }
    env.kube.core.create_namespaced_pod(env.tenant, body)


def pod(env: Env, name: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = env.kube.api.sanitize_for_serialization(
            env.kube.core.read_namespaced_pod(name, env.tenant)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def wait_bound_to(env: Env, name: str, node: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        found = pod(env, name)
        return found if found and found["spec"].get("nodeName") == node else None

    result: dict[str, Any] = wait_for(bound, 30, f"pod {name} bound to {node} by kube-scheduler")
    return result


class PodWatch:
    """Every version of one pod the API server shows, to check how it was updated."""

    def __init__(self, env: Env, name: str) -> None:
        self.versions: list[dict[str, Any]] = []
        self._stopping = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(env, name), daemon=True)
        self._thread.start()

    def _run(self, env: Env, name: str) -> None:
        stream = self._watch.stream(
            env.kube.core.list_namespaced_pod,
            env.tenant,
            field_selector=f"metadata.name={name}",
            timeout_seconds=60,
            deserialize=False,
        )
        try:
            for event in stream:
                self.versions.append(event["object"])
        except Exception:  # stop() closes the stream under the reader
            if not self._stopping:
                raise

    def stop(self) -> list[dict[str, Any]]:
        self._stopping = True
        self._watch.stop()
        self._thread.join(5)
        return self.versions


@pytest.fixture
def gpu_nodes(env: Env) -> Iterator[tuple[str, str, str]]:
    """Two GPU nodes of 2 units each and a passthrough class serving both."""
    first, second = env.node("n1", 2), env.node("n2", 2)
    yield first, second, env.gpu_class(maxCount=2)


def test_a_gated_pod_is_pinned_and_ungated_in_one_update_and_bound_to_the_claims_node(
    env: Env, gpu_nodes: tuple[str, str, str]
) -> None:
    _first, _second, gpu_class = gpu_nodes
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    node = env.wait_phase("held", "Bound")["status"]["nodeName"]
    env.kube.attach(env.tenant, "held", "vm")
    vmi = make_vmi(env, "vm", claims=["held"], gpus=[env.resource])
    watcher = PodWatch(env, "virt-launcher-vm")
    launcher_pod(env, vmi, "virt-launcher-vm", {env.resource: 1})
    bound = wait_bound_to(env, "virt-launcher-vm", node)
    assert gate.pinned_node(bound) == node
    assert not gate.is_gated(bound)
    versions = watcher.stop()
    # Never a version ungated and unpinned (the scheduler could have placed it anywhere),
    # nor one pinned and still gated: the pin and the ungating were one update.
    for version in versions:
        assert gate.is_gated(version) == (gate.pinned_node(version) is None), version["metadata"]
    # The claim is told where its VM went after the pod is pinned (a note, not the pin).
    placed = wait_for(
        lambda: condition(env.kube.get_claim(env.tenant, "held"), keys.CONDITION_PLACED),
        what="the claim's Placed condition",
    )
    assert placed["status"] == "True" and node in placed["message"]


def test_template_claims_are_created_placed_with_the_set_and_collected_with_the_vmi(
    env: Env, gpu_nodes: tuple[str, str, str]
) -> None:
    _first, _second, gpu_class = gpu_nodes
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    node = env.wait_phase("held", "Bound")["status"]["nodeName"]
    env.kube.attach(env.tenant, "held", "vm")
    vmi = make_vmi(
        env,
        "vm",
        claims=["held"],
        templates=[{"name": "extra", "class": gpu_class, "count": 1}],
        gpus=[env.resource, env.resource],
    )
    launcher_pod(env, vmi, "virt-launcher-vm", {env.resource: 2})
    bound = wait_bound_to(env, "virt-launcher-vm", node)
    assert gate.pinned_node(bound) == node
    template = env.kube.get_claim(env.tenant, keys.template_claim_name("vm", "extra"))
    assert template["metadata"]["labels"][keys.LABEL_TEMPLATE_CLAIM] == "true"
    owner = template["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "VirtualMachineInstance",
        "vm",
        vmi["metadata"]["uid"],
    )
    assert template["status"]["phase"] == "Bound" and template["status"]["nodeName"] == node
    env.kube.delete_vmi(env.tenant, "vm")

    def collected() -> bool:
        names = {c["metadata"]["name"] for c in env.kube.claims(env.tenant)}
        return keys.template_claim_name("vm", "extra") not in names

    wait_for(collected, 30, "the real garbage collector to remove the template claim")


def test_a_set_that_fits_nowhere_stays_gated_and_says_why(
    env: Env, gpu_nodes: tuple[str, str, str]
) -> None:
    _first, _second, gpu_class = gpu_nodes
    vmi = make_vmi(
        env,
        "vm",
        templates=[{"name": "big", "class": gpu_class, "count": 2}],
        gpus=[env.resource] * 2,
    )
    # One unit held on one node, two on the other: no node has the 2 units the set needs.
    env.kube.claim(env.tenant, "a", gpu_class, 1)
    env.wait_phase("a", "Bound")
    env.kube.claim(env.tenant, "b", gpu_class, 2)
    env.wait_phase("b", "Bound")
    launcher_pod(env, vmi, "virt-launcher-vm", {env.resource: 2})
    template = keys.template_claim_name("vm", "big")

    def told() -> dict[str, Any] | None:
        try:
            cond = condition(env.kube.get_claim(env.tenant, template), keys.CONDITION_PLACED)
        except ApiException:
            return None
        return cond if cond.get("status") == "False" else None

    cond = wait_for(told, 30, "the Placed condition on the template claim")
    assert cond["reason"] == "InsufficientCapacity"
    assert "cannot start anywhere yet" in cond["message"]
    still = pod(env, "virt-launcher-vm")
    assert still is not None and gate.is_gated(still) and not still["spec"].get("nodeName")
    events = env.kube.core.list_namespaced_event(
        env.tenant, field_selector="involvedObject.kind=VirtualMachineInstance"
    )
    assert any(e.reason == "GPUSetNotPlaced" and e.type == "Warning" for e in events.items)


def test_a_pinned_pod_the_scheduler_refuses_is_deleted_and_the_next_goes_elsewhere(
    env: Env, gpu_nodes: tuple[str, str, str]
) -> None:
    _first, _second, gpu_class = gpu_nodes
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    node = env.wait_phase("held", "Bound")["status"]["nodeName"]
    env.kube.attach(env.tenant, "held", "vm")
    # Something the binder does not count takes the node's units as the scheduler sees them
    # (a pod labelled as a claims user, placed by name): the pinned pod will not fit.
    squatter = {
        "metadata": {
            "name": "squatter",
            "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "resources": {
                        "requests": {env.resource: "2"},
                        "limits": {env.resource: "2"},
                    },
                }
            ],
        },
    }
    env.kube.core.create_namespaced_pod(env.tenant, squatter)
    vmi = make_vmi(env, "vm", claims=["held"], gpus=[env.resource])
    launcher_pod(env, vmi, "virt-launcher-vm", {env.resource: 1})
    wait_for(lambda: pod(env, "virt-launcher-vm") is None, 30, "the refused pod to be deleted")

    def rejected() -> list[dict[str, Any]] | None:
        entries = env.kube.get_claim(env.tenant, "held")["status"].get("rejectedNodes") or []
        return entries if any(e["node"] == node for e in entries) else None

    assert wait_for(rejected, 15, "the node in rejectedNodes")[0]["until"]
    # virt-controller creates the next launcher pod; the set now starts elsewhere.
    launcher_pod(env, vmi, "virt-launcher-vm-2", {env.resource: 1})
    other = wait_for(
        lambda: (
            (found := pod(env, "virt-launcher-vm-2"))
            and (bound_to := found["spec"].get("nodeName"))
            and bound_to
        ),
        30,
        "the next launcher pod bound",
    )
    assert other != node
    assert env.kube.get_claim(env.tenant, "held")["status"]["nodeName"] == other
