"""The chart as `helm template` renders it: what the interface contract and SPEC.md §7 fix
(webhooks, RBAC, CRDs kept on uninstall, the raw-name policy) and what the schema refuses."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartkit import CHART, NAMESPACE, find, helm_template, of_kind, render
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from prometheus_client.metrics import MetricWrapperBase

from cozystack_gpu import config, keys, metrics
from cozystack_gpu.agent.runner import Metrics as AgentMetrics

CONTROLLER = CHART.parent
CRD_DIR = CONTROLLER / "cozystack_gpu" / "crds"
DEPLOY_RBAC = CONTROLLER / "deploy" / "rbac.yaml"


# --- chart metadata and CRDs -------------------------------------------------------------


def test_the_chart_is_released_with_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    package = tomllib.loads((CONTROLLER / "pyproject.toml").read_text())["project"]["version"]
    assert chart["name"] == "cozystack-gpu"
    assert chart["version"] == chart["appVersion"] == package


def test_helm_lint_is_clean(helm: Path) -> None:
    result = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout
    assert "0 chart(s) failed" in result.stdout


def test_the_chart_crds_are_the_package_crds_and_are_kept_on_uninstall(helm: Path) -> None:
    rendered = {o["metadata"]["name"]: o for o in of_kind(render(helm), "CustomResourceDefinition")}
    package = {
        doc["metadata"]["name"]: doc
        for path in sorted(CRD_DIR.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    }
    assert rendered == package
    for name, crd in rendered.items():
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep", name


def test_the_chart_carries_exact_copies_of_the_package_crds_and_rbac() -> None:
    copy = CHART / "files" / "controller-rbac.yaml"
    assert copy.read_bytes() == DEPLOY_RBAC.read_bytes(), (
        f"{copy} is stale: run tools/sync-chart-files.sh"
    )
    pairs = [
        (CHART / "files" / "crds", CRD_DIR),
        (CHART / "files" / "crds-extra", CRD_DIR / "extra"),
    ]
    for copies, originals in pairs:
        assert sorted(p.name for p in copies.glob("*.yaml")) == sorted(
            p.name for p in originals.glob("*.yaml")
        ), f"{copies} and {originals} differ: run tools/sync-chart-files.sh"
        for original in originals.glob("*.yaml"):
            assert (copies / original.name).read_bytes() == original.read_bytes(), (
                f"{copies / original.name} is stale: run tools/sync-chart-files.sh"
            )


def test_the_workload_crd_is_rendered_only_when_asked(helm: Path) -> None:
    names = {o["metadata"]["name"] for o in of_kind(render(helm), "CustomResourceDefinition")}
    assert "workloads.cozystack.io" not in names
    with_workloads = render(helm, {"crds": {"workloads": True}})
    crd = find(with_workloads, "CustomResourceDefinition", "workloads.cozystack.io")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not of_kind(render(helm, {"crds": {"install": False}}), "CustomResourceDefinition")


# --- webhooks ----------------------------------------------------------------------------

# CONTRACTS.md, row by row: path, group, version, resource, operations, selector, sideEffects.
CONTRACT = {
    ("MutatingWebhookConfiguration", "vmi.gpu.cozystack.io"): (
        "/mutate-vmi",
        "kubevirt.io",
        "v1",
        "virtualmachineinstances",
        ["CREATE"],
        {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
        "None",
    ),
    ("MutatingWebhookConfiguration", "pod.gpu.cozystack.io"): (
        "/mutate-pod",
        "",
        "v1",
        "pods",
        ["CREATE"],
        {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
        "None",
    ),
    # Rendered where the API server serves no MutatingAdmissionPolicy (helm template's
    # default); the policy takes its place elsewhere.
    ("MutatingWebhookConfiguration", "gpuclaim-protection.gpu.cozystack.io"): (
        "/mutate-gpuclaim",
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_CLAIMS,
        ["CREATE"],
        None,
        "None",
    ),
    ("ValidatingWebhookConfiguration", "gpuclaim.gpu.cozystack.io"): (
        "/validate-gpuclaim",
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_CLAIMS,
        ["CREATE", "UPDATE"],
        None,
        "None",
    ),
    ("ValidatingWebhookConfiguration", "gpureservation.gpu.cozystack.io"): (
        "/validate-gpureservation",
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_RESERVATIONS,
        ["CREATE"],
        None,
        "None",
    ),
    ("ValidatingWebhookConfiguration", "gpuclass.gpu.cozystack.io"): (
        "/validate-gpuclass",
        keys.GROUP,
        keys.VERSION,
        keys.PLURAL_CLASSES,
        ["CREATE", "UPDATE"],
        None,
        "None",
    ),
    ("ValidatingWebhookConfiguration", "vm.gpu.cozystack.io"): (
        "/validate-vm",
        keys.VM.group,
        keys.VM.version,
        keys.VM.plural,
        ["CREATE", "UPDATE"],
        None,
        "None",
    ),
}


def webhooks(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    found = {}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = find(objects, kind, "cozystack-gpu")
        for hook in configuration["webhooks"]:
            found[(kind, hook["name"])] = hook
    return found


def test_every_webhook_is_as_the_contract_says_and_fails_closed(helm: Path) -> None:
    """Every webhook but the VM's early check fails closed; that one fails open, as the VMI
    webhook refuses what it would at every start."""
    hooks = webhooks(render(helm))
    assert set(hooks) == set(CONTRACT)
    for key, (path, group, version, resource, operations, selector, effects) in CONTRACT.items():
        hook = hooks[key]
        early = key == ("ValidatingWebhookConfiguration", "vm.gpu.cozystack.io")
        assert hook["failurePolicy"] == ("Ignore" if early else "Fail"), key
        assert hook["timeoutSeconds"] == 10, key
        assert hook["admissionReviewVersions"] == ["v1"], key
        assert hook["sideEffects"] == effects, key
        assert hook["clientConfig"]["service"] == {
            "name": "cozystack-gpu-webhook",
            "namespace": NAMESPACE,
            "path": path,
            "port": 443,
        }, key
        (rule,) = hook["rules"]
        assert (rule["apiGroups"], rule["apiVersions"], rule["resources"]) == (
            [group],
            [version],
            [resource],
        ), key
        assert rule["operations"] == operations, key
        assert hook.get("objectSelector", {}).get("matchLabels") == selector, key
        if key[0] == "MutatingWebhookConfiguration":
            assert hook["reinvocationPolicy"] == "IfNeeded", key


def test_the_webhook_service_sends_port_443_to_the_webhook_port(helm: Path) -> None:
    objects = render(helm)
    service = find(objects, "Service", "cozystack-gpu-webhook")
    assert service["spec"]["ports"] == [
        {"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}
    ]
    deployment = find(objects, "Deployment", "cozystack-gpu-controller")
    pod = deployment["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert ports["webhook"] == 9443


def test_with_client_auth_every_replica_answers_only_the_api_servers_certificate(
    helm: Path,
) -> None:
    """webhook.clientAuth (docs/security.md, G2): the CA reaches every replica as a file
    its webhook server verifies callers against; without it, any caller is answered."""
    pod = find(render(helm), "Deployment", "cozystack-gpu-controller")["spec"]["template"]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["GPU_WEBHOOK_CLIENT_CA"] == ""
    bundle = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    objects = render(helm, {"webhook": {"clientAuth": {"caBundle": bundle}}})
    assert find(objects, "ConfigMap", "cozystack-gpu-webhook-client-ca")["data"] == {
        "ca.crt": bundle
    }
    pod = find(objects, "Deployment", "cozystack-gpu-controller")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert env["GPU_WEBHOOK_CLIENT_CA"] == f"{mounts['webhook-client-ca']}/ca.crt"
    assert volumes["webhook-client-ca"]["configMap"]["name"] == "cozystack-gpu-webhook-client-ca"
    assert "checksum/webhook-client-ca" in pod["metadata"]["annotations"]
    refused = helm_template(helm, {"webhook": {"clientAuth": {"caBundle": "not a PEM"}}})
    assert refused.returncode != 0 and "caBundle" in refused.stderr, refused.stderr


def test_the_webhook_timeout_follows_its_value(helm: Path) -> None:
    hooks = webhooks(render(helm, {"webhook": {"timeoutSeconds": 5}}))
    assert {h["timeoutSeconds"] for h in hooks.values()} == {5}


def _public_key_verifies(issuer: x509.Certificate, cert: x509.Certificate) -> None:
    key = issuer.public_key()
    assert cert.signature_hash_algorithm is not None
    if isinstance(key, rsa.RSAPublicKey):
        key.verify(
            cert.signature,
            cert.tbs_certificate_bytes,
            padding.PKCS1v15(),
            cert.signature_hash_algorithm,
        )
    elif isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(
            cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm)
        )
    else:  # pragma: no cover - helm makes RSA keys
        raise AssertionError(f"unexpected CA key {type(key)}")


def test_generated_certificates_serve_the_service_name_under_the_bundled_ca(helm: Path) -> None:
    objects = render(helm)
    secret = find(objects, "Secret", "cozystack-gpu-webhook-tls")
    assert secret["type"] == "kubernetes.io/tls"
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert set(data) == {"ca.crt", "tls.crt", "tls.key"}
    ca = x509.load_pem_x509_certificate(data["ca.crt"])
    serving = x509.load_pem_x509_certificate(data["tls.crt"])
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"cozystack-gpu-webhook.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    _public_key_verifies(ca, serving)
    for hook in webhooks(objects).values():
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == data["ca.crt"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert "cert-manager.io/inject-ca-from" not in (
            find(objects, kind, "cozystack-gpu")["metadata"].get("annotations") or {}
        )
    # The replicas mount exactly that Secret where the controller reads its files.
    pod = find(objects, "Deployment", "cozystack-gpu-controller")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "webhook-certs"]
    assert volume["secret"]["secretName"] == "cozystack-gpu-webhook-tls"
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "webhook-certs"]
    assert mount == {
        "name": "webhook-certs",
        "mountPath": "/var/run/cozystack-gpu/webhook-certs",
        "readOnly": True,
    }


def test_cert_manager_issues_the_certificate_and_injects_the_ca(helm: Path) -> None:
    objects = render(helm, {"webhook": {"certificates": {"source": "cert-manager"}}})
    assert not [o for o in of_kind(objects, "Secret") if "webhook" in o["metadata"]["name"]]
    certificate = find(objects, "Certificate", "cozystack-gpu-webhook")
    assert certificate["spec"]["secretName"] == "cozystack-gpu-webhook-tls"
    assert f"cozystack-gpu-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"] == {"kind": "Issuer", "name": "cozystack-gpu-ca"}
    ca = find(objects, "Certificate", "cozystack-gpu-ca")
    assert ca["spec"]["isCA"] is True
    assert ca["spec"]["issuerRef"] == {"kind": "Issuer", "name": "cozystack-gpu-selfsigned"}
    assert find(objects, "Issuer", "cozystack-gpu-selfsigned")["spec"] == {"selfSigned": {}}
    assert find(objects, "Issuer", "cozystack-gpu-ca")["spec"] == {
        "ca": {"secretName": "cozystack-gpu-ca"}
    }
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        configuration = find(objects, kind, "cozystack-gpu")
        assert configuration["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/cozystack-gpu-webhook"
        }
        assert all("caBundle" not in h["clientConfig"] for h in configuration["webhooks"])


def test_cert_manager_with_a_hoster_issuer_makes_no_chain_of_its_own(helm: Path) -> None:
    issuer = {"kind": "ClusterIssuer", "name": "platform-ca"}
    objects = render(
        helm,
        {
            "webhook": {
                "certificates": {"source": "cert-manager", "certManager": {"issuerRef": issuer}}
            }
        },
    )
    assert not of_kind(objects, "Issuer")
    assert [c["metadata"]["name"] for c in of_kind(objects, "Certificate")] == [
        "cozystack-gpu-webhook"
    ]
    assert find(objects, "Certificate", "cozystack-gpu-webhook")["spec"]["issuerRef"] == issuer


# --- workloads ---------------------------------------------------------------------------


def _restrictive(container: dict[str, Any]) -> None:
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["privileged"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_the_controller_runs_two_replicas_with_probes_and_no_privileges(helm: Path) -> None:
    objects = render(helm)
    deployment = find(objects, "Deployment", "cozystack-gpu-controller")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cozystack-gpu-controller"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    _restrictive(container)
    assert container["command"] == ["python", "-m", "cozystack_gpu"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert "--health-port=8080" in container["args"]
    budget = find(objects, "PodDisruptionBudget", "cozystack-gpu-controller")
    assert budget["spec"]["minAvailable"] == 1
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_a_replica_joins_the_webhook_service_only_once_it_has_read_the_cluster(
    helm: Path,
) -> None:
    """Ready means synced: the readiness probe asks /readyz (200 only after the replica's
    first listing), not the liveness probe's /healthz, on the port the replica serves it."""
    container = find(
        render(helm, {"controller": {"ports": {"ready": 8181}}}),
        "Deployment",
        "cozystack-gpu-controller",
    )["spec"]["template"]["spec"]["containers"][0]
    probe = container["readinessProbe"]["httpGet"]
    assert probe == {"path": "/readyz", "port": "ready"}, (
        f"the readiness probe asks {probe}: a replica that has not read the cluster would "
        "serve the webhooks"
    )
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["ready"] == 8181
    assert "--ready-port=8181" in container["args"]


