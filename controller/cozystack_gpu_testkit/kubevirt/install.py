"""What virt-operator would install for virt-controller and virt-api at the pinned release
(``kubevirt-manifests.yaml``): KubeVirt's identities (its ServiceAccounts and the users
they are), the CRDs the plane lacks, the namespace, RBAC and the KubeVirt CR it writes, and
the names and versions the other parts share (see the package docstring)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.cluster import ControlPlane

MANIFESTS_FILE = "kubevirt-manifests.yaml"
NAMESPACE = "kubevirt"
SERVICE_ACCOUNT = "kubevirt-controller"
USER = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
API_SERVICE_ACCOUNT = "kubevirt-apiserver"
API_USER = f"system:serviceaccount:{NAMESPACE}:{API_SERVICE_ACCOUNT}"
HANDLER_SERVICE_ACCOUNT = "kubevirt-handler"
HANDLER_USER = f"system:serviceaccount:{NAMESPACE}:{HANDLER_SERVICE_ACCOUNT}"
# virt-api's webhook configurations (KubeVirt's names; the kit registers them as generated
# but for where they call: virt-api's URL on loopback).
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
VIRT_API_MUTATOR = "virt-api-mutator"
VIRT_API_VALIDATOR = "virt-api-validator"
# The ConfigMap of KubeVirt's CA that virt-operator writes and virt-api reads
# (--ca-configmap-name), under the key it reads.
CA_CONFIGMAP = "kubevirt-ca"
CA_BUNDLE_KEY = "ca-bundle"
# The client identity virt-operator gives virt-api for calling virt-handler (console, VNC:
# never called here, but virt-api loads it at start).
HANDLER_CLIENT_CN = "kubevirt.io:system:client:virt-handler"
# virt-api's readiness probe (virt-operator's), served to anyone.
VIRT_API_HEALTHZ = "/apis/subresources.kubevirt.io/v1/healthz"
KUBEVIRT_NAME = "kubevirt"
DRA_GATE = "GPUsWithDRA"  # VMIs whose GPUs are ResourceClaims (SPEC §13)
# KUBEVIRT_COMPONENTS_VERSION of tools/versions.env: the release virt-controller is built at.
VERSION = "v1.8.2"
# The image virt-controller writes into launcher pods (as virt-operator configures it);
# nothing pulls it here.
LAUNCHER_IMAGE = f"quay.io/kubevirt/virt-launcher:{VERSION}"


def go_architecture() -> str:
    """This machine's architecture as Go names it (``runtime.GOARCH``)."""
    import platform

    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


# VirtualMachineInstanceFinalizer; virt-controller also lifts the deprecated name without
# the prefix). virt-controller lifts it once no launcher pod of the VMI is left.
VMI_FINALIZER = "kubevirt.io/foregroundDeleteVirtualMachine"
TOKEN_SECONDS = 7 * 24 * 3600
READY_TIMEOUT_S = 120.0
# Selects every launcher pod virt-controller makes (its ``kubevirt.io`` label).


class KubeVirtError(RuntimeError):
    """virt-controller or virt-api could not be started; the message carries its log tail."""


def manifests_file(bin_dir: Path) -> Path:
    path = bin_dir / MANIFESTS_FILE
    if not path.is_file():
        raise KubeVirtError(
            f"{path} is missing: run `make binaries` (tools/build-binaries.sh) to build "
            "KubeVirt's components and print what virt-operator would install"
        )
    return path


def install(plane: ControlPlane) -> None:
    """What virt-operator would install for virt-controller and virt-api but the webhook
    configurations (see the module docstring; ``start_virt_api`` registers those once
    virt-api serves); objects already there are left as they are, so installing again is
    cheap."""
    from kubernetes import client

    api = plane.api_client()
    manifests = cluster.load_manifests(manifests_file(plane.bin_dir))
    ext = client.ApiextensionsV1Api(api)
    present = {crd.metadata.name for crd in ext.list_custom_resource_definition().items}
    missing = [
        d
        for d in manifests
        if d["kind"] == "CustomResourceDefinition" and d["metadata"]["name"] not in present
    ]
    if missing:
        path = plane.workdir / "kubevirt-components-crds.yaml"
        path.write_text(yaml.safe_dump_all(missing))
        cluster.install_crds(api, [path])
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    _created(lambda: core.create_namespace({"metadata": {"name": NAMESPACE}}))
    creators = {
        "ServiceAccount": lambda d: core.create_namespaced_service_account(NAMESPACE, d),
        "ClusterRole": rbac.create_cluster_role,
        "ClusterRoleBinding": rbac.create_cluster_role_binding,
        "Role": lambda d: rbac.create_namespaced_role(NAMESPACE, d),
        "RoleBinding": lambda d: rbac.create_namespaced_role_binding(NAMESPACE, d),
    }
    for doc in manifests:
        if doc["kind"] in creators:
            if doc["metadata"].get("namespace", NAMESPACE) != NAMESPACE:
                raise KubeVirtError(f"{doc['kind']} {doc['metadata']['name']}: not in {NAMESPACE}")
            _created(lambda doc=doc: creators[doc["kind"]](doc))
    _deployed_kubevirt(client.CustomObjectsApi(api))


def _created(create: Any) -> None:
    from kubernetes.client.rest import ApiException

    try:
        create()
    except ApiException as exc:
        if exc.status != 409:
            raise


def _deployed_kubevirt(custom: Any) -> None:
    """The KubeVirt CR, with the phase virt-operator writes once everything is deployed."""
    args = ("kubevirt.io", "v1", NAMESPACE, "kubevirts")
    _created(
        lambda: custom.create_namespaced_custom_object(
            *args,
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "KubeVirt",
                "metadata": {"name": KUBEVIRT_NAME},
                # GPUsWithDRA on from the start (on by default since KubeVirt v1.9): turned
                # on later, virt-controller exits to start again with its DRA informers,
                # which a Deployment would restart and the kit does not.
                "spec": {"configuration": {"developerConfiguration": {"featureGates": [DRA_GATE]}}},
            },
        )
    )
    # virt-operator also writes its own architecture (Go's name for it) as the default
    # one: virt-api's mutator gives every new VMI that architecture, and its validator
    # refuses a VMI with none.
    status = {
        "status": {
            "phase": "Deployed",
            "observedKubeVirtVersion": VERSION,
            "defaultArchitecture": go_architecture(),
        }
    }
    custom.patch_namespaced_custom_object_status(*args, KUBEVIRT_NAME, status)


def _token_kubeconfig(plane: ControlPlane, path: Path, account: str = SERVICE_ACCOUNT) -> None:
    """A kubeconfig with a token of one of KubeVirt's ServiceAccounts (virt-controller's by
    default): the identity its pod's projected token would give it."""
    plane.service_account_kubeconfig(NAMESPACE, account, path, TOKEN_SECONDS)
