"""The controller's /metrics holds the inventory (capacity and held units per node and
class) that GPUClass status keeps from tenants: a tenant's pod, or anything else that can
reach the port, must not read it (SPEC.md §7, issue 27 item 4).

A real replica (``python -m cozystack_gpu``) is scraped the ways a tenant pod can try it:
plain HTTP as ``curl http://cozystack-gpu-metrics.<ns>:9090/metrics`` does, HTTPS without a
token, with a forged token, and with the token of its own ServiceAccount, which its tenant
admin gave every right of the namespace (the built-in ``admin`` role, into which the
chart's tenant roles aggregate). Only a ServiceAccount bound to the chart's
``cozystack-gpu-metrics-reader`` by the chart's ClusterRoleBinding, as a hoster binds its
Prometheus, reads the metrics. The API server itself reviews every token (TokenReview,
SubjectAccessReview).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from admission_env import MetricsReader
from binder_env import Corner
from kubernetes import client

from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.metrics_scrape import scrape_plain
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for

pytestmark = pytest.mark.apiserver

INVENTORY = "cozystack_gpu_node_units"


@pytest.fixture
def world(control_plane: ControlPlane, api_client: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    install_extra_crds(api_client)
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    namespace, tenant = f"mx-{test_id}", f"tenant-{test_id}"
    kube.namespace(namespace)
    kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
    made: dict[str, Any] = {"kube": kube, "id": test_id, "tenant": tenant}
    try:
        made["reader"] = MetricsReader(kube, namespace, test_id)
        made["replica"] = ControllerProcess(
            control_plane, namespace, "mx-0", tmp_path, metrics=True
        )
        yield made
    finally:
        if "replica" in made:
            made["replica"].stop()
        if "reader" in made:
            made["reader"].delete()
        # The cluster is shared: its namespaces, labelled nodes and class go.
        Corner(kube, test_id, tenant, namespace).clean_up()


def tenant_pod_token(kube: Kube, reader: MetricsReader, tenant: str) -> str:
    """The token of a tenant pod's ServiceAccount whose tenant admin bound it to ``admin``
    in the namespace: every right a tenant can hand out."""
    kube.core.create_namespaced_service_account(tenant, {"metadata": {"name": "app"}})
    client.RbacAuthorizationV1Api(kube.api).create_namespaced_role_binding(
        tenant,
        {
            "metadata": {"name": "app-admin"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": tenant}],
        },
    )
    return reader.token_of(tenant, "app")


def test_a_tenant_pod_cannot_read_the_inventory_from_the_metrics_endpoint(
    world: dict[str, Any],
) -> None:
    kube: Kube = world["kube"]
    replica: ControllerProcess = world["replica"]
    reader: MetricsReader = world["reader"]
    test_id: str = world["id"]
    resource = f"nvidia.com/GPU_{test_id}"
    selector = {"test.cozystack.io/id": test_id}
    node = f"mx-{test_id}"
    kube.gpu_node(node, resource, 4, labels=selector)
    kube.gpu_class(f"h100-{test_id}", resource, selector=selector)

    # What the issue reproduced: plain HTTP, no token, from any pod.
    def plain() -> Any:
        answer = scrape_plain(replica.metrics_port)
        return answer if not isinstance(answer, ConnectionRefusedError) else None

    answer = wait_for(plain, 30, "the metrics port to listen")
    assert isinstance(answer, Exception), (
        f"a tenant pod read the metrics over plain HTTP without a token: {answer[0]}, "
        f"{answer[1].count(INVENTORY)} lines of per-node inventory"
    )

    # The hoster's Prometheus (bound to the reader role) sees the node's units.
    inventory = f'{INVENTORY}{{node="{node}",resource="{resource}",state="capacity"}} 4.0'
    seen = wait_for(
        lambda: inventory in replica.metrics(reader.token) and replica.metrics(reader.token),
        30,
        "the reader to see the node's capacity",
    )
    assert "cozystack_gpu_binder_leader 1.0" in seen

    # Every other client: 401 without a valid token, 403 without the grant.
    tenant_token = tenant_pod_token(kube, reader, world["tenant"])
    tries = {
        "no token": (None, 401),
        "a forged token": ("eyJhbGciOiJSUzI1NiJ9.e30.forged", 401),
        "the tenant pod's ServiceAccount token (admin of its namespace)": (tenant_token, 403),
    }
    for what, (token, wanted) in tries.items():
        status, body = replica.scrape(token)
        assert INVENTORY not in body, f"{what} read the inventory: {body[:300]}"
        assert status == wanted, f"{what}: {status} {body}"
        assert "cozystack-gpu-metrics-reader" in body, body  # the refusal names the fix
    status, body = replica.scrape(tenant_token)
    assert f"system:serviceaccount:{world['tenant']}:app may not get /metrics" in body, body
