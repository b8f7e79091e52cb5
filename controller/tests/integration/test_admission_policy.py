"""The chart's ValidatingAdmissionPolicies on the real kube-apiserver (rendered with
``helm template``): the raw-name policy under ``allowed`` and ``forbidden``, with
virt-controller's exception and impersonated tenants; and the claims-label policy, which
keeps the claims annotation and the webhooks' reference label together."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import (
    Corner,
    create_vmi,
    helm_template,
    refusal,
    remove_policies,
    serving,
    suffixed,
    vmi_body,
)
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import gate
from cozystack_gpu.objects.annotation import TemplateEntry
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.chart import install_policies
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

TENANT = "tenant-user"
VIRT_CONTROLLER = "system:serviceaccount:kubevirt-{id}:kubevirt-controller"


def grant(kube: Kube, namespace: str, *users: str) -> None:
    """What a tenant admin and virt-controller may do in the namespace, for these users."""
    rbac = client.RbacAuthorizationV1Api(kube.api)
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "workloads"},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get"]},
                {
                    "apiGroups": ["kubevirt.io"],
                    "resources": ["virtualmachineinstances", "virtualmachines"],
                    "verbs": ["create", "get"],
                },
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "workloads"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "workloads",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u} for u in users
            ],
        },
    )
    for user in users:
        tenants.wait_granted(kube.api, user, "create", "pods", namespace=namespace)


# --- the raw-name policy -----------------------------------------------------------------


class RawNames:
    """The chart's raw-name policy bound to a settings ConfigMap the test writes, as the
    controller would, in the release namespace; rendered with ``rawResourceNames`` as
    ``rendered_as`` (a hoster's forbidden makes the binding fail closed)."""

    def __init__(self, kube: Kube, plane: ControlPlane, rendered_as: str = "allowed") -> None:
        self.kube = kube
        self.id = uuid.uuid4().hex[:8]
        self.release = f"ctl-raw-{self.id}"
        self.virt_controller = VIRT_CONTROLLER.format(id=self.id)
        self.resource = f"nvidia.com/RAW_{self.id}"
        kube.namespace(self.release)
        self.objects = suffixed(
            helm_template(
                "raw-names-policy.yaml",
                self.release,
                {
                    "rawNamePolicy": {"virtControllerUser": self.virt_controller},
                    "controller": {"settings": {"rawResourceNames": rendered_as}},
                },
            ),
            self.id,
        )
        self.settings(rendered_as)
        install_policies(kube.api, self.objects)

    def settings(self, policy: str) -> None:
        body = {
            "metadata": {"name": keys.SETTINGS_CONFIGMAP},
            "data": {
                keys.SETTINGS_KEY_RESOURCE_NAMES: keys.format_resource_names(
                    [self.resource, "nvidia.com/OTHER_" + self.id]
                ),
                keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: policy,
            },
        }
        try:
            self.kube.core.create_namespaced_config_map(self.release, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.kube.core.replace_namespaced_config_map(
                keys.SETTINGS_CONFIGMAP, self.release, body
            )

    def close(self) -> None:
        remove_policies(self.kube.api, self.objects)


@pytest.fixture
def raw(kube: Kube, control_plane: ControlPlane) -> Iterator[RawNames]:
    policy = RawNames(kube, control_plane)
    try:
        yield policy
    finally:
        policy.close()


@pytest.fixture
def tenant_ns(kube: Kube, raw: RawNames) -> str:
    name = f"tenant-{raw.id}"
    kube.namespace(name, {f"tenant.cozystack.io/{name}": ""})
    grant(kube, name, TENANT, raw.virt_controller)
    return name


def raw_vmi(name: str, resource: str, where: str = "gpus") -> dict[str, Any]:
    devices: dict[str, Any] = {}
    domain: dict[str, Any] = {"devices": devices, "memory": {"guest": "1Gi"}}
    if where in ("gpus", "hostDevices"):
        devices[where] = [{"name": "gpu1", "deviceName": resource}]
    else:
        domain["resources"] = {"requests": {resource: "1"}, "limits": {resource: "1"}}
    return vmi_body(name, labelled=False, spec={"domain": domain})


def launcher(
    name: str, resource: str, vmi: dict[str, Any] | None, *, labelled: bool = False
) -> dict[str, Any]:
    """A pod asking for a GPU name: a virt-launcher pod when ``vmi`` owns it, with the
    reference label when ``labelled`` (virt-controller copies it from a VMI that has it)."""
    metadata: dict[str, Any] = {"name": name, "labels": {}}
    if labelled:
        metadata["labels"][keys.LABEL_CLAIMS_REF] = keys.LABEL_CLAIMS_REF_VALUE
    if vmi is not None:
        metadata["labels"]["kubevirt.io"] = "virt-launcher"
        metadata["ownerReferences"] = [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "name": vmi["metadata"]["name"],
                "uid": vmi["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "compute",
                    "image": "quay.io/kubevirt/virt-launcher:v1.9.0",
                    "resources": {"requests": {resource: "1"}, "limits": {resource: "1"}},
                }
            ]
        },
    }


def forbidden(raw: RawNames, kube: Kube, namespace: str) -> None:
    """Switch to forbidden and wait until the API server enforces it."""
    raw.settings("forbidden")

    def enforced() -> bool:
        try:
            create_vmi(kube, namespace, raw_vmi("probe", raw.resource), dry_run="All")
        except ApiException as exc:
            return "forbidden without claims" in refusal(exc)
        return False

    wait_for(enforced, 30, "the raw-name policy to read rawResourceNames: forbidden")


RAW_VMI = (
    "GPU resource names are forbidden without claims (rawResourceNames: forbidden): {names} "
    "on VirtualMachineInstance {vmi}; order a GPUClaim and name it in the "
    "gpu.cozystack.io/claims annotation instead"
)
RAW_LAUNCHER = (
    "GPU resource names are forbidden without claims (rawResourceNames: forbidden): "
    "container(s) compute of virt-launcher pod {pod} in tenant namespace {ns} request one, "
    'but the pod lacks the label gpu.cozystack.io/claims: "true" of a VMI that uses claims; '
    "order a GPUClaim and name it in the VM's gpu.cozystack.io/claims annotation, with that "
    "label beside it"
)
RAW_POD = (
    "GPU resource names are forbidden without claims (rawResourceNames: forbidden): "
    "container(s) compute of a pod in tenant namespace {ns} request one; GPUs reach tenant "
    "workloads only through GPUClaims on VMs, in virt-launcher pods that KubeVirt creates"
)


