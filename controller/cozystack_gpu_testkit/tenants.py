"""Tenants as a cluster makes them: a user bound to the built-in ``admin`` role in its own
namespaces, into which the chart's claim roles and KubeVirt's VM rights aggregate, and a
tenant's pod, calling with its ServiceAccount's token. One way for the demo, the lifecycle
fuzz and the attack tests to act as a tenant, through the API server (impersonation, or the
token), so what a tenant can do is what the API server lets it do."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes import client

from cozystack_gpu import keys
from cozystack_gpu_testkit.chart import helm_template
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

RBAC = "rbac.authorization.k8s.io"
# KubeVirt's virt-operator installs kubevirt.io:admin, aggregated into admin; a platform
# without it (the test plane, the demo's) gets this equivalent.
KUBEVIRT_ADMIN = "kubevirt.io:admin"
KUBEVIRT_ADMIN_STAND_IN = "cozystack-gpu-kubevirt-admin"


def impersonating(api: client.ApiClient, user: str) -> Kube:
    """``api`` (a client of its own: the header stays on it) acting as ``user``."""
    api.set_default_header("Impersonate-User", user)
    return Kube(api)


def allowed(
    api: client.ApiClient, user: str, verb: str, resource: str, *,
    namespace: str | None = None, group: str = "", groups: Iterable[str] = (),
) -> bool:  # fmt: skip
    """Whether the API server's authorizer lets ``user`` (in ``groups``) ``verb`` the
    ``resource`` of API ``group`` (in ``namespace``): a SubjectAccessReview."""
    attributes = {"verb": verb, "group": group, "resource": resource}
    if namespace is not None:
        attributes["namespace"] = namespace
    review = client.AuthorizationV1Api(api).create_subject_access_review(
        {"spec": {"user": user, "groups": list(groups), "resourceAttributes": attributes}}
    )
    return bool(review.status.allowed)


def wait_granted(
    api: client.ApiClient, user: str, verb: str, resource: str, *,
    namespace: str | None = None, group: str = "", groups: Iterable[str] = (),
) -> None:  # fmt: skip
    """Returns once ``user`` may ``verb`` the ``resource``. The authorizer reads RBAC
    through its informers, so a binding just written counts a moment later: a request sent
    at once was refused 403 in CI (a tenant's first pod create)."""
    groups = tuple(groups)
    wait_for(
        lambda: allowed(api, user, verb, resource, namespace=namespace, group=group, groups=groups),
        15,
        f"{user} allowed to {verb} {resource} in {namespace or 'the cluster'} (RBAC)",
    )


def _create(create: Any, body: Mapping[str, Any]) -> None:
    """Create an object that is the same for every caller, once (409: already there)."""
    unless(409, lambda: create(dict(body)))


def grant_tenant_admin(
    api: client.ApiClient, chart_roles: Iterable[Mapping[str, Any]], user: str,
    namespaces: Iterable[str], *, labels: Mapping[str, str] | None = None,
) -> None:  # fmt: skip
    """``user`` as the administrator of ``namespaces``: ``admin`` bound there, with the
    chart's tenant roles (``chart_roles``, ``rbac-tenant.yaml`` as helm renders it) and
    KubeVirt's VM rights aggregated into it, as they are in a cluster. ``labels`` go on the
    KubeVirt stand-in where it makes one (the demo's mark)."""
    rbac = client.RbacAuthorizationV1Api(api)
    # The chart's aggregated roles only: its ClusterRoleBinding of the catalog to
    # system:authenticated is every user's, not a tenant admin's, and left behind on a
    # shared plane it would let any user read GPUClass.
    for obj in chart_roles:
        if obj["kind"] == "ClusterRole" and "aggregationRule" not in obj:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            if any(k.startswith(f"{RBAC}/aggregate-to-") for k in labels):
                _create(rbac.create_cluster_role, obj)
    if unless(404, lambda: rbac.read_cluster_role(KUBEVIRT_ADMIN)) is None:
        _create(
            rbac.create_cluster_role,
            {
                "metadata": {
                    "name": KUBEVIRT_ADMIN_STAND_IN,
                    "labels": {f"{RBAC}/aggregate-to-admin": "true", **(labels or {})},
                },
                "rules": [
                    {
                        "apiGroups": [keys.KUBEVIRT_GROUP],
                        # kubevirt.io:admin's, which a tenant's migrations need too.
                        "resources": [
                            "virtualmachines",
                            "virtualmachineinstances",
                            "virtualmachineinstancemigrations",
                        ],
                        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
                    }
                ],
            },
        )
    namespaces = tuple(namespaces)
    for namespace in namespaces:
        _create(
            lambda body, namespace=namespace: rbac.create_namespaced_role_binding(namespace, body),
            {
                "metadata": {"name": f"{user}-admin"},
                "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "admin"},
                "subjects": [{"apiGroup": RBAC, "kind": "User", "name": user}],
            },
        )

    def aggregated() -> bool:
        rules = rbac.read_cluster_role("admin").rules or []
        resources = {r for rule in rules for r in rule.resources or []}
        return {keys.PLURAL_CLAIMS, "virtualmachines"} <= resources

    wait_for(aggregated, 60, "the chart's claim rights and VM rights aggregated into admin", 0.2)
    for namespace in namespaces:
        wait_granted(api, user, "create", keys.PLURAL_CLAIMS, namespace=namespace,
                     group=keys.GROUP)  # fmt: skip


def as_tenant_admin(api: client.ApiClient, user: str, namespaces: Iterable[str]) -> Kube:
    """``user`` made the administrator of ``namespaces`` (``grant_tenant_admin``, with the
    chart's tenant roles as helm renders them), and the API as that user: a client of its
    own, so ``api`` keeps the admin's identity. What the attack tests call a tenant admin."""
    roles = helm_template("rbac-tenant.yaml", "cozy-gpu")
    grant_tenant_admin(api, roles, user, namespaces)
    return impersonating(client.ApiClient(api.configuration), user)


def as_tenant_pod(
    api: client.ApiClient, namespace: str, account: str = "app", role: str = "edit"
) -> Kube:
    """A pod of ``namespace`` that its tenant lets make pods: ServiceAccount ``account``,
    bound there to the built-in ``role`` (``edit`` writes pods, as a tenant admin may grant
    its own workloads), and the API as such a pod calls it, with a token of that account
    (a TokenRequest, as kubelet projects one) and no other credential. The chart grants a
    pod nothing itself."""
    user = f"system:serviceaccount:{namespace}:{account}"
    core = client.CoreV1Api(api)
    _create(
        lambda body: core.create_namespaced_service_account(namespace, body),
        {"metadata": {"name": account}},
    )
    _create(
        lambda body: client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(
            namespace, body
        ),
        {
            "metadata": {"name": f"{account}-{role}"},
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    )
    wait_granted(api, user, "create", "pods", namespace=namespace)
    token = core.create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    # The server and its CA from the admin's configuration; no client certificate.
    configuration = client.Configuration()
    configuration.host = api.configuration.host
    configuration.ssl_ca_cert = api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    pod = client.ApiClient(configuration)
    # The API server reads the token as the account's, not as anyone more trusted.
    review = client.AuthenticationV1Api(pod).create_self_subject_review({})
    assert review.status.user_info.username == user, review.status.user_info
    return Kube(pod)
