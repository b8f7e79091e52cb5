"""The chart's policy on the ResourceClaims of dra classes (SPEC §13), on the real
kube-apiserver, as a tenant admin meets it: a ResourceClaim naming a GPUClaim as its
controller is the controller's to make, change and delete (a tenant reads its claim's uid,
so a copy of the reference would be counted as the claim's own); under
``rawResourceNames: forbidden`` a tenant's own ResourceClaim or ResourceClaimTemplate of a
DeviceClass a dra class is served from is refused, and one of another DeviceClass is not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import remove_policies, suffixed
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import dra
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.chart import helm_template, install_policies
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

RESOURCE = ("resource.k8s.io", "v1")
DRA_CLASS = "vfio.gpu.nvidia.com"


class Policy:
    def __init__(self, kube: Kube) -> None:
        self.id = uuid.uuid4().hex[:8]
        self.release = f"ctl-dra-{self.id}"
        self.tenant = f"tenant-{self.id}"
        kube.namespace(self.release)
        kube.namespace(self.tenant, {f"tenant.cozystack.io/{self.tenant}": ""})
        values = {"controller": {"settings": {"rawResourceNames": "forbidden"}}}
        self.objects = suffixed(
            helm_template("dra-claims-policy.yaml", self.release, values), self.id
        )
        data = {
            keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: "forbidden",
            keys.SETTINGS_KEY_DRA_DEVICE_CLASSES: DRA_CLASS,
        }
        kube.core.create_namespaced_config_map(
            self.release, {"metadata": {"name": keys.SETTINGS_CONFIGMAP}, "data": data}
        )
        self.kube = kube
        self.admin = tenants.as_tenant_admin(kube.api, f"admin-{self.tenant}", [self.tenant])
        self.installed = False

    def install(self) -> None:
        """The policy installed, once the API server enforces it (a probe is refused)."""
        install_policies(self.kube.api, self.objects)
        self.installed = True
        wait_for(self._enforced, 30, "the dra-claims policy to be enforced", interval=0.2)

    def _enforced(self) -> bool:
        """A tenant's own ResourceClaim of the GPU classes' DeviceClass is refused."""
        custom = client.CustomObjectsApi(self.admin.api)
        name = f"probe-{uuid.uuid4().hex[:8]}"
        try:
            custom.create_namespaced_custom_object(
                *RESOURCE, self.tenant, "resourceclaims", _claim(DRA_CLASS, name)
            )
        except ApiException as exc:
            return exc.status in (403, 422)
        custom.delete_namespaced_custom_object(*RESOURCE, self.tenant, "resourceclaims", name)
        return False

    def close(self) -> None:
        """The policy removed, once the API server no longer enforces it: policies are
        cluster-wide, and one still in force would refuse the next test's own writes."""
        if self.installed:
            remove_policies(self.kube.api, self.objects)
            wait_for(lambda: not self._enforced(), 30, "the dra-claims policy gone", interval=0.2)


@pytest.fixture
def policy(kube: Kube) -> Iterator[Policy]:
    made = Policy(kube)
    try:
        yield made
    finally:
        made.close()


def _claim(device_class: str, name: str = "mine") -> dict[str, Any]:
    request = {"name": "gpu", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [request]}},
    }


def _refused(call: Any) -> str:
    with pytest.raises(ApiException) as info:
        call()
    assert info.value.status in (403, 422), info.value.body
    return str(info.value.body)


def _create(kube: Kube, namespace: str, plural: str, body: dict[str, Any]) -> Any:
    return lambda: client.CustomObjectsApi(kube.api).create_namespaced_custom_object(
        *RESOURCE, namespace, plural, body
    )


def test_a_tenants_own_resource_claim_of_a_dra_device_class_is_refused_under_forbidden(
    policy: Policy,
) -> None:
    policy.install()
    said = _refused(_create(policy.admin, policy.tenant, "resourceclaims", _claim(DRA_CLASS)))
    assert f"DeviceClass {DRA_CLASS} serves GPU classes" in said
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {"spec": _claim(DRA_CLASS)["spec"]},
    }
    assert "serves GPU classes" in _refused(
        _create(policy.admin, policy.tenant, "resourceclaimtemplates", template)
    )
    _create(policy.admin, policy.tenant, "resourceclaims", _claim("nic.example.com"))()


def test_only_the_controller_makes_and_deletes_the_resource_claim_of_a_gpu_claim(
    policy: Policy,
) -> None:
    """The tenant admin reads its claim's uid and copies the controller reference."""
    # A real claim, so the garbage collector leaves the ResourceClaim it owns alone.
    claim = policy.kube.claim(policy.tenant, "c", "h100", 1)
    made = dra.resource_claim_for(claim, dra.DraSource("nic.example.com"))
    # One as the controller makes it, there before the policy (the cluster admin stands
    # for the controller here).
    _create(policy.kube, policy.tenant, "resourceclaims", made)()
    policy.install()
    forged = {**made, "metadata": {**made["metadata"], "name": "copy"}}
    said = _refused(_create(policy.admin, policy.tenant, "resourceclaims", forged))
    assert "only the controller makes and changes the ResourceClaim of a GPUClaim" in said
    said = _refused(
        lambda: client.CustomObjectsApi(policy.admin.api).delete_namespaced_custom_object(
            *RESOURCE, policy.tenant, "resourceclaims", "c"
        )
    )
    assert "delete the GPUClaim instead" in said