def test_under_allowed_raw_gpu_names_are_admitted(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str
) -> None:
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    create_vmi(tenant, tenant_ns, raw_vmi("vm", raw.resource))
    tenant.core.create_namespaced_pod(tenant_ns, launcher("raw", raw.resource, None))


@pytest.mark.parametrize("where", ["gpus", "hostDevices", "resources"])
def test_under_forbidden_a_vmi_without_claims_may_not_name_a_gpu(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str, where: str
) -> None:
    forbidden(raw, kube, tenant_ns)
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    with pytest.raises(ApiException) as caught:
        create_vmi(tenant, tenant_ns, raw_vmi("vm", raw.resource, where))
    names = raw.resource if where != "resources" else f"{raw.resource}, {raw.resource}"
    assert refusal(caught.value).endswith(RAW_VMI.format(names=names, vmi="vm"))
    # A name that is no GPU's stays allowed.
    create_vmi(tenant, tenant_ns, raw_vmi("fpga", "example.com/fpga", where))


def test_under_forbidden_a_vmi_with_claims_passes_the_raw_name_policy(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str
) -> None:
    forbidden(raw, kube, tenant_ns)
    body = raw_vmi("vm", raw.resource)
    body["metadata"]["annotations"][keys.ANNOTATION_CLAIMS] = '{"claims": ["a"]}'
    body["metadata"]["labels"][keys.LABEL_CLAIMS_REF] = "true"
    # (No VMI webhook is configured here: the policy alone is under test.)
    create_vmi(
        tenants.impersonating(control_plane.api_client(), TENANT), tenant_ns, body, dry_run="All"
    )


def test_under_forbidden_a_tenant_pod_may_not_request_a_gpu(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str
) -> None:
    forbidden(raw, kube, tenant_ns)
    vmi = create_vmi(kube, tenant_ns, vmi_body("vm", labelled=False))
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    for name, owner in (("plain", None), ("forged-launcher", vmi)):
        with pytest.raises(ApiException) as caught:
            tenant.core.create_namespaced_pod(tenant_ns, launcher(name, raw.resource, owner))
        assert refusal(caught.value).endswith(RAW_POD.format(ns=tenant_ns)), name


def test_under_forbidden_virt_controller_starts_the_launcher_pod_of_a_vmi_with_claims(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str
) -> None:
    forbidden(raw, kube, tenant_ns)
    vmi = create_vmi(kube, tenant_ns, vmi_body("vm", {"claims": ["a"]}))
    controller = tenants.impersonating(control_plane.api_client(), raw.virt_controller)
    # (No pod webhook is configured here: the policy alone is under test.)
    controller.core.create_namespaced_pod(
        tenant_ns, launcher("virt-launcher-vm", raw.resource, vmi, labelled=True)
    )
    # Not owned by a VMI, not even virt-controller may.
    with pytest.raises(ApiException) as caught:
        controller.core.create_namespaced_pod(
            tenant_ns, launcher("loose", raw.resource, None, labelled=True)
        )
    assert refusal(caught.value).endswith(RAW_POD.format(ns=tenant_ns))


def test_under_forbidden_only_virt_controller_makes_a_migration_target_pod(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, tenant_ns: str
) -> None:
    """SPEC §12: a live migration's target pod is virt-controller's, as a launcher pod is. A
    tenant admin (``admin`` grants pods create) that forges one, with KubeVirt's migration
    label, the reference label and its own VMI as owner, still asks for a raw GPU name."""
    forbidden(raw, kube, tenant_ns)
    vmi = create_vmi(kube, tenant_ns, vmi_body("vm", {"claims": ["a"]}))

    def target(name: str) -> dict[str, Any]:
        body = launcher(name, raw.resource, vmi, labelled=True)
        body["metadata"]["labels"][keys.LABEL_MIGRATION_JOB_UID] = "5d0c2b8e"
        return body

    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    with pytest.raises(ApiException) as caught:
        tenant.core.create_namespaced_pod(tenant_ns, target("forged-target"))
    assert refusal(caught.value).endswith(RAW_POD.format(ns=tenant_ns))
    # (No pod webhook is configured here: the policy alone is under test.)
    controller = tenants.impersonating(control_plane.api_client(), raw.virt_controller)
    controller.core.create_namespaced_pod(tenant_ns, target("virt-launcher-vm-target"))


def test_under_forbidden_pods_outside_tenant_namespaces_are_not_judged(
    kube: Kube, raw: RawNames, namespace: str, tenant_ns: str
) -> None:
    forbidden(raw, kube, tenant_ns)
    kube.core.create_namespaced_pod(namespace, launcher("system", raw.resource, None))


