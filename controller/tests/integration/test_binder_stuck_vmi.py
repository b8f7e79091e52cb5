"""A VMI that never ran is deleted only when the node its claims are pinned to is gone.

Found by the fault suite's long SIGKILL run (its nodes' inventory went stale, so they
stopped serving): a starting VM whose claims had to leave their node and found no room
went Lost with no node, and the binder deleted its VMI as if "its node is gone": the node
name it looked up was the string "None". A bare VMI deleted that way is gone for good;
its Lost claims would rebind and its gated pod start once room appears.

The VMIs are bare (no VirtualMachine, as a tenant may create one) and written by hand with
no launcher pod: the rule under test is the binder's judgement of a VMI that never ran,
which virt-controller would not leave podless, and a VM would re-create a deleted VMI.
"""

from __future__ import annotations

import time

import pytest
from binder_env import Env
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver


def vmi_exists(env: Env, name: str) -> bool:
    try:
        env.kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def starting_vm(env: Env, node: str, gpu_class: str) -> None:
    """Claim "c" Bound on ``node`` and attached by the VMI webhook to "vm", whose VMI is
    stored a moment later and has not run (Pending, no node)."""
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    assert env.wait_phase("c", "Bound")["status"]["nodeName"] == node
    env.kube.attach(env.tenant, "c", "vm")


def test_a_vmi_whose_claims_lost_their_node_to_no_room_is_kept(env: Env) -> None:
    node = env.node("n1", 1)
    gpu_class = env.gpu_class()
    starting_vm(env, node, gpu_class)
    # The node stops serving the class (a label the selector needs goes); there is no
    # other node, so the set goes Lost with no node.
    env.kube.core.patch_node(node, {"metadata": {"labels": {"test.cozystack.io/id": None}}})
    lost = env.wait_phase("c", "Lost")
    assert not lost["status"].get("nodeName")
    env.kube.vmi(env.tenant, "vm", claims=["c"], phase="Pending")
    time.sleep(3.0)  # several binder passes
    assert vmi_exists(env, "vm"), "the binder deleted a VMI whose node exists"


def test_a_vmi_that_never_ran_on_a_node_that_is_gone_is_deleted(env: Env) -> None:
    node = env.node("n1", 1)
    gpu_class = env.gpu_class()
    starting_vm(env, node, gpu_class)
    env.kube.vmi(env.tenant, "vm", claims=["c"], phase="Pending")
    env.wait_phase("c", "Attached")
    env.kube.core.delete_node(node)
    assert env.wait_phase("c", "Lost")["status"]["nodeName"] == node
    wait_for(lambda: not vmi_exists(env, "vm"), 20, "the stuck VMI deleted")
