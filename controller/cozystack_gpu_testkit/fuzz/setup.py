"""The run's set-up before the first operation: the chart's admission in force (its webhook
configurations through the webhooks' Service, its policies with the replicas exempt where
the chart exempts the controller), tenant admins as the chart grants them, KubeVirt
started, and ``rawResourceNames: forbidden`` enforced (``prepare``); ``Admission`` is what
the caller brings of the chart."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj
from cozystack_gpu_testkit import kubevirt, tenants
from cozystack_gpu_testkit.chart import install_policies
from cozystack_gpu_testkit.fault_suite import Run, Service, WebhookSetup
from cozystack_gpu_testkit.fuzz.stage import FUZZ_LABEL, Stage
from cozystack_gpu_testkit.kubevirt.stand_in import RealKubeVirt
from cozystack_gpu_testkit.objects import Kube, message_of, wait_for
from cozystack_gpu_testkit.plane_config import ADMIN_USER

TENANT_ADMIN = "tenant-admin"
VIRT_CONTROLLER = kubevirt.USER  # who a cluster's virt-controller is; the kit runs it so


def impersonating(run: Run, user: str) -> Kube:
    return tenants.impersonating(run.plane.api_client(), user)


@dataclass(frozen=True)
class Admission:
    """The chart's admission objects: its webhook configurations (``WebhookSetup``) and
    ``render(template, namespace, values)``, ``helm template`` of one chart template."""

    webhooks: WebhookSetup
    render: Callable[[str, str, Mapping[str, Any]], list[MutableObj]]


def grant(run: Run, admission: Admission, namespaces: Sequence[str]) -> None:
    """Tenant admins as the chart grants them (its roles aggregated into ``admin``) and VMs
    as KubeVirt's roles grant them; virt-controller has KubeVirt's own roles
    (``kubevirt.install``)."""
    chart_roles = admission.render("rbac-tenant.yaml", run.namespace, {})
    tenants.grant_tenant_admin(run.api, chart_roles, TENANT_ADMIN, namespaces)


def prepare(run: Run, admission: Admission, stage: Stage) -> list[MutableObj]:
    """The run's admission in force and who acts: the chart's webhook configurations
    (returned: the driver removes them at the end) calling the webhooks' Service, its
    policies, the tenant admins, KubeVirt (its own virt-controller and virt-api, the parts
    the kit plays journaled); returns once the raw-name policy refuses under ``forbidden``."""
    world = run.world
    for identity in run.replicas:

        def serving(identity: str = identity) -> bool:
            return run.webhook_serving(identity)

        wait_for(serving, 60, f"{identity}'s webhook server")
    service = stage.service = Service(run, "r1")
    hooks = admission.webhooks.configurations(service)
    admission.webhooks.install(run.api, hooks)
    policies: list[MutableObj] = []
    for template, values in (
        ("raw-names-policy.yaml", {"rawNamePolicy": {"virtControllerUser": VIRT_CONTROLLER}}),
        ("claims-label-policy.yaml", {}),
        ("protection-policy.yaml", {}),
        ("launcher-gate-policy.yaml", {}),
        ("dra-claims-policy.yaml", {"controller": {"settings": {"rawResourceNames": "forbidden"}}}),
    ):
        policies += admission.render(template, run.namespace, values)
    install_policies(run.api, [_as_replicas(p) for p in policies])
    grant(run, admission, world.tenants)
    stage.tenant = impersonating(run, TENANT_ADMIN)
    selector = f"{FUZZ_LABEL}={world.id}"
    stage.kubevirt = RealKubeVirt(run.plane, run.kube, world.vm_nodes, stage.journal, selector)
    wait_enforced(run)
    return hooks


def wait_enforced(run: Run) -> None:
    """Until the webhooks are called and the raw-name policy refuses under
    ``forbidden`` (the controller writes its settings; the policy reads them)."""
    controller = impersonating(run, VIRT_CONTROLLER)
    tenant = run.world.tenants[-1]

    def refused(body: MutableObj, needle: str) -> bool:
        try:
            controller.custom.create_namespaced_custom_object(
                keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, body,
                dry_run="All",
            )  # fmt: skip
        except ApiException as exc:
            return needle in message_of(exc)
        return False

    def vmi(name: str, labels: MutableObj, notes: MutableObj, gpus: list[MutableObj]) -> MutableObj:
        return {
            "apiVersion": keys.VMI.api_version,
            "kind": keys.VMI.kind,
            "metadata": {"name": name, "labels": labels, "annotations": notes},
            "spec": {"domain": {"devices": {"gpus": gpus}, "memory": {"guest": "1Gi"}}},
        }

    label = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    malformed = vmi("probe-webhook", label, {keys.ANNOTATION_CLAIMS: "probe"}, [])
    raw = vmi("probe-raw", {}, {}, [{"name": "g", "deviceName": run.world.resource}])
    wait_for(lambda: refused(malformed, "malformed"), 60, "the webhooks called", 0.2)
    wait_for(lambda: refused(raw, "forbidden"), 90, "rawResourceNames: forbidden enforced", 0.5)


_CONTROLLER_USER = re.compile(r"system:serviceaccount:[a-z0-9-]+:[a-z0-9-]*controller")


def _as_replicas(policy: MutableObj) -> MutableObj:
    """The chart's protection, launcher-gate and dra-claims policies exempt the controller's
    ServiceAccount; the replicas here run with the kit's admin identity, so that is the one
    they exempt."""
    name = policy.get("metadata", {}).get("name", "")
    if not any(part in name for part in ("protection", "launcher-gate", "dra-claims")):
        return policy
    text = _CONTROLLER_USER.sub(ADMIN_USER, json.dumps(policy))
    exempting: MutableObj = json.loads(text)
    return exempting
