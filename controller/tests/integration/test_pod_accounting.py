"""Pod accounting as a tenant allowed raw names meets it (SPEC §7): a pod is covered by
claims only as the one launcher pod of a live VMI; every other pod requesting a GPU name
is raw usage on its node, whatever its labels and owner references say. The attacker is a
tenant's pod (docs/security.md, rows P2 to P4): a ServiceAccount of the tenant namespace
that its tenant let make pods (the built-in ``edit`` role), calling with its own token
(``rawResourceNames: allowed`` lets a tenant run GPU pods). The binder is the real one on
the real API server, and what it counts shows in the next order it judges: refused for
capacity while the pod holds the node's last unit.
"""

from __future__ import annotations

from typing import Any

import pytest
from binder_env import Env, condition

from cozystack_gpu import keys
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

JUDGED_S = 15


def tenant(env: Env) -> Kube:
    """A pod of the tenant namespace, with its ServiceAccount's token: it writes pods
    there, and has nothing else of the admin's."""
    return tenants.as_tenant_pod(env.kube.api, env.tenant)


def gpu_pod(env: Env, name: str, node: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod on ``node`` asking one unit of the test's resource, labelled as a launcher
    pod that uses claims, owned by ``owner`` (a VMI) when given."""
    units = {env.resource: "1"}
    metadata: dict[str, Any] = {
        "name": name,
        "labels": {"kubevirt.io": "virt-launcher", keys.LABEL_CLAIMS_REF: "true"},
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": keys.VMI.api_version,
                "kind": keys.VMI.kind,
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    container = {"name": "compute", "image": "virt-launcher"}
    return {
        "metadata": metadata,
        "spec": {
            "nodeName": node,
            "containers": [{**container, "resources": {"requests": units, "limits": units}}],
        },
    }


def vmi_of(env: Env, name: str = "vm") -> dict[str, Any]:
    found: dict[str, Any] = env.kube.custom.get_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, name
    )
    return found


def free(env: Env, gpu_class: str) -> int | None:
    obj = env.kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
    )
    value = (obj.get("status") or {}).get("free")
    return None if value is None else int(value)


def refused_for_capacity(env: Env, gpu_class: str, what: str) -> None:
    """The pod's unit is counted: the class shows no unit free (the binder has seen the
    pod), and an order of one unit is refused for capacity."""
    try:
        wait_for(lambda: free(env, gpu_class) == 0, JUDGED_S, "the class to show no unit free")
    except AssertionError:
        raise AssertionError(f"{what}: class {gpu_class} still shows {free(env, gpu_class)} "
                             "unit(s) free") from None  # fmt: skip
    env.kube.claim(env.tenant, "next", gpu_class, 1)

    def judged() -> dict[str, Any] | None:
        obj = env.kube.get_claim(env.tenant, "next")
        if (obj.get("status") or {}).get("nodeName"):
            return obj
        return obj if condition(obj).get("status") == "False" else None

    obj = wait_for(judged, JUDGED_S, "the order to be judged")
    bound_to = (obj.get("status") or {}).get("nodeName")
    assert bound_to is None, f"{what}: the binder bound another order to its unit on {bound_to}"
    assert condition(obj)["reason"] == "InsufficientCapacity", condition(obj)


def test_a_claims_label_on_a_raw_gpu_pod_does_not_hide_its_units(env: Env) -> None:
    gpu_class = env.gpu_class()
    node = env.node("n1", 1)
    tenant(env).core.create_namespaced_pod(env.tenant, gpu_pod(env, "raw", node))
    refused_for_capacity(env, gpu_class, "a raw GPU pod with the claims label took a GPU")


def test_a_launcher_pod_whose_vmi_owner_is_cut_holds_its_units(env: Env) -> None:
    gpu_class = env.gpu_class()
    node = env.node("n1", 2)
    env.attached(node, gpu_class)
    pods = tenant(env).core
    pods.create_namespaced_pod(env.tenant, gpu_pod(env, "virt-launcher-vm", node, vmi_of(env)))
    pods.patch_namespaced_pod(
        "virt-launcher-vm", env.tenant, {"metadata": {"ownerReferences": None}}
    )
    refused_for_capacity(env, gpu_class, "a labelled pod whose VMI owner was cut took a GPU")


def test_a_second_pod_of_a_claims_vmi_holds_its_units(env: Env) -> None:
    gpu_class = env.gpu_class()
    node = env.node("n1", 2)
    env.attached(node, gpu_class)  # claim c, 1 unit, attached to the running VMI vm
    vmi = vmi_of(env)
    env.kube.core.create_namespaced_pod(env.tenant, gpu_pod(env, "virt-launcher-vm", node, vmi))
    tenant(env).core.create_namespaced_pod(env.tenant, gpu_pod(env, "forged", node, vmi))
    refused_for_capacity(env, gpu_class, "a second pod of the VMI took a GPU under its claims")


def test_a_pod_naming_an_ended_vmi_holds_its_units(env: Env) -> None:
    gpu_class = env.gpu_class()
    node = env.node("n1", 2)
    env.attached(node, gpu_class)
    env.kube.vmi_phase(env.tenant, "vm", "Succeeded", node)
    env.wait_phase("c", "Bound")  # held for the VM's next start: 1 of the node's 2 units
    tenant(env).core.create_namespaced_pod(env.tenant, gpu_pod(env, "late", node, vmi_of(env)))
    refused_for_capacity(env, gpu_class, "a pod naming an ended VMI's uid took a GPU")