def test_the_chart_sets_every_controller_setting(helm: Path) -> None:
    container = find(render(helm), "Deployment", "cozystack-gpu-controller")["spec"]["template"]
    env = {e["name"]: e for e in container["spec"]["containers"][0]["env"]}
    missing = {s.env for s in config.SETTINGS} - set(env)
    assert not missing, f"settings the chart does not set: {sorted(missing)}"
    assert env["GPU_NAMESPACE"]["value"] == NAMESPACE
    assert env["GPU_IDENTITY"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # CONTRACTS.md: the webhook server's port and certificate directory.
    assert env["GPU_WEBHOOK_PORT"]["value"] == "9443"
    assert env["GPU_WEBHOOK_CERT_DIR"]["value"] == "/var/run/cozystack-gpu/webhook-certs"
    # Every value parses as the controller parses it.
    import os

    saved = dict(os.environ)
    try:
        os.environ.update({k: v["value"] for k, v in env.items() if "value" in v})
        parsed = config.from_arguments(None)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert (
        parsed.namespace == NAMESPACE and parsed.raw_resource_names == keys.RawNamesPolicy.ALLOWED
    )


def test_settings_values_reach_the_controller(helm: Path) -> None:
    values = {
        "controller": {
            "settings": {
                "rawResourceNames": "forbidden",
                "extraResourceNames": ["nvidia.com/A", "nvidia.com/B"],
                "workloadRecords": False,
            }
        }
    }
    deployment = find(render(helm, values), "Deployment", "cozystack-gpu-controller")
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["GPU_RAW_RESOURCE_NAMES"] == "forbidden"
    assert env["GPU_EXTRA_RESOURCE_NAMES"] == "nvidia.com/A,nvidia.com/B"
    assert env["GPU_WORKLOAD_RECORDS"] == "false"


def test_the_agent_runs_only_on_gpu_hosts_reading_the_host_read_only(helm: Path) -> None:
    daemonset = find(render(helm), "DaemonSet", "cozystack-gpu-agent")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cozystack-gpu-agent"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term["matchExpressions"] == [{"key": keys.LABEL_NODE_LAYOUT_STATE, "operator": "Exists"}]
    assert pod["tolerations"] == [{"operator": "Exists"}]
    (container,) = pod["containers"]
    _restrictive(container)
    assert container["command"] == ["python", "-m", "cozystack_gpu.agent"]
    assert "--sysfs-root=/host" in container["args"]
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in container["args"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert all(mounts[name]["readOnly"] for name in volumes)
    # Beside the host's paths only its /tmp (the self-signed key pair of /metrics).
    others = [v for v in pod["volumes"] if "hostPath" not in v]
    assert others == [{"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}}]
    assert (volumes["sys"], mounts["sys"]["mountPath"]) == ("/sys", "/host/sys")
    assert (volumes["pod-resources"], mounts["pod-resources"]["mountPath"]) == (
        "/var/lib/kubelet/pod-resources",
        "/var/lib/kubelet/pod-resources",
    )
    # pci.ids is looked up below the sysfs root first.
    assert mounts["pci-ids"]["mountPath"] == "/host" + volumes["pci-ids"]


def test_the_agent_is_left_out_when_disabled(helm: Path) -> None:
    objects = render(helm, {"agent": {"enabled": False}})
    assert not of_kind(objects, "DaemonSet")
    assert not [o for o in objects if o["metadata"]["name"] == "cozystack-gpu-agent"]


# --- RBAC --------------------------------------------------------------------------------


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role.get("rules") or []
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def _expand(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, r, v) for r in resources for v in verbs}


def test_the_controller_has_exactly_the_rules_it_is_tested_with(helm: Path) -> None:
    objects = render(helm)
    shipped = yaml.safe_load(DEPLOY_RBAC.read_text())["items"]
    tested_cluster = _rules(next(i for i in shipped if i["kind"] == "ClusterRole"))
    tested_ns = _rules(next(i for i in shipped if i["kind"] == "Role"))
    chart_cluster = _rules(find(objects, "ClusterRole", "cozystack-gpu-controller"))
    assert chart_cluster == tested_cluster
    role = find(objects, "Role", "cozystack-gpu-controller")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert _rules(role) == tested_ns
    binding = find(objects, "ClusterRoleBinding", "cozystack-gpu-controller")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cozystack-gpu-controller", "namespace": NAMESPACE}
    ]
    # Least privilege, whatever the controller grows into: no RBAC, no pods of its own, no
    # catalog entries of its own, and its Lease and settings only at home. Secrets only as
    # the vGPU licence copies need them (docs/licensing.md, "RBAC"): never patched, never
    # deleted as a collection.
    assert not {r for r in chart_cluster if r[1] in ("roles", "clusterroles")}
    assert {r[2] for r in chart_cluster if r[1] == "secrets"} == {
        "get", "list", "watch", "create", "update", "delete",
    }  # fmt: skip
    assert ("", "pods", "create") not in chart_cluster
    assert not {r for r in chart_cluster if r[1] == "gpuclasses" and r[2] in ("create", "delete")}
    assert not {r for r in chart_cluster if r[1] in ("leases", "configmaps")}
    # The webhooks record attachments on claims; the gate pins launcher pods.
    assert {(keys.GROUP, "gpuclaims/status", "patch"), ("", "pods", "patch")} <= chart_cluster


def test_the_controller_may_list_and_watch_every_kind_the_binder_watches(helm: Path) -> None:
    rules = _rules(find(render(helm), "ClusterRole", "cozystack-gpu-controller"))
    for kind in (*keys.BINDER_WATCHES, keys.WORKLOAD):
        for verb in ("list", "watch"):
            assert (kind.group, kind.plural, verb) in rules, (kind.kind, verb)


def test_the_agent_writes_only_gpunodes(helm: Path) -> None:
    objects = render(helm)
    rules = _rules(find(objects, "ClusterRole", "cozystack-gpu-agent"))
    assert rules == (
        _expand(keys.GROUP, ["gpunodes"], ["get", "create"])
        | _expand(keys.GROUP, ["gpunodes/status"], ["patch"])
        | _expand("", ["nodes"], ["get"])
        | _expand("", ["pods"], ["list"])
        # Its /metrics scrapers' tokens, reviewed by the API server.
        | _expand("authentication.k8s.io", ["tokenreviews"], ["create"])
        | _expand("authorization.k8s.io", ["subjectaccessreviews"], ["create"])
    )
    writes = {r for r in rules if r[2] not in ("get", "list", "watch")}
    reviews = {"tokenreviews", "subjectaccessreviews"}
    assert {r[1] for r in writes} - reviews == {"gpunodes", "gpunodes/status"}


def test_tenant_roles_are_aggregated_and_never_reach_gpunodes_or_status(helm: Path) -> None:
    objects = render(helm)
    manage = find(objects, "ClusterRole", "cozystack-gpu-claims-manage")
    read = find(objects, "ClusterRole", "cozystack-gpu-claims-read")
    assert manage["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-edit" not in manage["metadata"]["labels"]
    assert read["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    # Reservations are managed as claims are (SPEC §11).
    tenant_kinds = [keys.PLURAL_CLAIMS, keys.PLURAL_RESERVATIONS]
    assert _rules(manage) == _expand(
        keys.GROUP,
        tenant_kinds,
        ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"],
    )
    assert _rules(read) == _expand(keys.GROUP, tenant_kinds, ["get", "list", "watch"])
    catalog = find(objects, "ClusterRole", "cozystack-gpu-catalog-read")
    assert _rules(catalog) == _expand(keys.GROUP, ["gpuclasses"], ["get", "list", "watch"])
    binding = find(objects, "ClusterRoleBinding", "cozystack-gpu-catalog-read")
    assert binding["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
    ]
    for role in (manage, read, catalog):
        for _group, resource, _verb in _rules(role):
            assert resource != "gpunodes" and "/" not in resource, role["metadata"]["name"]


def test_tenant_roles_take_extra_aggregation_labels(helm: Path) -> None:
    labels = {"rbac.cozystack.io/aggregate-to-tenant-admin": "true"}
    objects = render(helm, {"rbac": {"extraAggregationLabels": {"manage": labels}}})
    manage = find(objects, "ClusterRole", "cozystack-gpu-claims-manage")
    assert labels.items() <= manage["metadata"]["labels"].items()


# --- raw-name policy ---------------------------------------------------------------------


def test_the_raw_name_policy_takes_the_settings_configmap_as_parameters(helm: Path) -> None:
    objects = render(helm)
    policy = find(objects, "ValidatingAdmissionPolicy", "cozystack-gpu-raw-resource-names")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "cozystack-gpu-raw-resource-names")
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["paramRef"]["name"] == keys.SETTINGS_CONFIGMAP
    assert binding["spec"]["paramRef"]["namespace"] == NAMESPACE
    # The keys it reads are keys.py's.
    text = json.dumps(policy["spec"])
    for key in (
        keys.SETTINGS_KEY_RAW_RESOURCE_NAMES,
        keys.SETTINGS_KEY_RESOURCE_NAMES,
        keys.ANNOTATION_CLAIMS,
        keys.TENANT_LABEL_PREFIX,
        keys.RawNamesPolicy.FORBIDDEN.value,
    ):
        assert key in text, key
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {(r["resources"][0], tuple(r["operations"])) for r in rules} == {
        ("virtualmachineinstances", ("CREATE",)),
        ("pods", ("CREATE",)),
    }
    assert "system:serviceaccount:cozy-kubevirt:kubevirt-controller" in text


def test_the_settings_configmap_exists_from_the_start_with_the_values(helm: Path) -> None:
    """The raw-name policy's parameter is rendered by the chart (before any replica runs),
    kept on uninstall, with rawResourceNames as the values say and the hoster's names."""
    values = {
        "controller": {
            "settings": {
                "rawResourceNames": "forbidden",
                "extraResourceNames": ["nvidia.com/B", "nvidia.com/A"],
            }
        }
    }
    settings = find(render(helm, values), "ConfigMap", keys.SETTINGS_CONFIGMAP)
    assert settings["metadata"]["namespace"] == NAMESPACE
    assert settings["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert settings["data"] == {
        keys.SETTINGS_KEY_RAW_RESOURCE_NAMES: "forbidden",
        keys.SETTINGS_KEY_RESOURCE_NAMES: keys.format_resource_names(
            ["nvidia.com/A", "nvidia.com/B"]
        ),
    }


@pytest.mark.parametrize(
    ("policy", "action"),
    [("forbidden", "Deny"), ("allowed", "Allow")],
)
def test_the_raw_name_binding_fails_closed_without_its_parameter_under_forbidden(
    helm: Path, policy: str, action: str
) -> None:
    """Under forbidden a missing gpu-settings refuses (nothing unchecked gets a GPU while
    the policy cannot read its names), sparing only the controller's namespace, so its
    replicas can start and write it again, and kube-system; under allowed it must not
    stop pods."""
    objects = render(helm, {"controller": {"settings": {"rawResourceNames": policy}}})
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "cozystack-gpu-raw-resource-names")
    found = binding["spec"]["paramRef"]["parameterNotFoundAction"]
    assert found == action, (
        f"rawResourceNames: {policy} with parameterNotFoundAction {found}: while gpu-settings "
        "is missing the policy enforces nothing"
    )
    if policy == "forbidden":
        (spared,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
        assert spared == {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": [NAMESPACE, "kube-system"],
        }
    else:
        assert "matchResources" not in binding["spec"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        (
            {
                "controller": {"settings": {"rawResourceNames": "forbidden"}},
                "webhook": {"enabled": False},
            },
            "controller.settings.rawResourceNames=forbidden needs webhook.enabled=true",
        ),
        (
            {
                "controller": {"settings": {"rawResourceNames": "forbidden"}},
                "rawNamePolicy": {"enabled": False},
            },
            "controller.settings.rawResourceNames=forbidden needs rawNamePolicy.enabled=true",
        ),
    ],
    ids=["without-webhooks", "without-raw-name-policy"],
)
def test_settings_that_would_enforce_nothing_are_refused_with_the_fix(
    helm: Path, values: dict[str, Any], named: str
) -> None:
    """rawResourceNames: forbidden promises that nothing unchecked gets a GPU; values that
    turn off what keeps the promise are refused, naming both and the way out."""
    result = helm_template(helm, values)
    assert result.returncode != 0, f"{values} rendered: forbidden would be enforced by nothing"
    assert named in result.stderr, result.stderr
    assert "or rawResourceNames=allowed" in result.stderr, result.stderr


def test_either_toggle_may_go_off_under_allowed(helm: Path) -> None:
    # A test control plane without kubelets, or a first install staged in two steps.
    objects = render(helm, {"webhook": {"enabled": False}, "rawNamePolicy": {"enabled": False}})
    names = {o["metadata"]["name"] for o in of_kind(objects, "ValidatingAdmissionPolicy")}
    assert "cozystack-gpu-raw-resource-names" not in names
    assert not of_kind(objects, "ValidatingWebhookConfiguration")


def test_the_policies_read_uses_claims_from_the_reference_label_as_keys_py_spells_it(
    helm: Path,
) -> None:
    objects = render(helm)
    for name in ("cozystack-gpu-raw-resource-names", "cozystack-gpu-claims-label"):
        text = json.dumps(find(objects, "ValidatingAdmissionPolicy", name)["spec"])
        # keys.uses_claims: the label, with exactly its value.
        assert keys.LABEL_CLAIMS_REF in text and f"== '{keys.LABEL_CLAIMS_REF_VALUE}'" in text
        assert "holdsClaims" not in text, name


def test_the_protection_policy_exempts_only_the_controllers_service_account(
    helm: Path,
) -> None:
    objects = render(helm, namespace="gpu-system")
    policy = find(objects, "ValidatingAdmissionPolicy", "cozystack-gpu-protection")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "cozystack-gpu-protection")
    account = [
        o
        for o in of_kind(objects, "ServiceAccount")
        if o["metadata"]["name"].endswith("controller")
    ]
    assert len(account) == 1
    controller = f"system:serviceaccount:gpu-system:{account[0]['metadata']['name']}"
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert policy["spec"]["matchConditions"] == [
        {"name": "not-the-controller", "expression": f'request.userInfo.username != "{controller}"'}
    ]
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["apiGroups"], sorted(r["resources"]), sorted(r["operations"])) for r in rules] == [
        ([keys.GROUP], ["gpuclaims", "gpuclasses"], ["CREATE", "UPDATE"])
    ]
    text = json.dumps(policy["spec"])
    marks = (keys.LABEL_TEMPLATE_CLAIM, keys.ANNOTATION_TEMPLATE_VMI_UID)
    for key in (keys.FINALIZER_CLAIM, keys.FINALIZER_CLASS, *marks):
        assert key in text, key
    # The controller's own deletes of claims: template claims only.
    deletes = find(objects, "ValidatingAdmissionPolicy", "cozystack-gpu-controller-claim-deletes")
    assert deletes["spec"]["failurePolicy"] == "Fail"
    assert deletes["spec"]["matchConditions"] == [
        {"name": "the-controller", "expression": f'request.userInfo.username == "{controller}"'}
    ]
    rules = deletes["spec"]["matchConstraints"]["resourceRules"]
    assert [(r["resources"], r["operations"]) for r in rules] == [(["gpuclaims"], ["DELETE"])]
    text = json.dumps(deletes["spec"]["validations"])
    assert all(mark in text for mark in marks)
    binding = find(objects, "ValidatingAdmissionPolicyBinding", deletes["metadata"]["name"])
    assert binding["spec"]["validationActions"] == ["Deny"]