def test_under_forbidden_a_missing_settings_configmap_still_refuses_a_raw_gpu_pod(
    kube: Kube, control_plane: ControlPlane
) -> None:
    """As a hoster installs it (rawResourceNames: forbidden), the policy's binding fails
    closed: with gpu-settings gone (deleted by hand, not yet written again by the leader)
    a tenant's raw GPU pod is refused, not admitted for want of a parameter. The
    controller's namespace is spared, so its replicas can start and write it again."""
    raw = RawNames(kube, control_plane, rendered_as="forbidden")
    tenant_ns = f"tenant-{raw.id}"
    kube.namespace(tenant_ns, {f"tenant.cozystack.io/{tenant_ns}": ""})
    grant(kube, tenant_ns, TENANT)
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    pod = launcher("raw", raw.resource, None)
    said: list[str] = []

    def refused(because: str) -> bool:
        said.clear()
        try:
            tenant.core.create_namespaced_pod(tenant_ns, pod, dry_run="All")
        except ApiException as exc:
            said[:] = [refusal(exc)]
            return because in said[0]
        return False

    try:
        wait_for(lambda: refused(RAW_POD.format(ns=tenant_ns)), 30, "the policy in force")

        kube.core.delete_namespaced_config_map(keys.SETTINGS_CONFIGMAP, raw.release)

        def refused_without_parameter() -> bool:
            if refused("no params found"):
                return True
            if said and said[0].endswith(RAW_POD.format(ns=tenant_ns)):
                return False  # the API server has not missed the ConfigMap yet
            raise AssertionError(
                f"a raw GPU pod ({raw.resource}) was admitted in tenant namespace {tenant_ns} "
                f"while gpu-settings was missing ({said})"
            )

        wait_for(refused_without_parameter, 30, "the policy to miss gpu-settings")
        assert "cozystack-gpu-raw-resource-names" in said[0], said[0]
        # The controller's namespace is spared: its replicas start while the object is gone.
        kube.core.create_namespaced_pod(
            raw.release,
            {
                "metadata": {"name": "replica"},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
            dry_run="All",
        )
    finally:
        # Written again, as the leader would within SETTINGS_REFRESH_S: every other pod of
        # the shared cluster outside the spared namespaces is refused meanwhile.
        raw.settings("forbidden")
        raw.close()


# --- the claims-label policy -------------------------------------------------------------

# An object uses claims iff it carries the reference label (keys.uses_claims): the claims
# annotation in any form without it, or the label without claims, is refused.
WITHOUT_LABEL = (
    "{what} carries the gpu.cozystack.io/claims annotation but lacks the label "
    'gpu.cozystack.io/claims: "true" that sends it to the GPU admission webhook, so it does '
    "not use claims; add the label, or remove the annotation"
)
WITHOUT_CLAIMS = (
    '{what} carries the label gpu.cozystack.io/claims: "true" but its '
    "gpu.cozystack.io/claims annotation is absent or blank; name its GPU claims there, or "
    "remove the label"
)


@pytest.fixture
def label_policy(kube: Kube, namespace: str) -> Iterator[str]:
    suffix = uuid.uuid4().hex[:8]
    objects = suffixed(helm_template("claims-label-policy.yaml", "cozy-gpu"), suffix)
    install_policies(kube.api, objects)
    try:
        body = vmi_body("probe", {"claims": ["a"]}, labelled=False)

        def enforced() -> bool:
            try:
                create_vmi(kube, namespace, body, dry_run="All")
            except ApiException as exc:
                return "lacks the label" in refusal(exc)
            return False

        wait_for(enforced, 30, "the claims-label policy to be enforced")
        yield namespace
    finally:
        remove_policies(kube.api, objects)
        forgotten(kube, namespace)


def forgotten(kube: Kube, namespace: str) -> None:
    """Until the API server stops enforcing a deleted claims-label policy (other tests'
    VMIs name claims without the label)."""
    body = vmi_body("probe", {"claims": ["a"]}, labelled=False)
    wait_for(lambda: admitted(kube, namespace, body), 30, "the policy to be forgotten")


def test_a_vmi_naming_claims_without_the_reference_label_is_refused(
    kube: Kube, label_policy: str
) -> None:
    with pytest.raises(ApiException) as caught:
        create_vmi(kube, label_policy, vmi_body("vm", {"claims": ["a"]}, labelled=False))
    assert refusal(caught.value).endswith(WITHOUT_LABEL.format(what="VirtualMachineInstance vm"))


def test_a_vm_template_naming_claims_without_the_label_is_refused(
    kube: Kube, label_policy: str
) -> None:
    template = vmi_body("vm", {"claims": ["a"]}, labelled=False)
    vm = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "vm"},
        "spec": {
            "runStrategy": "Halted",
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }
    with pytest.raises(ApiException) as caught:
        kube.custom.create_namespaced_custom_object(
            keys.VM.group, keys.VM.version, label_policy, keys.VM.plural, vm
        )
    assert refusal(caught.value).endswith(
        WITHOUT_LABEL.format(what="VirtualMachine vm (spec.template)")
    )


def test_the_claims_of_a_created_vmi_cannot_change(kube: Kube, label_policy: str) -> None:
    # (No webhook here: the VMI is stored as sent; the policy alone is under test.)
    create_vmi(kube, label_policy, vmi_body("vm", {"claims": ["a"]}))
    with pytest.raises(ApiException) as caught:
        kube.custom.patch_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, label_policy, keys.VMI.plural, "vm",
            {"metadata": {"annotations": {keys.ANNOTATION_CLAIMS: '{"claims": ["b"]}'}}},
        )  # fmt: skip
    assert refusal(caught.value).endswith(
        "the gpu.cozystack.io/claims annotation and label of VirtualMachineInstance vm are "
        "fixed when it is created; change them on its VirtualMachine and restart it"
    )
    # What KubeVirt writes on a running VMI passes.
    kube.vmi_phase(label_policy, "vm", "Scheduling")


def admitted(kube: Kube, namespace: str, body: dict[str, Any]) -> bool:
    try:
        create_vmi(kube, namespace, body, dry_run="All")
    except ApiException:
        return False
    return True


def test_a_vmi_stored_before_the_policy_can_still_be_updated(kube: Kube, namespace: str) -> None:
    legacy = vmi_body("legacy", {"claims": ["a"]}, labelled=False)
    # Policies of earlier tests may still be enforced a moment after their deletion.
    wait_for(lambda: admitted(kube, namespace, legacy), 30, "no claims-label policy")
    create_vmi(kube, namespace, legacy)
    suffix = uuid.uuid4().hex[:8]
    objects = suffixed(helm_template("claims-label-policy.yaml", "cozy-gpu"), suffix)
    install_policies(kube.api, objects)
    try:
        probe = vmi_body("probe", {"claims": ["a"]}, labelled=False)
        wait_for(lambda: not admitted(kube, namespace, probe), 30, "the claims-label policy")
        kube.vmi_phase(namespace, "legacy", "Running", "node-1")
    finally:
        remove_policies(kube.api, objects)
        forgotten(kube, namespace)


