"""`helm install` of the chart into a real kube-apiserver, then upgrade and uninstall.

The tests of this module run in order against one release: install (every object created),
the webhooks reached through the Service, the raw-name policy, the RBAC matrix by
impersonation, upgrade with changed values, uninstall (CRDs and claims stay).

The release gets a control plane of its own: there the chart owns the CRDs (the session
plane's come from the test kit), and its fail-closed webhooks reach no other test's objects.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART
from kubernetes import client
from kubernetes.client.rest import ApiException
from webhook_endpoint import AdmissionRecorder, host_address, route_service, write_cert_dir

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.chart import binder_lease
from cozystack_gpu_testkit.controller_process import ControllerProcess
from cozystack_gpu_testkit.objects import Kube, wait_for
from cozystack_gpu_testkit.ports import free_port

pytestmark = pytest.mark.apiserver

RELEASE = "cozystack-gpu"
NAMESPACE = "cozy-gpu"
CONTROLLER = f"system:serviceaccount:{NAMESPACE}:cozystack-gpu-controller"
SERVICE = "cozystack-gpu-webhook"
SECRET = "cozystack-gpu-webhook-tls"
VIRT_CONTROLLER = "system:serviceaccount:kubevirt:kubevirt-controller"
GPU = "nvidia.com/GH100_H100_SXM5_80GB"
VALUES: dict[str, Any] = {
    "crds": {"workloads": True},
    "rawNamePolicy": {"virtControllerUser": VIRT_CONTROLLER},
}


@dataclass
class Release:
    plane: cluster.ControlPlane
    helm: Path
    api: Any
    kube: Kube
    webhooks: AdmissionRecorder
    tenant: str
    cert_dir: Path

    def run(self, *args: str, values: dict[str, Any] | None = None) -> str:
        command = [
            str(self.helm),
            *args,
            "--namespace",
            NAMESPACE,
            "--kubeconfig",
            str(self.plane.kubeconfig),
        ]
        if values is not None:
            command += ["--values", "-"]
        result = subprocess.run(
            command,
            input=yaml.safe_dump(values) if values is not None else None,
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, f"helm {' '.join(args)}: {result.stderr}"
        return result.stdout

    def manifest(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.run("get", "manifest", RELEASE)) if d]


@pytest.fixture(scope="module")
def plane() -> Iterator[cluster.ControlPlane]:
    # Aggregator routing: webhook Services are called at an endpoint address, which a test can
    # point at a local process (there is no kube-proxy for cluster IPs).
    started = cluster.start(
        extra_apiserver_args=("--enable-aggregator-routing=true",),
        crds=[cluster.kubevirt_crds()],
        controller_manager=True,
    )
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def release(
    plane: cluster.ControlPlane, helm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Release]:
    api = plane.api_client()
    kube = Kube(api)
    tenant = f"tenant-{uuid.uuid4().hex[:6]}"
    kube.namespace(tenant, {f"{keys.TENANT_LABEL_PREFIX}{tenant}": ""})
    rel = Release(plane, helm, api, kube, AdmissionRecorder(Path()), tenant, Path())
    rel.run("install", RELEASE, str(CHART), "--create-namespace", values=VALUES)
    installed = time.monotonic()
    wait_for(lambda: _claims_admitted(kube, tenant), 60, "claims admitted after install")
    print(f"\n[install] claims admitted {time.monotonic() - installed:.1f} s after helm install")
    # The webhook Service answers with the chart's own certificate.
    rel.cert_dir = write_cert_dir(api, NAMESPACE, SECRET, tmp_path_factory.mktemp("webhook-certs"))
    rel.webhooks = AdmissionRecorder(rel.cert_dir).start()
    route_service(api, NAMESPACE, SERVICE, host_address(), rel.webhooks.port)
    try:
        yield rel
    finally:
        rel.webhooks.stop()


def _claims_admitted(kube: Kube, namespace: str) -> bool:
    """Whether a claim create gets past the API server's own admission. Right after the
    CRDs and the MutatingAdmissionPolicy are created together, it answers 503 ("Resource
    kind ... GPUClaim not found") until the policy has the new kind's schema; then the
    create reaches the webhooks, which nobody serves yet, and is refused there."""
    try:
        kube.claim(namespace, "probe", "h100")
    except ApiException as exc:
        if exc.status == 503 and "Resource kind" in str(exc.body):
            return False
    return True


# --- install -------------------------------------------------------------------------------


def _path(obj: dict[str, Any]) -> str:
    group_version = obj["apiVersion"]
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    plural = {
        "CustomResourceDefinition": "customresourcedefinitions",
        "ServiceAccount": "serviceaccounts",
        "ClusterRole": "clusterroles",
        "ClusterRoleBinding": "clusterrolebindings",
        "Role": "roles",
        "RoleBinding": "rolebindings",
        "Secret": "secrets",
        "ConfigMap": "configmaps",
        "Service": "services",
        "Deployment": "deployments",
        "DaemonSet": "daemonsets",
        "PodDisruptionBudget": "poddisruptionbudgets",
        "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
        "ValidatingWebhookConfiguration": "validatingwebhookconfigurations",
        "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
        "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
        "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
    }[obj["kind"]]
    namespace = obj["metadata"].get("namespace")
    scope = f"/namespaces/{namespace}" if namespace else ""
    return f"{base}{scope}/{plural}/{obj['metadata']['name']}"


def test_helm_install_creates_every_object(release: Release) -> None:
    manifest = release.manifest()
    kinds = {o["kind"] for o in manifest}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "DaemonSet",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ClusterRole",
        "Secret",
    } <= kinds
    # By default claim-protection goes on by the claim webhook, not by a policy.
    assert "MutatingAdmissionPolicy" not in kinds
    hooks = {h["name"] for o in manifest if o["kind"] == "MutatingWebhookConfiguration"
             for h in o["webhooks"]}  # fmt: skip
    assert "gpuclaim-protection.gpu.cozystack.io" in hooks
    for obj in manifest:
        stored = release.plane.get_json(_path(obj))
        assert stored["metadata"]["name"] == obj["metadata"]["name"]
        assert stored["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    ext = client.ApiextensionsV1Api(release.api)
    for crd in (o for o in manifest if o["kind"] == "CustomResourceDefinition"):

        def established(name: str = crd["metadata"]["name"]) -> bool:
            conditions = ext.read_custom_resource_definition(name).status.conditions or []
            return any(c.type == "Established" and c.status == "True" for c in conditions)

        wait_for(established, what=f"CRD {crd['metadata']['name']} Established")


# --- webhooks ------------------------------------------------------------------------------


def _vmi(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"domain": {"devices": {}}, **spec},
    }


def _pod(name: str, labels: dict[str, str] | None = None, gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "compute", "image": "virt-launcher"}
    if gpus:
        container["resources"] = {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container]},
    }


REFERENCE = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}


def _with_claims(name: str, **spec: Any) -> dict[str, Any]:
    """A VMI that uses claims: the reference label and an annotation naming one."""
    vmi = _vmi(name, REFERENCE, **spec)
    vmi["metadata"]["annotations"] = {keys.ANNOTATION_CLAIMS: json.dumps({"claims": ["held"]})}
    return vmi


def test_the_webhooks_reach_the_service_with_the_chart_certificates(release: Release) -> None:
    kube, ns, calls = release.kube, release.tenant, release.webhooks
    kube.gpu_class("h100", GPU)
    kube.claim(ns, "held", "h100")
    kube.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", _with_claims("with-claims")
    )
    kube.custom.create_namespaced_custom_object(
        "kubevirt.io",
        "v1",
        ns,
        "virtualmachineinstances",
        _with_claims("planned"),
        dry_run="All",
    )
    kube.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, "virtualmachineinstances", _vmi("plain")
    )
    kube.core.create_namespaced_pod(ns, _pod("virt-launcher-with-claims", REFERENCE))
    kube.core.create_namespaced_pod(ns, _pod("plain-pod"))

    assert [(c.kind, c.operation, c.name) for c in calls.calls_to("/validate-gpuclass")] == [
        ("GPUClass", "CREATE", "h100")
    ]
    assert [(c.kind, c.name, c.namespace) for c in calls.calls_to("/validate-gpuclaim")] == [
        ("GPUClaim", "held", ns)
    ]
    # Only VMIs and pods with the reference label; a dry run reaches the VMI webhook, marked.
    assert [(c.name, c.dry_run) for c in calls.calls_to("/mutate-vmi")] == [
        ("with-claims", False),
        ("planned", True),
    ]
    assert [c.name for c in calls.calls_to("/mutate-pod")] == ["virt-launcher-with-claims"]


def test_the_webhooks_fail_closed_when_nothing_serves_them(release: Release) -> None:
    kube, ns = release.kube, release.tenant
    release.webhooks.stop()
    try:
        with pytest.raises(ApiException) as refused:
            kube.claim(ns, "unchecked", "h100")
        assert refused.value.status >= 400
        # The claim webhook's mutating half (claim-protection) is the first to fail.
        assert "gpuclaim-protection.gpu.cozystack.io" in refused.value.body
        with pytest.raises(ApiException):
            kube.custom.create_namespaced_custom_object(
                "kubevirt.io", "v1", ns, "virtualmachineinstances", _with_claims("blocked")
            )
        # Objects without the reference label never depend on the webhooks.
        kube.custom.create_namespaced_custom_object(
            "kubevirt.io", "v1", ns, "virtualmachineinstances", _vmi("unaffected")
        )
        kube.core.create_namespaced_pod(ns, _pod("unaffected"))
    finally:
        release.webhooks.start()
        route_service(release.api, NAMESPACE, SERVICE, host_address(), release.webhooks.port)


def test_the_controller_serves_the_chart_webhooks_behind_the_service(
    release: Release, tmp_path: Path
) -> None:
    """A controller replica, run as its pod would with the chart's certificate files, as the
    Service's endpoint: the API server reaches its webhooks and carries their refusals."""
    kube, ns = release.kube, release.tenant
    port = free_port()
    replica = ControllerProcess(
        release.plane,
        NAMESPACE,
        "chart-replica",
        tmp_path,
        f"--webhook-port={port}",
        f"--webhook-cert-dir={release.cert_dir}",
    )
    try:
        route_service(release.api, NAMESPACE, SERVICE, host_address(), port)

        # Only the controller may create template claims (the protection policy refuses
        # everyone else before any webhook): as the controller, a template-claim label
        # without the owning VMI is refused by the claim webhook on every replica at once,
        # before its snapshot of the cluster is read.
        controller = Kube(_impersonating(release.plane, CONTROLLER))

        def refusal() -> str | None:
            try:
                controller.claim(ns, "forged", "h100", labels={keys.LABEL_TEMPLATE_CLAIM: "true"})
            except ApiException as exc:
                message = str(json.loads(exc.body)["message"])
                # Until the replica listens, the API server cannot call it at all.
                return None if "failed calling webhook" in message else message
            raise AssertionError("a forged template claim was admitted")

        message = wait_for(refusal, timeout=60, what="the replica's claim webhook")
        assert "gpuclaim.gpu.cozystack.io" in message, message
        assert "owned by its VirtualMachineInstance" in message, message
        # The replica serves the claim webhook's mutating half, which runs before the
        # policies: now the tenant's forgery meets the protection policy.
        tenant_refusal = _refusal(
            lambda: kube.claim(ns, "forged", "h100", labels={keys.LABEL_TEMPLATE_CLAIM: "true"})
        )
        assert tenant_refusal is not None and CONTROLLER in tenant_refusal, tenant_refusal
    except BaseException:
        print(replica.log_tail())
        raise
    finally:
        replica.stop()
        route_service(release.api, NAMESPACE, SERVICE, host_address(), release.webhooks.port)


# --- raw-name policy -----------------------------------------------------------------------


def _settings(release: Release, policy: str) -> None:
    """gpu-settings as the controller writes it."""
    body = {
        "metadata": {"name": keys.SETTINGS_CONFIGMAP},
        "data": {
            keys.SETTINGS_KEY_RESOURCE_NAMES: keys.format_resource_names({GPU, "nvidia.com/T4"}),
            keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: policy,
        },
    }
    try:
        release.kube.core.replace_namespaced_config_map(keys.SETTINGS_CONFIGMAP, NAMESPACE, body)
    except ApiException as exc:
        if exc.status != 404:
            raise
        release.kube.core.create_namespaced_config_map(NAMESPACE, body)


def _refusal(create: Any) -> str | None:
    """The refusal message of a dry-run create, or None when it is admitted."""
    try:
        create()
    except ApiException as exc:
        if exc.status in (403, 422):
            return str(json.loads(exc.body)["message"])
        raise
    return None


def test_forbidden_raw_names_refuse_gpu_vmis_without_claims_and_tenant_gpu_pods(
    release: Release,
) -> None:
    kube, ns = release.kube, release.tenant
    vmis = "virtualmachineinstances"

    def create_vmi(body: dict[str, Any], as_api: Any = None) -> Any:
        custom = client.CustomObjectsApi(as_api) if as_api else kube.custom
        return lambda: custom.create_namespaced_custom_object(
            "kubevirt.io", "v1", ns, vmis, body, dry_run="All"
        )

    raw_vmi = _vmi("raw", domain={"devices": {"gpus": [{"name": "gpu1", "deviceName": GPU}]}})
    raw_host_device = _vmi(
        "raw-hostdev",
        domain={"devices": {"hostDevices": [{"name": "h", "deviceName": "nvidia.com/T4"}]}},
    )
    nic = _vmi(
        "nic",
        domain={"devices": {"hostDevices": [{"name": "n", "deviceName": "mellanox.com/cx7"}]}},
    )
    claimed = _with_claims(
        "claimed", domain={"devices": {"gpus": [{"name": "g", "deviceName": GPU}]}}
    )
    gpu_pod = _pod("gpu-pod", gpus=1)

    def create_pod(body: dict[str, Any], namespace: str = ns, as_api: Any = None) -> Any:
        core = client.CoreV1Api(as_api) if as_api else kube.core
        return lambda: core.create_namespaced_pod(namespace, body, dry_run="All")

    # allowed: nothing is refused.
    _settings(release, keys.RawNamesPolicy.ALLOWED.value)
    assert _refusal(create_vmi(raw_vmi)) is None
    assert _refusal(create_pod(gpu_pod)) is None

    _settings(release, keys.RawNamesPolicy.FORBIDDEN.value)
    message = wait_for(lambda: _refusal(create_vmi(raw_vmi)), what="the policy to take effect")
    assert GPU in message and "gpu.cozystack.io/claims" in message, message
    assert "nvidia.com/T4" in (_refusal(create_vmi(raw_host_device)) or "")
    assert _refusal(create_vmi(nic)) is None
    assert _refusal(create_vmi(claimed)) is None
    message = _refusal(create_pod(gpu_pod)) or ""
    assert "compute" in message and ns in message, message
    assert _refusal(create_pod(_pod("cpu-pod"))) is None
    # Outside tenant namespaces (system workloads) the policy does not apply.
    assert _refusal(create_pod(gpu_pod, namespace=NAMESPACE)) is None

    # virt-controller's launcher pod of a VMI that uses claims (labelled, owned by the VMI)
    # is the one exception.
    vmi = kube.custom.create_namespaced_custom_object(
        "kubevirt.io", "v1", ns, vmis, _with_claims("owner")
    )
    launcher = _pod(
        "virt-launcher-owner-abcde", {"kubevirt.io": "virt-launcher", **REFERENCE}, gpus=1
    )
    launcher["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "name": "owner",
            "uid": vmi["metadata"]["uid"],
            "controller": True,
        }
    ]
    _grant(release, VIRT_CONTROLLER, "", "pods", ["create"])
    as_virt_controller = _impersonating(release.plane, VIRT_CONTROLLER)
    assert _refusal(create_pod(launcher, as_api=as_virt_controller)) is None
    # The same pod from anyone else, without the label, or without the owner, is refused.
    assert _refusal(create_pod(launcher))
    unlabelled = json.loads(json.dumps(launcher))
    unlabelled["metadata"]["labels"].pop(keys.LABEL_CLAIMS_REF)
    message = _refusal(create_pod(unlabelled, as_api=as_virt_controller)) or ""
    assert 'lacks the label gpu.cozystack.io/claims: "true"' in message, message
    orphan = _pod("virt-launcher-orphan", {"kubevirt.io": "virt-launcher"}, gpus=1)
    assert _refusal(create_pod(orphan, as_api=as_virt_controller))
    _settings(release, keys.RawNamesPolicy.ALLOWED.value)