# --- metrics and dashboard -----------------------------------------------------------------


def _known_metrics() -> set[str]:
    names: set[str] = set()
    collectors = [v for v in vars(metrics).values() if isinstance(v, MetricWrapperBase)]
    collectors += [v for v in vars(AgentMetrics()).values() if isinstance(v, MetricWrapperBase)]
    for collector in collectors:
        for family in collector.describe():
            names.add(family.name)
            names.update({family.name + s for s in ("_total", "_bucket", "_sum", "_count")})
    return names


def test_the_dashboard_shows_what_the_issue_asks_from_metrics_that_exist(helm: Path) -> None:
    objects = render(helm)
    configmap = find(objects, "ConfigMap", "cozystack-gpu-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["cozystack-gpu.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcozystack_gpu_[a-z_]+\b", e)}
    assert used <= _known_metrics(), used - _known_metrics()
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("capacity", "free", "bound", "attached", "lost", "latency", "refusals", "node"):
        assert topic in titles, topic


def test_operations_doc_shows_every_panel_and_every_alert(helm: Path) -> None:
    doc = (CHART.parents[1] / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Dashboard and alerts") :]
    section = section[: section.index("\n## ", 1)]
    dashboard = json.loads((CHART / "files" / "dashboards" / "cozystack-gpu.json").read_text())
    for panel in dashboard["panels"]:
        assert f"| {panel['title'].split(' (')[0]}" in section, panel["title"]
    enabled = render(helm, {"metrics": {"prometheusRule": {"enabled": True}}})
    rule = find(enabled, "PrometheusRule", "cozystack-gpu")
    for group in rule["spec"]["groups"]:
        for alert in group["rules"]:
            assert f"| `{alert['alert']}`" in section, alert["alert"]
    # Every metric an alert reads exists.
    exprs = [r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]]
    used = {m for e in exprs for m in re.findall(r"\bcozystack_gpu_[a-z_]+\b", e)}
    assert used <= _known_metrics(), used - _known_metrics()


def test_monitoring_objects_follow_their_values(helm: Path) -> None:
    objects = render(helm)
    assert find(objects, "Service", "cozystack-gpu-metrics")["spec"]["ports"][0]["port"] == 9090
    assert not of_kind(objects, "ServiceMonitor")
    enabled = render(helm, {"metrics": {"serviceMonitor": {"enabled": True}}})
    monitor = find(enabled, "ServiceMonitor", "cozystack-gpu-controller")
    service = find(enabled, "Service", "cozystack-gpu-metrics")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert find(enabled, "PodMonitor", "cozystack-gpu-agent")
    assert not of_kind(enabled, "PrometheusRule")
    with_rules = render(
        helm,
        {
            "metrics": {
                "prometheusRule": {
                    "enabled": True,
                    "labels": {"release": "kube-prometheus"},
                    "alerts": {"lostClaims": {"for": "42m"}},
                }
            }
        },
    )
    rule = find(with_rules, "PrometheusRule", "cozystack-gpu")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts["CozystackGPUClaimsLost"]["for"] == "42m"
    # Prometheus's own templates reach it unrendered by Helm.
    assert "{{ $labels.class }}" in alerts["CozystackGPUClaimsLost"]["annotations"]["summary"]
    assert not [
        o
        for o in of_kind(render(helm, {"dashboard": {"enabled": False}}), "ConfigMap")
        if o["metadata"]["name"] != keys.SETTINGS_CONFIGMAP
    ]


def test_the_service_monitor_scrapes_over_https_with_a_reader_token(helm: Path) -> None:
    enabled = render(helm, {"metrics": {"serviceMonitor": {"enabled": True}}})
    (endpoint,) = find(enabled, "ServiceMonitor", "cozystack-gpu-controller")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "cozystack-gpu-metrics-scraper-token", "key": "token"},
    }
    assert endpoint["tlsConfig"] == {
        "serverName": f"cozystack-gpu-webhook.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "cozystack-gpu-webhook-tls", "key": "ca.crt"}},
    }
    token = find(enabled, "Secret", "cozystack-gpu-metrics-scraper-token")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "cozystack-gpu-metrics-scraper"
    }
    assert find(enabled, "ServiceAccount", "cozystack-gpu-metrics-scraper")
    binding = find(enabled, "ClusterRoleBinding", "cozystack-gpu-metrics-reader")
    assert binding["roleRef"]["name"] == "cozystack-gpu-metrics-reader"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cozystack-gpu-metrics-scraper", "namespace": NAMESPACE}
    ]
    # The agents' inventory: HTTPS with the same token (their certificates are their own).
    (agent,) = find(enabled, "PodMonitor", "cozystack-gpu-agent")["spec"]["podMetricsEndpoints"]
    assert (agent["port"], agent["scheme"]) == ("metrics", "https")
    assert agent["authorization"] == endpoint["authorization"]
    assert agent["tlsConfig"] == {"insecureSkipVerify": True}
    daemonset = find(enabled, "DaemonSet", "cozystack-gpu-agent")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 8443} in container["ports"]
    assert "--metrics-listen=0.0.0.0:8443" in container["args"]
    # A Prometheus configured by hand, bound by the hoster's values.
    prometheus = {"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"}
    own = render(helm, {"metrics": {"reader": {"subjects": [prometheus]}}})
    assert not [o for o in own if o["metadata"]["name"].startswith("cozystack-gpu-metrics-scr")]
    assert find(own, "ClusterRoleBinding", "cozystack-gpu-metrics-reader")["subjects"] == [
        prometheus
    ]