# --- one definition of "uses claims", under forbidden ------------------------------------

# Claims annotations that name no claim, each with what the VMI webhook says of it.
NO_CLAIMS = {
    "": "not JSON (Expecting value at position 0)",
    " \t": "not JSON (Expecting value at position 2)",
    "{}": "it names no claim and no claim template",
    '{"claims": []}': "it names no claim and no claim template",
    '{"claim": ["a"]}': "unknown member(s) 'claim'",
}
MALFORMED = "annotation gpu.cozystack.io/claims is malformed: {problem}; expected JSON like "
WEBHOOK_WITHOUT_ANNOTATION = (
    "VirtualMachineInstance vm carries the label gpu.cozystack.io/claims=true but no "
    "gpu.cozystack.io/claims annotation naming its GPU claims; add the annotation, or remove "
    "the label"
)


def shaped(body: dict[str, Any], annotation: str | None, *, labelled: bool) -> dict[str, Any]:
    """``body`` with exactly this claims annotation (None: none) and reference label."""
    metadata = body["metadata"]
    metadata["annotations"] = {} if annotation is None else {keys.ANNOTATION_CLAIMS: annotation}
    metadata["labels"] = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE} if labelled else {}
    return body


def vm_of(template: dict[str, Any]) -> dict[str, Any]:
    """A stopped VirtualMachine whose template is the VMI ``template``."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": template["metadata"]["name"]},
        "spec": {
            "runStrategy": "Halted",
            "template": {"metadata": template["metadata"], "spec": template["spec"]},
        },
    }


def refused_with(create: Any) -> str:
    with pytest.raises(ApiException) as caught:
        create()
    return refusal(caught.value)


@pytest.fixture
def guarded(
    kube: Kube,
    control_plane: ControlPlane,
    raw: RawNames,
    tenant_ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """The chart's admission as a hoster runs it under forbidden: both policies and the
    webhooks of a replica."""
    forbidden(raw, kube, tenant_ns)
    suffix = uuid.uuid4().hex[:8]
    objects = suffixed(helm_template("claims-label-policy.yaml", "cozy-gpu"), suffix)
    install_policies(kube.api, objects)
    try:
        probe = vmi_body("probe", {"claims": ["a"]}, labelled=False)
        wait_for(lambda: not admitted(kube, tenant_ns, probe), 30, "the claims-label policy")
        with serving(control_plane, kube, tmp_path_factory.mktemp("uses-claims")):
            yield tenant_ns
    finally:
        remove_policies(kube.api, objects)
        forgotten(kube, tenant_ns)


def test_under_forbidden_a_vmi_uses_claims_only_with_the_reference_label(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, guarded: str
) -> None:
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    vmi_name = "VirtualMachineInstance vm"

    def create(body: dict[str, Any]) -> Any:
        return lambda: create_vmi(tenant, guarded, body)

    # The hole: raw GPU entries under an annotation that names nothing, without the label.
    for annotation in NO_CLAIMS:
        body = shaped(raw_vmi("vm", raw.resource), annotation, labelled=False)
        message = refused_with(create(body))
        assert message.endswith(
            (
                WITHOUT_LABEL.format(what=vmi_name),
                RAW_VMI.format(names=raw.resource, vmi="vm"),
            )
        ), (annotation, message)
    # Without GPU entries the claims-label policy names the fix.
    for annotation in NO_CLAIMS:
        body = shaped(vmi_body("vm", labelled=False), annotation, labelled=False)
        assert refused_with(create(body)).endswith(WITHOUT_LABEL.format(what=vmi_name)), annotation
    # With the label the webhook judges the annotation, raw entries or not.
    for spec in (raw_vmi("vm", raw.resource), vmi_body("vm")):
        body = shaped(spec, None, labelled=True)
        assert refused_with(create(body)).endswith(WEBHOOK_WITHOUT_ANNOTATION)
        for annotation, problem in NO_CLAIMS.items():
            body = shaped(spec, annotation, labelled=True)
            message = refused_with(create(body))
            assert MALFORMED.format(problem=problem) in message, (annotation, message)


def test_under_forbidden_the_good_shapes_still_start(
    kube: Kube, control_plane: ControlPlane, guarded: str
) -> None:
    corner = Corner(kube)
    node = corner.node("n1", 1)
    gpu_class = corner.gpu_class("h100")
    corner.bound(guarded, "a", gpu_class, node=node)
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    started = create_vmi(tenant, guarded, vmi_body("vm", {"claims": ["a"]}), dry_run="All")
    gpus = started["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == [corner.resource()]
    create_vmi(tenant, guarded, vmi_body("plain", labelled=False), dry_run="All")
    vm = vm_of(vmi_body("vm", {"claims": ["a"]}))
    tenant.custom.create_namespaced_custom_object(
        keys.VM.group, keys.VM.version, guarded, keys.VM.plural, vm, dry_run="All"
    )


def test_under_forbidden_a_vm_template_uses_claims_only_with_the_reference_label(
    kube: Kube, control_plane: ControlPlane, raw: RawNames, guarded: str
) -> None:
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    what = "VirtualMachine vm (spec.template)"

    def create(template: dict[str, Any]) -> Any:
        return lambda: tenant.custom.create_namespaced_custom_object(
            keys.VM.group, keys.VM.version, guarded, keys.VM.plural, vm_of(template)
        )

    for annotation in NO_CLAIMS:
        template = shaped(raw_vmi("vm", raw.resource), annotation, labelled=False)
        assert refused_with(create(template)).endswith(WITHOUT_LABEL.format(what=what))
    for annotation in (None, "", " \t"):
        template = shaped(raw_vmi("vm", raw.resource), annotation, labelled=True)
        assert refused_with(create(template)).endswith(WITHOUT_CLAIMS.format(what=what))
    # JSON that names no claim cannot be read by a policy: the VM webhook refuses the VM
    # at create with the message its VMI would get, rather than a VMI refused at each start.
    for annotation in ("{}", '{"claims": ["other-tenant/claim"]}'):
        template = shaped(raw_vmi("vm", raw.resource), annotation, labelled=True)
        message = refused_with(create(template))
        prefix = f"{what}: annotation gpu.cozystack.io/claims is malformed: "
        assert prefix in message, message
        problem = message.split(f"{what}: ", 1)[1]
        vmi_message = refused_with(lambda t=template: create_vmi(tenant, guarded, t))
        assert vmi_message.endswith(problem), "the VM and its VMI get the same message"
    # A VM whose template names claims as it may is stored; changing the annotation to one
    # its VMIs would be refused for is refused too (whoever sends it), other changes pass.
    template = shaped(raw_vmi("vm", raw.resource), '{"claims": ["a"]}', labelled=True)
    create(template)()
    spec = {"spec": {"template": {"metadata": {"annotations": {keys.ANNOTATION_CLAIMS: "{}"}}}}}
    assert MALFORMED.format(problem=NO_CLAIMS["{}"]) in refused_with(
        lambda: kube.custom.patch_namespaced_custom_object(
            keys.VM.group, keys.VM.version, guarded, keys.VM.plural, "vm", spec
        )
    )
    kube.custom.patch_namespaced_custom_object(
        keys.VM.group, keys.VM.version, guarded, keys.VM.plural, "vm",
        {"spec": {"runStrategy": "Manual"}},
    )  # fmt: skip


def test_under_forbidden_a_launcher_pod_uses_claims_only_with_the_reference_label(
    kube: Kube,
    control_plane: ControlPlane,
    raw: RawNames,
    tenant_ns: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # VMIs as they could be stored before these rules (no webhook, no claims-label policy).
    hole = create_vmi(kube, tenant_ns, shaped(vmi_body("hole"), "", labelled=False))
    good = create_vmi(kube, tenant_ns, vmi_body("good", {"claims": ["a"]}))
    unlabelled = create_vmi(
        kube, tenant_ns, vmi_body("unlabelled", {"claims": ["a"]}, labelled=False)
    )
    shapes: dict[str, dict[str, Any]] = {}
    for index, annotation in enumerate([None, *NO_CLAIMS]):
        vmi = vmi_body(f"shape-{index}")
        shapes[f"shape-{index}"] = create_vmi(
            kube, tenant_ns, shaped(vmi, annotation, labelled=True)
        )
    forbidden(raw, kube, tenant_ns)
    controller = tenants.impersonating(control_plane.api_client(), raw.virt_controller)

    def create(name: str, vmi: dict[str, Any], *, labelled: bool, **kw: Any) -> Any:
        body = launcher(name, raw.resource, vmi, labelled=labelled)
        return lambda: controller.core.create_namespaced_pod(tenant_ns, body, **kw)

    # An unlabelled launcher pod does not use claims: its GPU request is raw.
    for vmi in (hole, good):
        name = f"virt-launcher-{vmi['metadata']['name']}"
        message = refused_with(create(name, vmi, labelled=False))
        assert message.endswith(RAW_LAUNCHER.format(pod=name, ns=tenant_ns))
    with serving(
        control_plane, kube, tmp_path_factory.mktemp("pods"), only=["pod.gpu.cozystack.io"]
    ):
        wait_for(
            lambda: (
                "webhook" in refused_or_empty(create("probe", hole, labelled=True, dry_run="All"))
            ),
            30,
            "the API server to call the pod webhook",
        )
        # A labelled pod goes to the webhook, which reads its VMI's annotation.
        for index, annotation in enumerate([None, *NO_CLAIMS]):
            name = f"shape-{index}"
            message = refused_with(create(f"virt-launcher-{name}", shapes[name], labelled=True))
            if annotation is None:
                assert message.endswith(
                    "VirtualMachineInstance shape-0 carries the label gpu.cozystack.io/claims="
                    "true but no gpu.cozystack.io/claims annotation naming its GPU claims; add "
                    "the annotation, or remove the label"
                ), message
            else:
                problem = NO_CLAIMS[annotation]
                assert MALFORMED.format(problem=problem) in message, (annotation, message)
        message = refused_with(create("virt-launcher-unlabelled", unlabelled, labelled=True))
        assert message.endswith(
            "pod virt-launcher-unlabelled carries the label gpu.cozystack.io/claims=true, but "
            "its VirtualMachineInstance unlabelled does not, so it uses no claims; remove the "
            "label from the pod, or start the VM with the label and its claims"
        ), message
        pod = create("virt-launcher-good", good, labelled=True)()
        assert [g.name for g in pod.spec.scheduling_gates or []] == [keys.SCHEDULING_GATE_CLAIMS]


def refused_or_empty(create: Any) -> str:
    """The refusal of a create, or '' when it was admitted."""
    try:
        create()
    except ApiException as exc:
        return refusal(exc)
    return ""


# --- the protection policy ---------------------------------------------------------------

CONTROLLER = "system:serviceaccount:{release}:cozystack-gpu-controller"
STRIP_CLAIM = (
    "only the GPU controller ({controller}) may remove the finalizer "
    "gpu.cozystack.io/claim-protection from GPUClaim {ns}/{name}: it keeps a claim whose VM "
    "runs, and its usage record, until the VM stops, so a GPU in use is never handed to "
    "another VM; delete the claim, and the controller removes the finalizer once its VM has "
    "stopped"
)
STRIP_CLASS = (
    "only the GPU controller ({controller}) may remove the finalizer "
    "gpu.cozystack.io/class-protection from GPUClass {name}: it keeps a class being deleted "
    "until no claim holds its units, so they never read as free; delete the class, and the "
    "controller removes the finalizer once no claim holds it"
)
TEMPLATE_LABEL = (
    "only the GPU controller ({controller}) creates GPUClaims labelled "
    "gpu.cozystack.io/template-claim or annotated gpu.cozystack.io/template-vmi-uid, from "
    "the claimTemplates of a starting VM; remove them from GPUClaim {name} to order a claim, "
    "or name a claim template in the VM's gpu.cozystack.io/claims annotation"
)
PLATFORM_ADMIN = "platform-admin"
TENANT_ADMIN = "tenant-admin"  # bound to the chart's tenant role on claims
TEMPLATE_CUT = (
    "only the GPU controller ({controller}) may change the ownerReferences, the label "
    "gpu.cozystack.io/template-claim or the annotation gpu.cozystack.io/template-vmi-uid of "
    "GPUClaim {ns}/{name}: it is a template claim, made for one VMI and deleted with it; "
    "leave them as they are (the claim goes when its VM stops), or order a claim of your "
    "own for a VM to hold"
)


class Protection:
    """The chart's protection policy, rendered for a release namespace of its own, and a
    tenant namespace where the tenant admin and the controller manage claims."""

    def __init__(self, kube: Kube, plane: ControlPlane) -> None:
        self.kube = kube
        self.plane = plane
        self.id = uuid.uuid4().hex[:8]
        self.release = f"ctl-prot-{self.id}"
        self.controller = CONTROLLER.format(release=self.release)
        self.tenant_ns = f"tenant-prot-{self.id}"
        kube.namespace(self.release)
        kube.namespace(self.tenant_ns, {f"tenant.cozystack.io/{self.tenant_ns}": ""})
        rbac = client.RbacAuthorizationV1Api(kube.api)
        everything = ["create", "get", "list", "update", "patch", "delete"]
        rbac.create_namespaced_role(
            self.tenant_ns,
            {
                "metadata": {"name": "claims"},
                "rules": [
                    {"apiGroups": [keys.GROUP], "resources": ["gpuclaims"], "verbs": everything}
                ],
            },
        )
        rbac.create_namespaced_role_binding(
            self.tenant_ns,
            {
                "metadata": {"name": "claims"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "claims",
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}
                    for u in (TENANT, self.controller)
                ],
            },
        )
        self.cluster_role = f"gpuclasses-{self.id}"
        rbac.create_cluster_role(
            {
                "metadata": {"name": self.cluster_role},
                "rules": [
                    {"apiGroups": [keys.GROUP], "resources": ["gpuclasses"], "verbs": everything}
                ],
            }
        )
        rbac.create_cluster_role_binding(
            {
                "metadata": {"name": self.cluster_role},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": self.cluster_role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}
                    for u in (PLATFORM_ADMIN, self.controller)
                ],
            }
        )
        self.tenant_admin_role = self._chart_tenant_admin()
        self.objects = suffixed(helm_template("protection-policy.yaml", self.release), self.id)
        install_policies(kube.api, self.objects)

    def _chart_tenant_admin(self) -> str:
        """TENANT_ADMIN gets in the tenant namespace what the chart's tenant role (aggregated
        into ``admin``) grants on claims: its rendered ClusterRole, under a name of this
        test's, bound there (this plane runs no role aggregation)."""
        (manage,) = [
            o
            for o in helm_template("rbac-tenant.yaml", self.release)
            if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "cozystack-gpu-claims-manage"
        ]
        manage["metadata"] = {"name": f"cozystack-gpu-claims-manage-{self.id}"}
        rbac = client.RbacAuthorizationV1Api(self.kube.api)
        rbac.create_cluster_role(manage)
        rbac.create_namespaced_role_binding(
            self.tenant_ns,
            {
                "metadata": {"name": "chart-tenant-admin"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": manage["metadata"]["name"],
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": TENANT_ADMIN}
                ],
            },
        )
        return str(manage["metadata"]["name"])

    def close(self) -> None:
        remove_policies(self.kube.api, self.objects)
        # Until the API server forgets the policy, binders of later tests running under
        # other identities could not remove their finalizers.
        probe = self.kube.get_claim(self.tenant_ns, "probe")
        tenant = tenants.impersonating(self.plane.api_client(), TENANT)

        def forgotten() -> bool:
            try:
                tenant.custom.patch_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, self.tenant_ns, keys.PLURAL_CLAIMS, "probe",
                    strip_patch(probe), dry_run="All", **JSON_PATCH,
                )  # fmt: skip
            except ApiException:
                return False
            return True

        wait_for(forgotten, 30, "the API server to forget the protection policy")
        rbac = client.RbacAuthorizationV1Api(self.kube.api)
        rbac.delete_cluster_role_binding(self.cluster_role)
        rbac.delete_cluster_role(self.cluster_role)
        rbac.delete_cluster_role(self.tenant_admin_role)

    def protected_claim(self, name: str) -> dict[str, Any]:
        """A claim as the controller keeps one attached to a running VMI: finalizer, phase."""
        claim = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": name, "finalizers": [keys.FINALIZER_CLAIM]},
            "spec": {"class": "h100", "count": 1},
        }
        self.kube.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, self.tenant_ns, keys.PLURAL_CLAIMS, claim
        )
        result: dict[str, Any] = self.kube.custom.patch_namespaced_custom_object_status(
            keys.GROUP, keys.VERSION, self.tenant_ns, keys.PLURAL_CLAIMS, name,
            {"status": {"phase": "Attached", "nodeName": "n1", "attachedTo": "vm"}},
        )  # fmt: skip
        return result


