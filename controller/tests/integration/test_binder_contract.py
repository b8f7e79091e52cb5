"""The binder's contract beyond placement, against the real API server: the Pending phase,
the class and claim finalizers, GPUNode conditions, stale inventories and the effective
GPU resource-name set (SPEC.md §3-§5, issue 9)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from binder_env import Env, condition
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import unless, wait_for

pytestmark = pytest.mark.apiserver


def _class(env: Env, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = unless(
        404,
        lambda: env.kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        ),
    )
    return found


def _claim_or_none(env: Env, name: str) -> dict[str, Any] | None:
    found: dict[str, Any] | None = unless(404, lambda: env.kube.get_claim(env.tenant, name))
    return found


def _delete_claim(env: Env, name: str) -> None:
    env.kube.custom.delete_namespaced_custom_object(
        keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_CLAIMS, name
    )


def _records(env: Env) -> list[str]:
    found = env.kube.custom.list_namespaced_custom_object(
        keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, env.tenant, keys.WORKLOAD_PLURAL
    )
    return sorted(item["metadata"]["name"] for item in found["items"])


def _gpunode_condition(env: Env, node: str, type_: str) -> dict[str, Any]:
    obj = env.kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node
    )
    return condition(obj, type_)


def _wait_gpunode_reason(env: Env, node: str, type_: str, reason: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cond = _gpunode_condition(env, node, type_)
        return cond if cond.get("reason") == reason else None

    found: dict[str, Any] = wait_for(check, what=f"{type_}={reason} on GPUNode {node}")
    return found


# --- Pending -----------------------------------------------------------------------------


def test_an_accepted_order_that_cannot_bind_yet_is_pending_with_its_reason(
    env: Env, control_plane: ControlPlane
) -> None:
    env.node("n1", 1)
    gpu_class = env.gpu_class(maxCount=4)
    env.kube.claim(env.tenant, "big", gpu_class, 2)
    waiting = env.wait_phase("big", "Pending")
    cond = condition(waiting)
    assert (cond["status"], cond["reason"]) == ("False", "InsufficientCapacity")
    assert "has 2 free units" in cond["message"] and "the largest has 1" in cond["message"]
    # kubectl shows the phase in the claim's printer column.
    header, row = control_plane.kubectl("get", "gpuclaims", "big", "-n", env.tenant).stdout.split(
        "\n"
    )[:2]
    assert dict(zip(header.split(), row.split(), strict=False))["PHASE"] == "Pending"
    env.node("n2", 2)
    bound = env.wait_phase("big", "Bound")
    assert condition(bound)["status"] == "True"


def test_a_new_order_shows_pending_at_once_while_older_claims_are_told_a_new_reason(
    env: Env,
) -> None:
    """Waiting notes are rate-limited; a backlog of re-notes (here a node gone under 120
    waiting orders) must not keep a new order from showing Pending."""
    node = env.node("only", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "holder", gpu_class, 1)
    env.wait_phase("holder", "Bound")
    backlog = [f"w{i:03d}" for i in range(120)]
    for name in backlog:
        env.kube.claim(env.tenant, name, gpu_class, 1)

    def reasons() -> dict[str, str]:
        return {
            obj["metadata"]["name"]: condition(obj).get("reason", "")
            for obj in env.kube.claims(env.tenant)
            if obj["metadata"]["name"] in backlog
        }

    wait_for(lambda: set(reasons().values()) == {"InsufficientCapacity"}, 60, "the backlog noted")
    env.kube.core.delete_node(node)
    wait_for(lambda: env.phase("holder") == "Lost", what="the holder Lost with its node")
    env.kube.claim(env.tenant, "late", gpu_class, 1)
    late = env.wait_phase("late", "Pending", timeout=4)
    assert condition(late)["reason"] == "NoNodeServesClass"
    # The backlog's new notes are written at most 20 a second: some still say the old reason,
    # so the new order went ahead of them.
    assert "InsufficientCapacity" in reasons().values()
    wait_for(lambda: set(reasons().values()) == {"NoNodeServesClass"}, 60, "the backlog told again")


# --- class deletion ----------------------------------------------------------------------


def test_a_deleted_class_keeps_its_holds_and_goes_once_they_are_released(env: Env) -> None:
    node = env.node("n1", 4)
    old = env.gpu_class("old")
    env.kube.claim(env.tenant, "held", old, 2)
    env.wait_phase("held", "Bound")
    wait_for(
        lambda: (
            keys.FINALIZER_CLASS
            in ((_class(env, old) or {}).get("metadata") or {}).get("finalizers", [])
        ),
        what="the class-protection finalizer",
    )
    env.kube.custom.delete_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, old)
    # The class stays while it holds units, serves its hold and takes no new order.
    env.kube.claim(env.tenant, "late", old, 1)
    late = env.wait_phase("late", "Pending")
    assert condition(late)["reason"] == "ClassDeleting"
    assert _class(env, old) is not None
    assert env.phase("held") == "Bound"
    # A new class on the same resource name cannot take the held units meanwhile.
    new = env.gpu_class("new")
    env.kube.claim(env.tenant, "whole", new, 4)
    env.wait_phase("whole", "Pending")
    time.sleep(1.5)
    assert env.phase("whole") == "Pending", "the deleted class's held units read as free"
    _delete_claim(env, "held")
    wait_for(lambda: _class(env, old) is None, what="the deleted class to go")
    bound = env.wait_phase("whole", "Bound")
    assert bound["status"]["nodeName"] == node


# --- claim protection --------------------------------------------------------------------


def test_deleting_an_attached_claim_waits_for_its_vmi_then_takes_its_record(env: Env) -> None:
    node = env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.attached(node, gpu_class)
    wait_for(
        lambda: (
            keys.FINALIZER_CLAIM
            in (env.kube.get_claim(env.tenant, "c")["metadata"].get("finalizers") or [])
        ),
        what="the claim-protection finalizer",
    )
    wait_for(lambda: _records(env) == ["gpuclaim-c"], what="the usage record")
    _delete_claim(env, "c")

    def deletion_told() -> dict[str, Any] | None:
        obj = _claim_or_none(env, "c")
        return obj if condition(obj or {}, keys.CONDITION_DELETING) else None

    marked = wait_for(deletion_told, what="the Deleting condition")
    assert marked["metadata"]["deletionTimestamp"]
    assert marked["status"]["phase"] == "Attached"
    told = condition(marked, keys.CONDITION_DELETING)
    assert told["reason"] == "WaitingForVMI" and "VMI vm" in told["message"]
    time.sleep(1.0)
    assert _claim_or_none(env, "c") is not None, "an attached claim vanished under its VMI"
    assert _records(env) == ["gpuclaim-c"], "still in use, still on the usage record"
    env.kube.vmi_phase(env.tenant, "vm", "Succeeded", node)
    wait_for(lambda: _claim_or_none(env, "c") is None, what="the claim to go")
    wait_for(lambda: _records(env) == [], what="its usage record to go")


def test_a_claim_keeps_the_protection_it_was_created_with_until_it_is_deleted(env: Env) -> None:
    """Admission puts claim-protection on at create (as pvc-protection): the binder binds
    without touching it, leaves it on while the claim is held, and takes it off once the
    claim is deleted and no VMI uses it: the claim then goes."""
    env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "free", gpu_class, 1, finalizers=[keys.FINALIZER_CLAIM])
    bound = env.wait_phase("free", "Bound")
    time.sleep(1.5)  # several binder turns: none may take the finalizer off a live claim
    held = env.kube.get_claim(env.tenant, "free")
    assert held["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]
    assert held["metadata"]["resourceVersion"] == bound["metadata"]["resourceVersion"], (
        "the bind was followed by another write"
    )
    _delete_claim(env, "free")
    wait_for(lambda: _claim_or_none(env, "free") is None, what="the claim to go")


def test_a_claim_deleted_while_no_binder_ran_goes_once_one_leads(env: Env) -> None:
    """Deleted while no replica led, the claim sends no further watch event: the binder
    that takes over judges every claim being deleted and lets this one go."""
    env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "gap", gpu_class, 1, finalizers=[keys.FINALIZER_CLAIM])
    env.wait_phase("gap", "Bound")
    env.binder.stop()
    _delete_claim(env, "gap")
    gone = env.kube.get_claim(env.tenant, "gap")
    assert gone["metadata"]["deletionTimestamp"], "the claim was not marked deleted"
    env.restart_binder()
    wait_for(lambda: _claim_or_none(env, "gap") is None, what="the claim to go")


# --- GPUNode conditions and stale inventories -------------------------------------------


def test_gpunode_ready_follows_node_readiness_cordon_and_layout(env: Env) -> None:
    node = env.node("n1", 1)
    env.gpu_class()
    ready = _wait_gpunode_reason(env, node, keys.CONDITION_READY, "Serving")
    assert ready["status"] == "True"
    env.kube.cordon(node)
    cordoned = _wait_gpunode_reason(env, node, keys.CONDITION_READY, "Cordoned")
    assert cordoned["status"] == "False" and "onCordon" in cordoned["message"]
    env.kube.cordon(node, False)
    env.kube.core.patch_node(
        node, {"metadata": {"labels": {keys.LABEL_NODE_LAYOUT_STATE: "pending"}}}
    )
    _wait_gpunode_reason(env, node, keys.CONDITION_READY, "LayoutPending")
    env.kube.core.patch_node(node, {"metadata": {"labels": {keys.LABEL_NODE_LAYOUT_STATE: None}}})
    env.kube.node_status(node, ready=False)
    _wait_gpunode_reason(env, node, keys.CONDITION_READY, "NodeNotReady")
    env.kube.node_status(node, ready=True)
    _wait_gpunode_reason(env, node, keys.CONDITION_READY, "Serving")
    names = _gpunode_condition(env, node, keys.CONDITION_NAMES_ADVERTISED)
    assert (names["status"], names["reason"]) == ("True", "Advertised")


def _reported(env: Env, node: str, seconds_ago: float) -> None:
    """Set the GPUNode's updatedAt as if the node agent last wrote it that long ago."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - seconds_ago))
    env.kube.custom.patch_cluster_custom_object_status(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node, {"status": {"updatedAt": when}}
    )