def test_only_the_metrics_reader_role_grants_metrics_and_nobody_holds_it_by_default(
    helm: Path,
) -> None:
    objects = render(helm)
    reader = find(objects, "ClusterRole", "cozystack-gpu-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    assert not [
        o
        for o in objects
        if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["name"] == reader["metadata"]["name"]
    ]
    granting = [
        o["metadata"]["name"]
        for o in of_kind(objects, "ClusterRole") + of_kind(objects, "Role")
        if any("nonResourceURLs" in rule for rule in o.get("rules") or [])
    ]
    assert granting == ["cozystack-gpu-metrics-reader"]
    # The controller reviews each scraper's token and access.
    controller = _rules(find(objects, "ClusterRole", "cozystack-gpu-controller"))
    assert {
        ("authentication.k8s.io", "tokenreviews", "create"),
        ("authorization.k8s.io", "subjectaccessreviews", "create"),
    } <= controller


def test_the_network_policy_lets_only_named_peers_reach_the_metrics_port(helm: Path) -> None:
    assert not of_kind(render(helm), "NetworkPolicy")
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]
    objects = render(helm, {"metrics": {"networkPolicy": {"enabled": True, "from": peers}}})
    policy = find(objects, "NetworkPolicy", "cozystack-gpu-controller")
    assert policy["spec"]["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "cozystack-gpu",
        "app.kubernetes.io/component": "controller",
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    open_to_all, metrics_only = policy["spec"]["ingress"]
    assert "from" not in open_to_all
    assert {p["port"] for p in open_to_all["ports"]} == {9443, 8080}
    assert metrics_only == {"ports": [{"port": 9090, "protocol": "TCP"}], "from": peers}


# --- the schema --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"controller": {"replicas": 0}}, "replicas"),
        ({"controller": {"settings": {"rawResourceNames": "sometimes"}}}, "rawResourceNames"),
        (
            {"controller": {"settings": {"extraResourceNames": ["not a name!"]}}},
            "extraResourceNames",
        ),
        ({"controller": {"settings": {"writeWorkers": "8"}}}, "writeWorkers"),
        ({"webhook": {"timeoutSeconds": 31}}, "timeoutSeconds"),
        ({"webhook": {"failurePolicy": "Ignore"}}, "failurePolicy"),
        ({"webhook": {"certificates": {"source": "vault"}}}, "source"),
        (
            {"webhook": {"certificates": {"certManager": {"issuerRef": {"kind": "Issuer"}}}}},
            "issuerRef",
        ),
        ({"image": {"digest": "latest"}}, "digest"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"agent": {"tolerations": [{"operator": "Gt"}]}}, "operator"),
        ({"agent": {"hostPaths": {"sys": "sys"}}}, "sys"),
        ({"rawNamePolicy": {"virtControllerUser": "kubevirt-controller"}}, "virtControllerUser"),
        ({"replicas": 2}, "replicas"),
        ({"controller": {"resources": {"limits": {"gpu": 1}}}}, "gpu"),
        ({"metrics": {"prometheusRule": {"alerts": {"noLeader": {"for": "5 min"}}}}}, "for"),
        (
            {"metrics": {"prometheusRule": {"alerts": {"ordersWaiting": {"afterSeconds": "1h"}}}}},
            "afterSeconds",
        ),
        ({"metrics": {"serviceMonitor": {"tlsConfig": "insecure"}}}, "tlsConfig"),
        ({"metrics": {"networkPolicy": {"enabled": True, "from": []}}}, "from"),
        ({"metrics": {"reader": {"subjects": [{"kind": "Pod", "name": "x"}]}}}, "kind"),
    ],
)
def test_the_schema_refuses_bad_values_by_name(
    helm: Path, values: dict[str, Any], named: str
) -> None:
    result = helm_template(helm, values)
    assert result.returncode != 0, f"{values} rendered"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert named in result.stderr, result.stderr


