"""Ready means synced: a replica that has not read the cluster yet is kept out of the
webhook Service (its /readyz answers 503) and, asked anyway, refuses an order retryably
instead of admitting it unchecked.

The replica runs as its own process under the chart's controller RBAC with one right
withheld (listing GPUNodes), so its first listing cannot complete until the test gives the
right back: a replica that is slow to read a large cluster, held still.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from admission_env import Corner, helm_template, refusal, serving
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu.admission.handle_catalog import NOT_SYNCED
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

ACCOUNT = "cozystack-gpu-controller"


class SlowIdentity:
    """The chart's controller ClusterRole under a suffixed name, without the list of
    GPUNodes, bound to a ServiceAccount of a namespace of its own (the Lease and ConfigMap
    rights of the chart's Role granted cluster-wide, as the replica's namespace is made
    later)."""

    def __init__(self, kube: Kube, plane: ControlPlane, tmp_path: Path) -> None:
        self.kube = kube
        self.rbac = client.RbacAuthorizationV1Api(kube.api)
        suffix = uuid.uuid4().hex[:6]
        self.namespace = f"ctl-slow-{suffix}"
        self.name = f"{ACCOUNT}-slow-{suffix}"
        kube.namespace(self.namespace)
        kube.core.create_namespaced_service_account(self.namespace, {"metadata": {"name": ACCOUNT}})
        rendered = helm_template("rbac-controller.yaml", self.namespace)
        self.rules: list[dict[str, Any]] = [
            rule
            for obj in rendered
            if obj["kind"] in ("ClusterRole", "Role")
            for rule in obj["rules"]
        ]
        self.rbac.create_cluster_role(
            {"metadata": {"name": self.name}, "rules": self.withheld_rules()}
        )
        self.rbac.create_cluster_role_binding(
            {
                "metadata": {"name": self.name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": self.name,
                },
                "subjects": [
                    {"kind": "ServiceAccount", "name": ACCOUNT, "namespace": self.namespace}
                ],
            }
        )
        self.kubeconfig = plane.service_account_kubeconfig(
            self.namespace, ACCOUNT, tmp_path / "slow.kubeconfig"
        )

    def withheld_rules(self) -> list[dict[str, Any]]:
        rules = []
        for rule in self.rules:
            if "gpunodes" in rule.get("resources", ()) and "list" in rule.get("verbs", ()):
                rule = {**rule, "resources": [r for r in rule["resources"] if r != "gpunodes"]}
            rules.append(rule)
        return rules

    def give_back(self) -> None:
        self.rbac.patch_cluster_role(self.name, {"rules": self.rules})

    def close(self) -> None:
        for delete in (self.rbac.delete_cluster_role_binding, self.rbac.delete_cluster_role):
            try:
                delete(self.name)
            except ApiException as exc:
                if exc.status != 404:
                    raise


def test_a_replica_that_has_not_read_the_cluster_is_not_ready_and_admits_no_order(
    control_plane: ControlPlane, kube: Kube, tmp_path: Path, namespace: str
) -> None:
    corner = Corner(kube)
    corner.node("n1", 1)
    gpu_class = corner.gpu_class("h100")
    slow = SlowIdentity(kube, control_plane, tmp_path)
    try:
        with serving(
            control_plane,
            kube,
            tmp_path,
            only=("gpuclaim.gpu.cozystack.io",),
            kubeconfig=slow.kubeconfig,
            wait_ready=False,
        ) as replica:
            assert replica.process is not None
            status, body = replica.process.ready()
            assert status == 503, f"a replica that has not listed GPUNodes is ready: {body}"
            assert "has not finished reading the cluster" in body, body

            with pytest.raises(ApiException) as caught:
                kube.claim(namespace, "early", gpu_class)
            said = refusal(caught.value)
            assert caught.value.status == 503, f"{caught.value.status}: {said}"
            assert NOT_SYNCED in said, said
            with pytest.raises(ApiException) as missing:
                kube.get_claim(namespace, "early")
            assert missing.value.status == 404, "an order was admitted unchecked"

            slow.give_back()
            wait_for(replica.is_ready, 30, "the replica ready once it could list GPUNodes")
            # Now judged: the one unit fits, two do not (the node is the class's largest).
            corner.order(namespace, "first", gpu_class)
            with pytest.raises(ApiException) as over:
                kube.claim(namespace, "second", gpu_class, 2)
            assert over.value.status == 403
            assert "allows at most 1 unit" in refusal(over.value), refusal(over.value)
    finally:
        slow.close()