def test_a_stale_inventory_keeps_its_holds_and_takes_nothing_new(env: Env) -> None:
    env.restart_binder(inventory_stale_after=60.0)
    first = env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c1", gpu_class, 1)
    assert env.wait_phase("c1", "Bound")["status"]["nodeName"] == first
    second = env.node("n2", 2)
    _reported(env, first, 3600)  # n1's agent fell silent an hour ago
    stale = _wait_gpunode_reason(env, first, keys.CONDITION_READY, "InventoryStale")
    assert stale["status"] == "False" and "cozystack-gpu-agent" in stale["message"]
    assert "holds stay" in stale["message"]
    metric = ("cozystack_gpu_node_inventory_stale", {"node": first})
    wait_for(lambda: REGISTRY.get_sample_value(*metric) == 1.0, 30, "the staleness metric")
    # Best fit would take n1's free unit; the stale node takes nothing new, so c2 goes to n2.
    env.kube.claim(env.tenant, "c2", gpu_class, 1)
    assert env.wait_phase("c2", "Bound")["status"]["nodeName"] == second
    # A pass that binds c2 has judged c1 first (holds before orders): c1 stayed on n1.
    held = env.kube.get_claim(env.tenant, "c1")["status"]
    assert (held["phase"], held["nodeName"]) == ("Bound", first)
    # The agent reports again: the node serves again.
    _reported(env, first, 0)
    _wait_gpunode_reason(env, first, keys.CONDITION_READY, "Serving")
    wait_for(lambda: REGISTRY.get_sample_value(*metric) == 0.0, 30, "the staleness metric")


