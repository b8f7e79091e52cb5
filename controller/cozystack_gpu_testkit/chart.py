"""The chart's own templates, rendered by ``helm template`` as ``helm install`` would: tests
and the fault suite install the chart's objects themselves, not copies of them."""

from __future__ import annotations

import datetime
import subprocess
from collections.abc import Iterable, Mapping
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster

CHART = cluster.REPO_ROOT / "controller" / "chart"
KUBE_VERSION = "1.37.2"


def helm_template(
    template: str,
    namespace: str,
    values: Mapping[str, Any] | None = None,
    api_versions: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The objects one chart template renders to; ``api_versions`` are what the API server
    serves beyond helm's defaults (``helm install`` asks the server itself)."""
    result = subprocess.run(
        [
            str(cluster.binary_dir() / "helm"),
            "template",
            "cozystack-gpu",
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            KUBE_VERSION,
            "--show-only",
            f"templates/{template}",
            *(f"--api-versions={v}" for v in api_versions),
            "--values",
            "-",
        ],
        input=yaml.safe_dump(dict(values or {})),
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if result.returncode != 0:
        raise AssertionError(f"helm template {template} failed:\n{result.stderr}")
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def install_policies(api: Any, objects: Iterable[Mapping[str, Any]]) -> None:
    """The chart's ValidatingAdmissionPolicies and their bindings, created."""
    admission = client.AdmissionregistrationV1Api(api)
    for obj in objects:
        if obj["kind"] == "ValidatingAdmissionPolicy":
            admission.create_validating_admission_policy(obj)
        elif obj["kind"] == "ValidatingAdmissionPolicyBinding":
            admission.create_validating_admission_policy_binding(obj)
        else:
            raise ValueError(f"not a policy object: {obj['kind']}")


def install_claim_fence(api: Any, namespace: str) -> None:
    """The claim-fence policy of a chart installed in ``namespace`` (whose binder Lease is
    its parameter): a binder's claim status write of a term that is not the Lease's is
    refused."""
    install_policies(api, helm_template("claim-fence-policy.yaml", namespace))


def binder_lease(api: Any, namespace: str, holder: str, term: int, duration_s: int = 15) -> None:
    """The binder's Lease (the claim fence's parameter) as an election leaves it: ``holder``
    leads in ``term`` (``leaseTransitions``), renewed now."""
    coordination = client.CoordinationV1Api(api)
    body = {
        "metadata": {"name": keys.LEASE_NAME_BINDER, "namespace": namespace},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration_s,
            "renewTime": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "leaseTransitions": term,
        },
    }
    try:
        coordination.create_namespaced_lease(namespace, body)
    except ApiException as exc:
        if exc.status != 409:
            raise
        coordination.patch_namespaced_lease(keys.LEASE_NAME_BINDER, namespace, body)