# --- RBAC ------------------------------------------------------------------------------------


def _impersonating(plane: cluster.ControlPlane, user: str) -> Any:
    api = plane.api_client()
    api.set_default_header("Impersonate-User", user)
    return api


def _grant(release: Release, user: str, group: str, resource: str, verbs: list[str]) -> None:
    rbac = client.RbacAuthorizationV1Api(release.api)
    name = f"test-{uuid.uuid4().hex[:6]}"
    rbac.create_cluster_role(
        {
            "metadata": {"name": name},
            "rules": [{"apiGroups": [group], "resources": [resource], "verbs": verbs}],
        }
    )
    subject = {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": name,
            },
            "subjects": [subject],
        }
    )


def _identity(user: str, node: str) -> dict[str, str]:
    """Impersonation headers of ``user``; the agent's pod-bound token also names its node
    (the chart's own-node policy reads it; tests/chart/test_agent_rights.py tests that)."""
    headers = {"Impersonate-User": user}
    if user.endswith(":cozystack-gpu-agent"):
        headers["Impersonate-Extra-authentication.kubernetes.io%2fnode-name"] = node
    return headers


def _status(plane: cluster.ControlPlane, user: str, method: str, path: str) -> int:
    """The answer to one request as ``user``; writes are dry runs (authorized like real ones,
    stored nowhere)."""
    body: bytes | None = None
    node = path.split("/gpunodes/", 1)[1].split("/")[0] if "/gpunodes/" in path else "gpu-node-1"
    headers = {**_identity(user, node), "Accept": "application/json"}
    if method in ("POST", "PATCH", "PUT", "DELETE"):
        path += ("&" if "?" in path else "?") + "dryRun=All"
    if method == "PATCH":
        body = b'{"metadata": {"labels": {"touched": "yes"}}}'
        headers["Content-Type"] = "application/merge-patch+json"
    request = urllib.request.Request(plane.server + path, data=body, method=method, headers=headers)
    context: ssl.SSLContext = plane.ssl_context()
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _post(plane: cluster.ControlPlane, user: str, path: str, obj: dict[str, Any]) -> int:
    request = urllib.request.Request(
        plane.server + path + "?dryRun=All",
        data=json.dumps(obj).encode(),
        method="POST",
        headers={
            **_identity(user, obj["metadata"]["name"]),
            "Content-Type": "application/json",
        },
    )
    try:
        with urllib.request.urlopen(request, context=plane.ssl_context(), timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


GPU_API = f"/apis/{keys.GROUP}/{keys.VERSION}"


def test_the_rbac_matrix_holds_for_every_identity(release: Release) -> None:
    plane, kube, ns = release.plane, release.kube, release.tenant
    other = f"other-{uuid.uuid4().hex[:6]}"
    kube.namespace(other, {f"{keys.TENANT_LABEL_PREFIX}{other}": ""})
    kube.node("gpu-node-1")
    kube.gpunode(
        "gpu-node-1", [{"pciAddress": "0000:10:00.0", "resourceName": GPU, "allocatable": 1}]
    )
    kube.claim(ns, "matrix", "h100")
    kube.core.create_namespaced_pod(ns, _pod("launcher"))
    # The hoster's licence token, which no tenant role may read.
    token_secret = f"nls-{uuid.uuid4().hex[:6]}"
    kube.core.create_namespaced_secret(
        NAMESPACE,
        {
            "metadata": {
                "name": token_secret,
                "labels": {keys.LABEL_LICENSE_TOKEN: keys.LICENSE_TOKEN_MARK},
            },
            "data": {keys.LICENSE_TOKEN_KEY: "dA=="},
        },
    )
    token = f"/api/v1/namespaces/{NAMESPACE}/secrets/{token_secret}"
    rbac = client.RbacAuthorizationV1Api(release.api)
    for user, role in (("alice", "admin"), ("bob", "view")):
        rbac.create_namespaced_role_binding(
            ns,
            {
                "metadata": {"name": f"{user}-{role}"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": role,
                },
                "subjects": [
                    {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                ],
            },
        )
    wait_for(
        lambda: any(
            keys.PLURAL_CLAIMS in (r.resources or [])
            for r in rbac.read_cluster_role("admin").rules or []
        ),
        what="the aggregation controller to give admin the claim rules",
    )

    claims = f"{GPU_API}/namespaces/{ns}/gpuclaims"
    claim = f"{claims}/matrix"
    controller = f"system:serviceaccount:{NAMESPACE}:cozystack-gpu-controller"
    agent = f"system:serviceaccount:{NAMESPACE}:cozystack-gpu-agent"
    new_claim = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": "new"},
        "spec": {"class": "h100", "count": 1},
    }
    new_class = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLASS,
        "metadata": {"name": "a100"},
        "spec": {
            "vendor": "nvidia",
            "model": "A100",
            "mode": "passthrough",
            "source": {"devicePlugin": {"resourceName": "nvidia.com/A100"}},
        },
    }
    new_gpunode = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_NODE,
        "metadata": {"name": "gpu-node-2"},
    }
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "probe"},
    }
    # (who, method, path, expected status); writes are dry runs.
    allowed, denied = 200, 403
    matrix: list[tuple[str, str, str, int]] = [
        # tenant admin: manages claims in its namespace, reads the catalog, nothing else.
        ("alice", "GET", claims, allowed),
        ("alice", "GET", claim, allowed),
        ("alice", "PATCH", claim, allowed),
        ("alice", "DELETE", claim, allowed),
        ("alice", "PATCH", f"{claim}/status", denied),
        ("alice", "GET", f"{claim}/status", denied),
        ("alice", "GET", f"{GPU_API}/namespaces/{other}/gpuclaims", denied),
        ("alice", "GET", f"{GPU_API}/gpuclasses", allowed),
        ("alice", "GET", f"{GPU_API}/gpuclasses/h100", allowed),
        ("alice", "PATCH", f"{GPU_API}/gpuclasses/h100", denied),
        ("alice", "GET", f"{GPU_API}/gpunodes", denied),
        ("alice", "GET", f"{GPU_API}/gpunodes/gpu-node-1", denied),
        ("alice", "GET", token, denied),
        ("alice", "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", denied),
        # tenant view: reads claims only.
        ("bob", "GET", claims, allowed),
        ("bob", "GET", claim, allowed),
        ("bob", "PATCH", claim, denied),
        ("bob", "DELETE", claim, denied),
        ("bob", "GET", f"{claim}/status", denied),
        ("bob", "GET", f"{GPU_API}/gpuclasses", allowed),
        ("bob", "GET", f"{GPU_API}/gpunodes", denied),
        ("bob", "GET", token, denied),
        # any authenticated user: the catalog, read-only.
        ("carol", "GET", f"{GPU_API}/gpuclasses", allowed),
        ("carol", "GET", f"{GPU_API}/gpuclasses/h100", allowed),
        ("carol", "DELETE", f"{GPU_API}/gpuclasses/h100", denied),
        ("carol", "PATCH", f"{GPU_API}/gpuclasses/h100/status", denied),
        ("carol", "GET", claims, denied),
        ("carol", "GET", f"{GPU_API}/gpunodes", denied),
        ("carol", "GET", token, denied),
        ("carol", "GET", "/api/v1/secrets", denied),
        # the node agent: GPUNode and its status, its Node and pods read, nothing else.
        (agent, "GET", f"{GPU_API}/gpunodes/gpu-node-1", allowed),
        (agent, "PATCH", f"{GPU_API}/gpunodes/gpu-node-1/status", allowed),
        (agent, "PATCH", f"{GPU_API}/gpunodes/gpu-node-1", denied),
        (agent, "DELETE", f"{GPU_API}/gpunodes/gpu-node-1", denied),
        (agent, "GET", "/api/v1/nodes/gpu-node-1", allowed),
        (agent, "PATCH", "/api/v1/nodes/gpu-node-1", denied),
        (agent, "GET", "/api/v1/pods", allowed),
        (agent, "DELETE", f"/api/v1/namespaces/{ns}/pods/launcher", denied),
        (agent, "GET", claims, denied),
        (agent, "PATCH", f"{GPU_API}/gpuclasses/h100/status", denied),
        (agent, "GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", denied),
        # the controller: claims, their status, launcher pods, its Lease, the licence token
        # and its copies (docs/licensing.md, "RBAC"); no RBAC, no patch of secrets.
        (controller, "GET", claims, allowed),
        (controller, "PATCH", f"{claim}/status", allowed),
        (controller, "PATCH", claim, allowed),
        (controller, "DELETE", claim, denied),
        (controller, "PATCH", f"{GPU_API}/gpuclasses/h100/status", allowed),
        (controller, "PATCH", f"{GPU_API}/gpunodes/gpu-node-1/status", allowed),
        (controller, "DELETE", f"{GPU_API}/gpuclasses/h100", denied),
        (controller, "PATCH", f"/api/v1/namespaces/{ns}/pods/launcher", allowed),
        (controller, "PUT", f"/api/v1/namespaces/{ns}/pods/launcher", denied),
        (controller, "DELETE", f"/api/v1/namespaces/{ns}/pods/launcher", allowed),
        (controller, "GET", token, allowed),
        (controller, "GET", f"/api/v1/namespaces/{ns}/secrets", allowed),
        (controller, "PATCH", token, denied),
        (agent, "GET", token, denied),
        (controller, "GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", denied),
        (controller, "GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles", denied),
    ]
    creates: list[tuple[str, str, dict[str, Any], int]] = [
        ("alice", claims, new_claim, 201),
        ("bob", claims, new_claim, denied),
        ("carol", f"{GPU_API}/gpuclasses", new_class, denied),
        ("alice", f"{GPU_API}/gpuclasses", new_class, denied),
        (agent, f"{GPU_API}/gpunodes", new_gpunode, 201),
        (agent, claims, new_claim, denied),
        (controller, claims, new_claim, 201),
        (controller, f"{GPU_API}/gpuclasses", new_class, denied),
        (controller, f"/api/v1/namespaces/{ns}/pods", _pod("forged"), denied),
        (controller, f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases", lease, 201),
        (controller, f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", lease, denied),
    ]
    wrong = []
    for who, method, path, expected in matrix:
        got = _status(plane, who, method, path)
        if got != expected:
            wrong.append(f"{who} {method} {path}: {got}, expected {expected}")
    for who, path, obj, expected in creates:
        got = _post(plane, who, path, obj)
        if got != expected:
            wrong.append(f"{who} POST {path}: {got}, expected {expected}")
    assert not wrong, "\n".join(wrong)


# --- upgrade and uninstall -----------------------------------------------------------------


def _secret_data(release: Release) -> dict[str, str]:
    return dict(release.kube.core.read_namespaced_secret(SECRET, NAMESPACE).data)


def test_helm_upgrade_applies_changed_values_and_keeps_the_certificate(release: Release) -> None:
    before = _secret_data(release)
    # The GPU names the leader wrote (it patches only the data keys) survive an upgrade.
    written = keys.format_resource_names({GPU, "nvidia.com/FROM_THE_LEADER"})
    release.kube.core.patch_namespaced_config_map(
        keys.SETTINGS_CONFIGMAP,
        NAMESPACE,
        {"data": {keys.SETTINGS_KEY_RESOURCE_NAMES: written}},
    )
    values = {
        **VALUES,
        "controller": {"replicas": 3, "settings": {"rawResourceNames": "forbidden"}},
        "webhook": {"timeoutSeconds": 5},
        "agent": {"enabled": False},
    }
    release.run("upgrade", RELEASE, str(CHART), values=values)
    apps = client.AppsV1Api(release.api)
    deployment = apps.read_namespaced_deployment("cozystack-gpu-controller", NAMESPACE)
    assert deployment.spec.replicas == 3
    env = {e.name: e.value for e in deployment.spec.template.spec.containers[0].env}
    assert env["GPU_RAW_RESOURCE_NAMES"] == "forbidden"
    admission = client.AdmissionregistrationV1Api(release.api)
    hooks = admission.read_validating_webhook_configuration("cozystack-gpu").webhooks
    assert {h.timeout_seconds for h in hooks} == {5}
    with pytest.raises(ApiException) as gone:
        apps.read_namespaced_daemon_set("cozystack-gpu-agent", NAMESPACE)
    assert gone.value.status == 404
    settings = release.kube.core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, NAMESPACE)
    assert settings.data[keys.SETTINGS_KEY_RAW_RESOURCE_NAMES] == "forbidden"
    assert settings.data[keys.SETTINGS_KEY_RESOURCE_NAMES] == written, (
        "helm upgrade cut the GPU names the controller wrote: "
        f"{settings.data[keys.SETTINGS_KEY_RESOURCE_NAMES]!r}"
    )
    # The generated certificate survives the upgrade, and so does the webhooks' trust in it.
    assert _secret_data(release) == before
    assert base64.b64decode(hooks[0].client_config.ca_bundle) == base64.b64decode(before["ca.crt"])
    # The webhooks still answer with it.
    count = len(release.webhooks.calls_to("/validate-gpuclaim"))
    release.kube.claim(release.tenant, "after-upgrade", "h100")
    assert len(release.webhooks.calls_to("/validate-gpuclaim")) == count + 1


def test_helm_uninstall_leaves_the_crds_and_the_claims(release: Release) -> None:
    release.run("uninstall", RELEASE)
    ext = client.ApiextensionsV1Api(release.api)
    for name in (
        "gpuclasses.gpu.cozystack.io",
        "gpuclaims.gpu.cozystack.io",
        "gpunodes.gpu.cozystack.io",
        "workloads.cozystack.io",
    ):
        assert ext.read_custom_resource_definition(name).metadata.name == name
    names = {c["metadata"]["name"] for c in release.kube.claims(release.tenant)}
    assert {"held", "matrix", "after-upgrade"} <= names
    admission = client.AdmissionregistrationV1Api(release.api)
    with pytest.raises(ApiException) as gone:
        admission.read_validating_webhook_configuration("cozystack-gpu")
    assert gone.value.status == 404
    # gpu-settings is kept, like the CRDs: Helm deletes ConfigMaps before policies.
    assert release.kube.core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, NAMESPACE)
    # So are the parameter anchors (param-anchors.yaml), and they judge nothing.
    for kind in ("lease", "configmap"):
        anchor = admission.read_validating_admission_policy_binding(
            f"{RELEASE}-param-anchor-{kind}"
        )
        assert anchor.spec.validation_actions == ["Audit"]
    with pytest.raises(ApiException) as removed:
        client.AppsV1Api(release.api).read_namespaced_deployment(
            "cozystack-gpu-controller", NAMESPACE
        )
    assert removed.value.status == 404