def test_a_name_kubelet_does_not_advertise_is_reported_on_the_gpunode(env: Env) -> None:
    node = env.node("n1", 1)
    predicted = f"nvidia.com/AD102GL_L40_{env.id}"
    env.kube.gpunode(node, [
        {"pciAddress": "0000:10:00.0", "resourceName": env.resource, "allocatable": 1},
        {"pciAddress": "0000:11:00.0", "resourceName": predicted, "allocatable": 0},
    ])  # fmt: skip
    found = _wait_gpunode_reason(env, node, keys.CONDITION_NAMES_ADVERTISED, "NotAdvertised")
    assert found["status"] == "False"
    assert f"{predicted} (0000:11:00.0)" in found["message"]


# --- the effective GPU resource-name set -------------------------------------------------


def test_every_nvidia_name_a_node_advertises_joins_resource_names_with_or_without_agent(
    env: Env,
) -> None:
    audio = f"nvidia.com/GA100_AUDIO_{env.id}"
    gpu_node = env.name("n1")
    env.kube.node(gpu_node, labels=env.selector, allocatable={env.resource: 1, audio: 1})
    env.kube.gpunode(gpu_node, [
        {"pciAddress": "0000:10:00.0", "resourceName": env.resource, "allocatable": 1},
    ])  # fmt: skip
    # A GPU node without the layout label runs no agent and has no GPUNode: a node whose
    # allocatable lists an NVIDIA name is a GPU node all the same (SPEC §7), or raw requests
    # of its GPUs would pass under forbidden.
    bare = f"nvidia.com/FOO_{env.id}"
    env.kube.node(env.name("plain"), allocatable={bare: 1})
    core = client.CoreV1Api(env.kube.api)

    def names() -> frozenset[str] | None:
        try:
            cm = core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
        except ApiException:
            return None
        found = keys.parse_resource_names(cm.data.get(keys.SETTINGS_KEY_RESOURCE_NAMES, ""))
        return found if audio in found and bare in found else None

    found = wait_for(
        names, what=f"{bare}, advertised by a node without agent, in resourceNames", timeout=10
    )
    assert env.resource in found