JSON_PATCH: dict[str, Any] = {"_content_type": "application/json-patch+json"}
MERGE_PATCH: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


def strip_patch(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"op": "test", "path": "/metadata/finalizers", "value": obj["metadata"]["finalizers"]},
        {"op": "remove", "path": "/metadata/finalizers"},
    ]


@pytest.fixture
def protection(kube: Kube, control_plane: ControlPlane) -> Iterator[Protection]:
    policy = Protection(kube, control_plane)
    try:
        probe = policy.protected_claim("probe")
        tenant = tenants.impersonating(control_plane.api_client(), TENANT)

        def enforced() -> bool:
            try:
                tenant.custom.patch_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, policy.tenant_ns, keys.PLURAL_CLAIMS, "probe",
                    strip_patch(probe), dry_run="All", **JSON_PATCH,
                )  # fmt: skip
            except ApiException as exc:
                return "only the GPU controller" in refusal(exc)
            return False

        wait_for(enforced, 30, "the protection policy to be enforced")
        yield policy
    finally:
        policy.close()


def test_only_the_controller_may_strip_a_claims_protection_finalizer(
    kube: Kube, control_plane: ControlPlane, protection: Protection
) -> None:
    ns = protection.tenant_ns
    claim = protection.protected_claim("spare")
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    claims = (keys.GROUP, keys.VERSION, ns, keys.PLURAL_CLAIMS)
    # kubectl delete gpuclaim spare --wait=false: marked, kept by the finalizer.
    tenant.custom.delete_namespaced_custom_object(*claims, "spare")
    claim = kube.get_claim(ns, "spare")
    assert claim["metadata"]["deletionTimestamp"]
    expected = STRIP_CLAIM.format(controller=protection.controller, ns=ns, name="spare")
    # Then a JSON patch of metadata.finalizers, a merge patch, and an update.
    stripped = {**claim, "metadata": {**claim["metadata"], "finalizers": []}}
    for write in (
        lambda: tenant.custom.patch_namespaced_custom_object(
            *claims, "spare", strip_patch(claim), **JSON_PATCH
        ),
        lambda: tenant.custom.patch_namespaced_custom_object(
            *claims, "spare", {"metadata": {"finalizers": None}}, **MERGE_PATCH
        ),
        lambda: tenant.custom.replace_namespaced_custom_object(*claims, "spare", stripped),
    ):
        assert refused_with(write).endswith(expected)
    assert kube.get_claim(ns, "spare")["metadata"]["finalizers"] == [keys.FINALIZER_CLAIM]
    # A finalizer of the tenant's own comes and goes; ours stays.
    mine = [keys.FINALIZER_CLAIM, "example.com/mine"]
    tenant.custom.patch_namespaced_custom_object(
        *claims, "probe", {"metadata": {"finalizers": mine}}
    )
    tenant.custom.patch_namespaced_custom_object(
        *claims, "probe", {"metadata": {"finalizers": [keys.FINALIZER_CLAIM]}}
    )
    # The controller removes it when the VM has stopped: the claim goes.
    controller = tenants.impersonating(control_plane.api_client(), protection.controller)
    controller.custom.patch_namespaced_custom_object(
        *claims, "spare", strip_patch(claim), **JSON_PATCH
    )
    wait_for(
        lambda: "spare" not in {c["metadata"]["name"] for c in kube.claims(ns)},
        30,
        "the claim to go once the controller removed its finalizer",
    )