def test_every_default_value_is_described_by_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if isinstance(value, dict) and node.get("additionalProperties") is False:
            for key, item in value.items():
                assert key in node["properties"], f"{path}.{key} has no schema"
                walk(item, node["properties"][key], f"{path}.{key}")
        else:
            assert node, f"{path} has no schema"

    walk(values, schema, "values")
    # Closed objects everywhere the chart reads fixed keys.
    assert schema["additionalProperties"] is False


def test_claim_protection_goes_on_at_create_by_policy_where_served_else_by_the_webhook(
    helm: Path,
) -> None:
    """One or the other puts claim-protection on every new claim, never both and never
    neither: the MutatingAdmissionPolicy when asked for and served, else the claim
    webhook's mutating half."""
    served = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"
    on = {"webhook": {"mutatingAdmissionPolicy": True}}
    for values, api_versions, policy in (
        ({}, (served,), False),  # off by default: the webhook, even where served
        (on, (), False),
        (on, (served,), True),
    ):
        objects = render(helm, values, api_versions=api_versions)
        hooks = webhooks(objects)
        fallback = ("MutatingWebhookConfiguration", "gpuclaim-protection.gpu.cozystack.io")
        assert (fallback in hooks) is not policy, api_versions
        policies = of_kind(objects, "MutatingAdmissionPolicy")
        bindings = of_kind(objects, "MutatingAdmissionPolicyBinding")
        assert len(policies) == len(bindings) == int(policy), api_versions
        if policy:
            (spec,) = (p["spec"] for p in policies)
            assert spec["failurePolicy"] == "Fail"
            rules = spec["matchConstraints"]["resourceRules"]
            assert rules == [
                {
                    "apiGroups": [keys.GROUP],
                    "apiVersions": [keys.VERSION],
                    "operations": ["CREATE"],
                    "resources": [keys.PLURAL_CLAIMS],
                }
            ]
            assert keys.FINALIZER_CLAIM in spec["mutations"][0]["jsonPatch"]["expression"]
            assert bindings[0]["spec"]["policyName"] == policies[0]["metadata"]["name"]