def _serve_webhooks_again(release: Release, tmp: Path) -> None:
    """After an install anew: the chart's new certificate, served at the new Service."""
    release.webhooks.stop()
    release.cert_dir = write_cert_dir(release.api, NAMESPACE, SECRET, tmp)
    release.webhooks = AdmissionRecorder(release.cert_dir).start()
    route_service(release.api, NAMESPACE, SERVICE, host_address(), release.webhooks.port)


def _lease_now(release: Release, holder: str, term: int) -> None:
    binder_lease(release.api, NAMESPACE, holder, term)


def _status_write(release: Release, holder: str, term: int) -> int:
    """A binder status write of claim "held" decided by ``holder`` in ``term``: its answer."""
    writer = {"holder": holder, "term": term, "basedOn": uuid.uuid4().hex}
    custom = client.CustomObjectsApi(_impersonating(release.plane, CONTROLLER))
    try:
        custom.patch_namespaced_custom_object_status(
            keys.GROUP, keys.VERSION, release.tenant, keys.PLURAL_CLAIMS, "held",
            {"status": {keys.CLAIM_STATUS_WRITER: writer}},
        )  # fmt: skip
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_a_chart_installed_again_judges_by_its_parameters_as_they_are_now(
    release: Release, tmp_path: Path
) -> None:
    """The raw-name policy reads gpu-settings and the claim fence the binder's Lease, through
    informers inside kube-apiserver. kube-apiserver stops such an informer for a built-in
    kind once no binding names that kind, and a policy created later reads its frozen store
    (kubernetes/kubernetes#130887, open in v1.37): an uninstall, then an install again, left
    the fence judging by a Lease gone by and the raw-name policy by settings gone by. The
    chart's kept parameter anchors name both kinds for good."""
    # The uninstall above left gpu-settings as the upgrade wrote it: forbidden.
    _lease_now(release, "gone-replica", 7)
    release.run("install", RELEASE, str(CHART), values=VALUES)
    _serve_webhooks_again(release, tmp_path)
    # allowed again: a tenant's GPU pod is admitted once the policy reads the new settings.
    gpu_pod = _pod("gpu-pod-again", gpus=1)
    wait_for(
        lambda: (
            _refusal(
                lambda: release.kube.core.create_namespaced_pod(
                    release.tenant, gpu_pod, dry_run="All"
                )
            )
            is None
        ),
        30,
        "the raw-name policy reading rawResourceNames: allowed after the install",
    )
    # The new leader takes the Lease over: its writes land, the gone leader's are refused.
    _lease_now(release, "new-replica", 8)
    wait_for(
        lambda: _status_write(release, "gone-replica", 7) == 403,
        30,
        "the fence refusing a write of the overtaken term 7",
    )
    assert _status_write(release, "new-replica", 8) == 200
