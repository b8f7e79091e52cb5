"""The identities the chart gives the actors of docs/security.md, for the attack tests: each
acts through the real API server, which judges its rights (impersonation), so a test that
passes shows what that actor can really do, not what a fixture let it."""

from __future__ import annotations

from typing import Any

from admission_env import helm_template
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, wait_for

RBAC_GROUP = "rbac.authorization.k8s.io"
# What KubeVirt's kubevirt.io:admin role (aggregated into admin) gives a tenant admin on
# VMs, which the test platform's virt-operator stand-in does not install.
KUBEVIRT_ADMIN = "attack-kubevirt-admin"


def impersonating(plane: ControlPlane, user: str) -> Kube:
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return Kube(api)


def _create(create: Any, body: dict[str, Any]) -> None:
    """Create a cluster-scoped object the same in every test (the chart's own role), once."""
    try:
        create(body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def tenant_admin(plane: ControlPlane, kube: Kube, user: str, *namespaces: str) -> Kube:
    """``user`` as a tenant's administrator: the built-in ``admin`` ClusterRole, into which
    the chart's ``rbac-tenant.yaml`` roles aggregate (rendered by ``helm template``, as a
    hoster installs them), bound in each of ``namespaces``, with KubeVirt's VM rights."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    for obj in helm_template("rbac-tenant.yaml", "cozy-gpu"):
        if obj["kind"] == "ClusterRole":
            _create(rbac.create_cluster_role, obj)
        elif obj["kind"] == "ClusterRoleBinding":
            _create(rbac.create_cluster_role_binding, obj)
    _create(
        rbac.create_cluster_role,
        {
            "metadata": {"name": KUBEVIRT_ADMIN},
            "rules": [
                {
                    "apiGroups": [keys.KUBEVIRT_GROUP],
                    "resources": ["virtualmachines", "virtualmachineinstances"],
                    "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                }
            ],
        },
    )
    subject = {"apiGroup": RBAC_GROUP, "kind": "User", "name": user}
    for namespace in namespaces:
        for role in ("admin", KUBEVIRT_ADMIN):
            rbac.create_namespaced_role_binding(
                namespace,
                {
                    "metadata": {"name": f"{user}-{role}"},
                    "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
                    "subjects": [subject],
                },
            )

    def aggregated() -> bool:
        admin = rbac.read_cluster_role("admin")
        return any(keys.PLURAL_CLAIMS in (r.resources or []) for r in admin.rules or [])

    wait_for(aggregated, 60, "the chart's claim rights aggregated into admin", 0.2)
    return impersonating(plane, user)