def test_only_the_controller_may_strip_a_classs_protection_finalizer(
    kube: Kube, control_plane: ControlPlane, protection: Protection
) -> None:
    name = f"prot-{protection.id}"
    kube.gpu_class(name, f"nvidia.com/PROT_{protection.id}")
    classes = (keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES)
    kube.custom.patch_cluster_custom_object(
        *classes, name, {"metadata": {"finalizers": [keys.FINALIZER_CLASS]}}
    )
    admin = tenants.impersonating(control_plane.api_client(), PLATFORM_ADMIN)
    admin.custom.delete_cluster_custom_object(*classes, name)
    stored = kube.custom.get_cluster_custom_object(*classes, name)
    assert stored["metadata"]["deletionTimestamp"]
    message = refused_with(
        lambda: admin.custom.patch_cluster_custom_object(
            *classes, name, strip_patch(stored), **JSON_PATCH
        )
    )
    assert message.endswith(STRIP_CLASS.format(controller=protection.controller, name=name))
    controller = tenants.impersonating(control_plane.api_client(), protection.controller)
    controller.custom.patch_cluster_custom_object(*classes, name, strip_patch(stored), **JSON_PATCH)


def test_only_the_controller_creates_template_claims(
    kube: Kube, control_plane: ControlPlane, protection: Protection
) -> None:
    ns = protection.tenant_ns
    vmi = create_vmi(kube, ns, vmi_body("vm", {"claimTemplates": [{"name": "g", "class": "h100"}]}))

    def template_claim(name: str) -> dict[str, Any]:
        return {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {
                "name": name,
                "labels": {keys.LABEL_TEMPLATE_CLAIM: keys.LABEL_TEMPLATE_CLAIM_VALUE},
                "ownerReferences": [
                    {
                        "apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstance",
                        "name": "vm",
                        "uid": vmi["metadata"]["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {"class": "h100", "count": 2},
        }

    claims = (keys.GROUP, keys.VERSION, ns, keys.PLURAL_CLAIMS)
    tenant = tenants.impersonating(control_plane.api_client(), TENANT)
    message = refused_with(
        lambda: tenant.custom.create_namespaced_custom_object(*claims, template_claim("vm-g"))
    )
    assert message.endswith(TEMPLATE_LABEL.format(controller=protection.controller, name="vm-g"))
    # An order without the label is the tenant's to make.
    plain = template_claim("plain")
    plain["metadata"]["labels"] = {}
    plain["metadata"]["ownerReferences"] = []
    tenant.custom.create_namespaced_custom_object(*claims, plain)
    controller = tenants.impersonating(control_plane.api_client(), protection.controller)
    controller.custom.create_namespaced_custom_object(*claims, template_claim("vm-g"))


def test_a_tenant_admin_cannot_cut_a_template_claim_from_its_vmi(
    kube: Kube, control_plane: ControlPlane, protection: Protection
) -> None:
    """Cut from its VMI owner, a template claim outlives its VM: Bound, holding GPUs with no
    usage record, and ready to be handed to a later VM. Only the controller may change what
    ties it to its VMI: its owners, its label, its recorded VMI uid."""
    ns = protection.tenant_ns
    vmi = create_vmi(kube, ns, vmi_body("vm", {"claimTemplates": [{"name": "g", "class": "h100"}]}))
    claims = (keys.GROUP, keys.VERSION, ns, keys.PLURAL_CLAIMS)
    controller = tenants.impersonating(control_plane.api_client(), protection.controller)
    made = gate.template_claim(vmi, TemplateEntry("g", "h100", 1))
    controller.custom.create_namespaced_custom_object(*claims, made)
    owners = made["metadata"]["ownerReferences"]
    mine = kube.core.create_namespaced_config_map(ns, {"metadata": {"name": "mine"}})
    second = {"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": mine.metadata.uid}
    next_vmi = [{**owners[0], "uid": str(uuid.uuid4())}]
    cuts: dict[str, dict[str, Any]] = {
        "its owner removed": {"metadata": {"ownerReferences": None}},
        "a second owner added": {"metadata": {"ownerReferences": [*owners, second]}},
        "another VMI's uid as owner": {"metadata": {"ownerReferences": next_vmi}},
        "its template label removed": {"metadata": {"labels": {keys.LABEL_TEMPLATE_CLAIM: None}}},
        "its recorded VMI uid removed": {
            "metadata": {"annotations": {keys.ANNOTATION_TEMPLATE_VMI_UID: None}}
        },
    }
    tenant = tenants.impersonating(control_plane.api_client(), TENANT_ADMIN)
    expected = TEMPLATE_CUT.format(controller=protection.controller, ns=ns, name="vm-g")
    for what, patch in cuts.items():
        try:
            tenant.custom.patch_namespaced_custom_object(*claims, "vm-g", patch, **MERGE_PATCH)
        except ApiException as exc:
            assert refusal(exc).endswith(expected), (what, refusal(exc))
            continue
        raise AssertionError(
            f"a tenant admin cut template claim vm-g from VMI vm ({what}): it would outlive "
            "the VM, a Bound hold with no usage record"
        )
    stored = kube.get_claim(ns, "vm-g")["metadata"]
    assert stored["ownerReferences"] == owners
    assert stored["labels"] == made["metadata"]["labels"]
    assert stored["annotations"] == made["metadata"]["annotations"]
    # Nor can an order be turned into a template claim (its budget check skipped).
    kube.claim(ns, "plain", "h100")
    labelled = {"metadata": {"labels": {keys.LABEL_TEMPLATE_CLAIM: "true"}}}
    message = refused_with(
        lambda: tenant.custom.patch_namespaced_custom_object(
            *claims, "plain", labelled, **MERGE_PATCH
        )
    )
    assert message.endswith(
        TEMPLATE_CUT.format(controller=protection.controller, ns=ns, name="plain")
    ), f"a tenant admin made order plain a template claim: {message!r}"
    # The tenant's own labels stay the tenant's; the controller may still change the owners.
    tenant.custom.patch_namespaced_custom_object(
        *claims, "vm-g", {"metadata": {"labels": {"team": "ml"}}}, **MERGE_PATCH
    )
    controller.custom.patch_namespaced_custom_object(
        *claims, "vm-g", {"metadata": {"ownerReferences": None}}, **MERGE_PATCH
    )
    # The controller deletes template claims (once their VMI is gone), never an order.
    message = refused_with(
        lambda: controller.custom.delete_namespaced_custom_object(*claims, "plain")
    )
    assert message.endswith(
        f"the GPU controller ({protection.controller}) deletes only template claims, once "
        f"their VMI is gone, and windows' claims at their end; GPUClaim {ns}/plain is an "
        "order, which only its tenant deletes"
    ), f"the controller's identity deleted order plain: {message!r}"
    controller.custom.delete_namespaced_custom_object(*claims, "vm-g")


def test_only_the_controller_makes_a_windows_claim_and_nobody_cuts_it_from_its_reservation(
    kube: Kube, control_plane: ControlPlane, protection: Protection
) -> None:
    """SPEC §11: the claim a window makes at its start is admitted without the order check,
    its units booked with the window. A tenant admin who could label a claim so, or turn an
    order into one, would hold GPUs no order check judged; cut from its reservation, the
    claim would outlive the window. Only the controller makes it, and deletes it at the end."""
    ns = protection.tenant_ns
    claims = (keys.GROUP, keys.VERSION, ns, keys.PLURAL_CLAIMS)
    booked = kube.reservation(ns, "train", "h100", 1, 1_900_000_020, 1_900_003_620)
    reservation_uid = booked["metadata"]["uid"]
    window_claim = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {
            "name": "train",
            "labels": {keys.LABEL_RESERVATION: "train"},
            "ownerReferences": [
                {"apiVersion": keys.API_VERSION, "kind": keys.KIND_RESERVATION,
                 "name": "train", "uid": reservation_uid, "controller": True}
            ],
        },
        "spec": {"class": "h100", "count": 1},
    }  # fmt: skip
    tenant = tenants.impersonating(control_plane.api_client(), TENANT_ADMIN)
    message = refused_with(
        lambda: tenant.custom.create_namespaced_custom_object(*claims, window_claim)
    )
    assert "creates GPUClaims labelled gpu.cozystack.io/reservation" in message, message
    controller = tenants.impersonating(control_plane.api_client(), protection.controller)
    controller.custom.create_namespaced_custom_object(*claims, window_claim)
    for what, patch in {
        "its label removed": {"metadata": {"labels": {keys.LABEL_RESERVATION: None}}},
        "its label renamed": {"metadata": {"labels": {keys.LABEL_RESERVATION: "other"}}},
        "its owner removed": {"metadata": {"ownerReferences": None}},
    }.items():
        try:
            tenant.custom.patch_namespaced_custom_object(*claims, "train", patch, **MERGE_PATCH)
        except ApiException as exc:
            assert "may change the label gpu.cozystack.io/reservation" in refusal(exc), what
            continue
        raise AssertionError(f"a tenant admin cut the window's claim train ({what})")
    # Nor can an order be turned into a window's claim.
    kube.claim(ns, "mine", "h100")
    message = refused_with(
        lambda: tenant.custom.patch_namespaced_custom_object(
            *claims, "mine", {"metadata": {"labels": {keys.LABEL_RESERVATION: "mine"}}},
            **MERGE_PATCH,
        )
    )  # fmt: skip
    assert "may change the label gpu.cozystack.io/reservation" in message, message
    # The controller deletes the window's claim at the end; an order stays the tenant's.
    controller.custom.delete_namespaced_custom_object(*claims, "train")
    assert "is an order, which only its tenant deletes" in refused_with(
        lambda: controller.custom.delete_namespaced_custom_object(*claims, "mine")
    )
