"""The chart's launcher-gate policy on the real kube-apiserver (rendered with ``helm
template``), attacked as a tenant admin with the built-in ``admin`` role, which lets it
patch its own pods (issue 41, item 1).

Ungated by the tenant, a launcher pod reached kube-scheduler unpinned and took the one unit
of a node that another tenant's stopped VM held (that claim went Lost, the attacker was
charged nothing); given ``system-node-critical``, it had kube-scheduler preempt another
tenant's running launcher pod. Only the controller removes the gate now, and a gated pod
may not preempt.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from admission_env import helm_template, refusal, remove_policies, suffixed
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.chart import install_policies
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

TENANT_ADMIN = "tenant-admin"
CONTROLLER = "system:serviceaccount:{release}:cozystack-gpu-controller"
UNGATE = {"spec": {"schedulingGates": None}}


@dataclass
class GatePolicy:
    namespace: str
    controller: str
    tenant: Kube
    as_controller: Kube
    priority_class: str
    never_class: str


def _gated_pod(name: str, priority_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "compute", "image": "virt-launcher"}],
        "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"metadata": {"name": name}, "spec": spec}


@pytest.fixture
def gate_policy(kube: Kube, control_plane: ControlPlane) -> Iterator[GatePolicy]:
    test_id = uuid.uuid4().hex[:8]
    release, namespace = f"ctl-gate-{test_id}", f"tenant-gate-{test_id}"
    kube.namespace(release)
    kube.namespace(namespace, {f"tenant.cozystack.io/{namespace}": ""})
    controller = CONTROLLER.format(release=release)
    rbac = client.RbacAuthorizationV1Api(kube.api)
    # The built-in admin role, as a tenant admin gets it in its namespace (pods: patch).
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "admin",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                for user in (TENANT_ADMIN, controller)
            ],
        },
    )
    for user in (TENANT_ADMIN, controller):
        tenants.wait_granted(kube.api, user, "patch", "pods", namespace=namespace)
    scheduling = client.SchedulingV1Api(kube.api)
    urgent, never = f"urgent-{test_id}", f"urgent-never-{test_id}"
    scheduling.create_priority_class({"metadata": {"name": urgent}, "value": 1_000_000})
    scheduling.create_priority_class(
        {"metadata": {"name": never}, "value": 1_000_000, "preemptionPolicy": "Never"}
    )
    objects = suffixed(helm_template("launcher-gate-policy.yaml", release), test_id)
    for obj in objects:
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            # This test's namespace only: the shared plane's other tests ungate as admin.
            obj["spec"]["matchResources"] = {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            }
    install_policies(kube.api, objects)
    policy = GatePolicy(
        namespace,
        controller,
        tenants.impersonating(control_plane.api_client(), TENANT_ADMIN),
        tenants.impersonating(control_plane.api_client(), controller),
        urgent,
        never,
    )
    try:
        kube.core.create_namespaced_pod(namespace, _gated_pod("probe"))

        def enforced() -> bool:
            try:
                policy.tenant.core.patch_namespaced_pod("probe", namespace, UNGATE, dry_run="All")
            except ApiException as exc:
                return "removes the scheduling gate" in refusal(exc)
            return False

        wait_for(enforced, 30, "the launcher-gate policy to be enforced")
        yield policy
    finally:
        remove_policies(kube.api, objects)
        scheduling.delete_priority_class(urgent)
        scheduling.delete_priority_class(never)


def test_a_tenant_admin_cannot_ungate_its_own_launcher_pod(
    kube: Kube, gate_policy: GatePolicy
) -> None:
    ns = gate_policy.namespace
    kube.core.create_namespaced_pod(ns, _gated_pod("virt-launcher-vm"))
    with pytest.raises(ApiException) as caught:
        gate_policy.tenant.core.patch_namespaced_pod("virt-launcher-vm", ns, UNGATE)
    message = refusal(caught.value)
    assert f"only the GPU controller ({gate_policy.controller}) removes the scheduling gate" in (
        message
    ), message
    assert "pod virt-launcher-vm" in message, message
    pod = kube.core.read_namespaced_pod("virt-launcher-vm", ns)
    assert [g.name for g in pod.spec.scheduling_gates] == [keys.SCHEDULING_GATE_CLAIMS]
    # Any other change of its own pod is the tenant's: a label, the gate kept.
    gate_policy.tenant.core.patch_namespaced_pod(
        "virt-launcher-vm", ns, {"metadata": {"labels": {"mine": "yes"}}}
    )
    # The controller ungates (with its pin, in the product) and the pod goes to the scheduler.
    gate_policy.as_controller.core.patch_namespaced_pod("virt-launcher-vm", ns, UNGATE)
    assert not kube.core.read_namespaced_pod("virt-launcher-vm", ns).spec.scheduling_gates


def test_a_gated_launcher_pod_may_not_preempt_another_tenants(
    kube: Kube, gate_policy: GatePolicy
) -> None:
    ns = gate_policy.namespace
    with pytest.raises(ApiException) as caught:
        gate_policy.tenant.core.create_namespaced_pod(
            ns, _gated_pod("urgent", gate_policy.priority_class)
        )
    message = refusal(caught.value)
    assert "may not preempt other pods for its GPUs" in message, message
    assert "has priority 1000000 (more than the 0 allowed)" in message, message
    # A PriorityClass that never preempts is the hoster's way to order starts.
    gate_policy.tenant.core.create_namespaced_pod(
        ns, _gated_pod("patient", gate_policy.never_class)
    )
    # A pod without the gate is not a launcher pod of a VM with claims: not judged here.
    plain = _gated_pod("plain", gate_policy.priority_class)
    plain["spec"].pop("schedulingGates")
    kube.core.create_namespaced_pod(ns, plain)
