"""The controller under the RBAC it ships (controller/deploy/rbac.yaml), not as admin.

The controller's client impersonates the ServiceAccount the manifest binds, so a missing
rule fails the test the way it would fail in a cluster.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, utils
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY

from cozystack_gpu import keys
from cozystack_gpu.controller import Controller
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, wait_for
from cozystack_gpu_testkit.objects import binder_config as make_config

pytestmark = pytest.mark.apiserver

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"


def apply_rbac(api: Any, namespace: str) -> None:
    text = RBAC.read_text().replace("namespace: cozy-gpu", f"namespace: {namespace}")
    manifest = yaml.safe_load(text)
    for item in manifest["items"]:
        if item["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            item["metadata"]["name"] += f"-{namespace}"
            if item["kind"] == "ClusterRoleBinding":
                item["roleRef"]["name"] += f"-{namespace}"
        utils.create_from_dict(api, item)


def impersonating(plane: ControlPlane, namespace: str) -> Any:
    api = plane.api_client()
    api.set_default_header(
        "Impersonate-User", f"system:serviceaccount:{namespace}:cozystack-gpu-controller"
    )
    return api


def test_the_controller_binds_with_only_the_shipped_rbac(
    control_plane: ControlPlane, api_client: Any
) -> None:
    install_extra_crds(api_client)
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    namespace, tenant = f"ctl-{test_id}", f"tenant-{test_id}"
    kube.namespace(namespace)
    kube.namespace(tenant, {f"tenant.cozystack.io/{tenant}": ""})
    apply_rbac(api_client, namespace)
    api = impersonating(control_plane, namespace)

    # The identity really is limited: it may not touch what it has no rule for.
    with pytest.raises(ApiException) as denied:
        client.CoreV1Api(api).delete_namespace(tenant)
    assert denied.value.status == 403

    resource = f"nvidia.com/GPU_{test_id}"
    selector = {"test.cozystack.io/id": test_id}
    kube.gpu_node(f"n1-{test_id}", resource, 2, labels=selector)
    gpu_class = f"h100-{test_id}"
    kube.gpu_class(gpu_class, resource, selector=selector)

    controller = Controller(
        api,
        make_config(
            namespace,
            identity="rbac-test",
            lease_duration=4.0,
            renew_deadline=3.0,
            retry_period=0.5,
            raw_resource_names=RawNamesPolicy.FORBIDDEN,
            attachment_grace=1.0,
        ),
    )
    controller.start()
    try:
        wait_for(lambda: controller.health()["synced"], timeout=30, what="leader and sync")
        kube.claim(tenant, "vm-gpu", gpu_class, 2)
        # A template claim whose VMI is gone (here: never was) goes, under this RBAC too.
        kube.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, tenant, keys.PLURAL_CLAIMS,
            {
                "apiVersion": keys.API_VERSION, "kind": keys.KIND_CLAIM,
                "metadata": {
                    "name": "left-over",
                    "labels": {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE},
                    "annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: str(uuid.uuid4())},
                },
                "spec": {"class": gpu_class, "count": 1},
            },
        )  # fmt: skip

        def bound() -> dict[str, Any] | None:
            obj = kube.get_claim(tenant, "vm-gpu")
            return obj if (obj.get("status") or {}).get("phase") == "Bound" else None

        wait_for(bound, what="a bind under the shipped RBAC")
        records = wait_for(
            lambda: kube.custom.list_namespaced_custom_object(
                keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, tenant, keys.WORKLOAD_PLURAL
            )["items"],
            what="a usage record under the shipped RBAC",
        )
        assert records[0]["status"]["resources"] == {keys.quota_key(gpu_class): "2"}
        # An edited record is written back under the same rights.
        record_args = (keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, tenant, keys.WORKLOAD_PLURAL)
        kube.custom.patch_namespaced_custom_object(
            *record_args, "gpuclaim-vm-gpu", {"status": {"operational": False}}
        )

        def operational() -> bool:
            record = kube.custom.get_namespaced_custom_object(*record_args, "gpuclaim-vm-gpu")
            return (record.get("status") or {}).get("operational") is True

        wait_for(operational, what="the edited record written back under the RBAC", timeout=10)
        wait_for(
            lambda: "left-over" not in {c["metadata"]["name"] for c in kube.claims(tenant)},
            what="a left-over template claim deleted under the shipped RBAC",
        )
        settings = wait_for(
            lambda: _settings(kube, namespace), what="the settings ConfigMap under RBAC"
        )
        assert settings[keys.SETTINGS_KEY_RAW_RESOURCE_NAMES] == "forbidden"
        assert resource in settings[keys.SETTINGS_KEY_RESOURCE_NAMES].split(",")
        lease = client.CoordinationV1Api(api_client).read_namespaced_lease(
            keys.LEASE_NAME_BINDER, namespace
        )
        assert lease.spec.holder_identity == "rbac-test"
        # Metrics of what was decided.
        binds = REGISTRY.get_sample_value("cozystack_gpu_binder_decisions_total", {"step": "Bind"})
        assert binds is not None and binds >= 1
        assert REGISTRY.get_sample_value("cozystack_gpu_binder_leader") == 1.0
    finally:
        controller.stop()
    assert REGISTRY.get_sample_value("cozystack_gpu_binder_leader") == 0.0
    released = client.CoordinationV1Api(api_client).read_namespaced_lease(
        keys.LEASE_NAME_BINDER, namespace
    )
    assert not released.spec.holder_identity, "a clean stop hands the Lease back"


def _settings(kube: Kube, namespace: str) -> dict[str, str] | None:
    try:
        cm = kube.core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, namespace)
    except ApiException:
        return None
    return dict(cm.data)


def test_the_licence_copier_works_with_only_the_shipped_rbac(
    control_plane: ControlPlane, api_client: Any
) -> None:
    kube = Kube(api_client)
    test_id = uuid.uuid4().hex[:8]
    namespace, tenant = f"ctl-{test_id}", f"tenant-{test_id}"
    kube.namespace(namespace)
    kube.namespace(
        tenant,
        {f"tenant.cozystack.io/{tenant}": "", keys.LABEL_VGPU_ENTITLEMENT: "true"},
    )
    apply_rbac(api_client, namespace)
    kube.core.create_namespaced_secret(
        namespace,
        {
            "metadata": {
                "name": "nls",
                "labels": {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK},
            },
            "data": {keys.LICENSE_TOKEN_KEY: "dG9rZW4="},
        },
    )
    gpu_class = f"l40s-{test_id}"
    kube.gpu_class(
        gpu_class,
        f"nvidia.com/L40S_{test_id}",
        mode="vgpu",
        license={"secretRef": {"name": "nls", "key": keys.LICENSE_TOKEN_KEY}},
    )
    controller = Controller(
        impersonating(control_plane, namespace),
        make_config(
            namespace, identity="rbac-licence", lease_duration=4.0, renew_deadline=3.0,
            retry_period=0.5,
        ),
    )  # fmt: skip
    controller.start()
    name = keys.license_copy_name(gpu_class)

    def copied() -> bool:
        try:
            secret = kube.core.read_namespaced_secret(name, tenant)
        except ApiException:
            return False
        return bool(secret.data[keys.LICENSE_TOKEN_KEY] == "dG9rZW4=")

    try:
        wait_for(copied, what="the licence copy under the shipped RBAC")
        kube.core.delete_namespaced_secret(name, tenant)
        wait_for(copied, what="the deleted copy put back under the shipped RBAC")

        # The copier's condition and the binder's beside it on one class: each writes the
        # whole list, and neither may drop the other's for good.
        def both() -> dict[str, str] | None:
            obj = kube.custom.get_cluster_custom_object(
                keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
            )
            conds = {
                c["type"]: c["reason"] for c in (obj.get("status") or {}).get("conditions") or []
            }
            wanted = {keys.CONDITION_AVAILABLE, keys.CONDITION_LICENSE_READY}
            return conds if wanted <= set(conds) else None

        conds = wait_for(both, what="the class's Available and LicenseReady conditions")
        assert conds[keys.CONDITION_LICENSE_READY] == keys.LicenseReason.COPIED.value
        assert controller.problems() == []
    finally:
        controller.stop()
        kube.custom.delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
        )
