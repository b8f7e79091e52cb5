"""Nothing a tenant can read names another tenant's objects.

Two tenants share a class and its nodes. A busy turn (holds scattered by releases, packing
that moves one tenant's hold to make room for the other's order, budget and capacity
refusals, a node that goes away under a hold) is followed by everything tenant A's user
may read, read with that user's own identity (impersonation, so the API server judges
its rights): its claims, the Events and VMIs of its namespace, its usage records, and
every GPUClass. Tenant B's namespace and claim names appear nowhere in it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from binder_env import Env, condition
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

pytestmark = pytest.mark.apiserver


def _tenant_user(kube: Kube, namespace: str, user: str) -> list[tuple[str, str]]:
    """What a tenant's role reads: in its namespace claims, Events, VMIs and usage records;
    the catalog cluster-wide. Returns the cluster-scoped objects made, to delete."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    read = ["get", "list", "watch"]
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "tenant-read"},
            "rules": [
                {"apiGroups": [keys.GROUP], "resources": ["gpuclaims"], "verbs": read},
                {"apiGroups": [""], "resources": ["events"], "verbs": read},
                {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": read},
                {"apiGroups": [keys.KUBEVIRT_GROUP], "resources": ["*"], "verbs": read},
                {"apiGroups": [keys.WORKLOAD_GROUP], "resources": ["*"], "verbs": read},
            ],
        },
    )
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "tenant-read"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "tenant-read"},
            "subjects": [subject],
        },
    )  # fmt: skip
    name = f"catalog-read-{namespace}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [keys.GROUP], "resources": ["gpuclasses"], "verbs": read}],
        }
    )
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": name},
            "subjects": [subject],
        },
    )  # fmt: skip
    tenants.wait_granted(kube.api, user, "list", "gpuclaims", namespace=namespace, group=keys.GROUP)
    tenants.wait_granted(kube.api, user, "list", "gpuclasses", group=keys.GROUP)
    return [("role", name), ("binding", name)]


def _everything_readable(plane: ControlPlane, namespace: str, user: str) -> str:
    """Every object tenant A's user can list, as the JSON it reads."""
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    seen: list[Any] = [
        custom.list_namespaced_custom_object(
            keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS
        ),
        custom.list_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES),
        json.loads(core.list_namespaced_event(namespace, _preload_content=False).data),
        json.loads(
            client.EventsV1Api(api).list_namespaced_event(namespace, _preload_content=False).data
        ),
        custom.list_namespaced_custom_object(
            keys.KUBEVIRT_GROUP, keys.KUBEVIRT_VERSION, namespace, "virtualmachineinstances"
        ),
        custom.list_namespaced_custom_object(
            keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, namespace, keys.WORKLOAD_PLURAL
        ),
    ]  # fmt: skip
    # The identity is really the tenant's: its rights end at its namespace.
    with pytest.raises(ApiException) as denied:
        core.list_namespace()
    assert denied.value.status == 403
    return json.dumps(seen)


def test_nothing_a_tenant_reads_names_another_tenants_objects(
    env: Env, control_plane: ControlPlane
) -> None:
    tenant_a, tenant_b = env.tenant, f"{env.tenant}-bravo"
    user = f"alice-{env.id}"
    env.kube.namespace(tenant_b, {f"tenant.cozystack.io/{tenant_b}": ""})
    made: list[tuple[str, str]] = []
    try:
        made = _tenant_user(env.kube, tenant_a, user)
        _busy_turn(env, tenant_a, tenant_b)
        text = _everything_readable(control_plane, tenant_a, user)
    finally:
        rbac = client.RbacAuthorizationV1Api(env.kube.api)
        for kind, name in made:
            if kind == "role":
                unless(404, lambda name=name: rbac.delete_cluster_role(name))
            else:
                unless(404, lambda name=name: rbac.delete_cluster_role_binding(name))
        unless(
            404,
            lambda: env.kube.custom.delete_collection_namespaced_custom_object(
                keys.GROUP, keys.VERSION, tenant_b, keys.PLURAL_CLAIMS
            ),
        )
        unless(404, lambda: env.kube.core.delete_namespace(tenant_b))
    assert "makes room" in text, "the busy turn moved tenant A's hold for B's order"
    for secret in (tenant_b, "bravo-big", "bravo-over"):
        at = text.find(secret)
        assert at < 0, f"tenant A reads {secret!r}: …{text[max(at - 200, 0) : at + 100]}…"


def _busy_turn(env: Env, tenant_a: str, tenant_b: str) -> None:
    """Holds of A scattered over two 4-GPU nodes, B's order of 4 that packing makes room
    for by moving one of A's, refusals on both sides, and a node gone under A's hold."""
    first, second = env.node("n0", 4), env.node("n1", 4)
    gpu_class = env.gpu_class(maxCount=4)
    for i in range(4):
        env.kube.claim(tenant_a, f"a{i}", gpu_class, 1)
        env.wait_phase(f"a{i}", "Bound", namespace=tenant_a)
    env.kube.claim(tenant_a, "a4", gpu_class, 1)
    assert env.wait_phase("a4", "Bound")["status"]["nodeName"] == second
    for i in (1, 2, 3):
        env.kube.custom.delete_namespaced_custom_object(
            keys.GROUP, keys.VERSION, tenant_a, keys.PLURAL_CLAIMS, f"a{i}"
        )
    wait_for(lambda: len(env.kube.claims(tenant_a)) == 2, what="A's releases")
    # B's order fits no node as it stands: one of A's holds moves to make room.
    env.kube.quota(tenant_b, {keys.quota_key(gpu_class): 4})
    env.kube.claim(tenant_b, "bravo-big", gpu_class, 4)
    env.wait_phase("bravo-big", "Bound", namespace=tenant_b, timeout=30)
    moved = [obj for obj in env.kube.claims(tenant_a) if condition(obj).get("reason") == "Moved"]
    assert moved, [condition(obj) for obj in env.kube.claims(tenant_a)]
    # Refusals: B over its budget, A larger than any free room.
    env.kube.claim(tenant_b, "bravo-over", gpu_class, 1)
    env.kube.claim(tenant_a, "a-large", gpu_class, 4)
    for namespace, name, reason in (
        (tenant_b, "bravo-over", "BudgetExceeded"),
        (tenant_a, "a-large", "InsufficientCapacity"),
    ):
        wait_for(
            lambda namespace=namespace, name=name, reason=reason: (
                condition(env.kube.get_claim(namespace, name)).get("reason") == reason
            ),
            what=f"{name} refused for {reason}",
        )
    # A's moved hold loses its node.
    held_on = moved[0]["status"]["nodeName"]
    env.kube.core.delete_node(held_on)
    env.wait_phase(moved[0]["metadata"]["name"], "Lost", namespace=tenant_a)
    assert first != second
