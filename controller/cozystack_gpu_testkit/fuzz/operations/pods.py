"""What a tenant does with pods of its own: forge a running VMI's launcher pod, take the claims
gate off its own launcher pod."""

from __future__ import annotations

import logging

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects.translate import meta
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage
from cozystack_gpu_testkit.invariants import FORGED_ADMITTED, UNGATED_BY_TENANT
from cozystack_gpu_testkit.objects import TIMEOUT, message_of

log = logging.getLogger(__name__)


def forged_pod(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant makes a pod of its own that forges a running VMI's launcher pod: the
    launcher and claims labels, an owner reference to the VMI, a GPU request. Under
    forbidden the raw-name policy refuses it (only virt-controller's launcher pods may
    request a GPU name); admitted, it would be a second pod covered by the same claims."""
    running = sorted(stage.kubevirt.running)
    if not running:
        return "", "no running VMI", set()
    namespace, vm_name = stage.rng.choice(running)
    vmi = kubevirt.get_vmi(run.kube, namespace, vm_name)
    if vmi is None:
        return f"{namespace}/{vm_name}", "its VMI is gone", {vm_name}
    name = stage.next_name("forged")
    body = {
        "metadata": {
            "name": name,
            "labels": {
                "kubevirt.io": "virt-launcher",
                keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE,
            },
            "ownerReferences": [
                {
                    "apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind,
                    "name": vm_name, "uid": meta(vmi)["uid"], "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "compute", "image": kubevirt.LAUNCHER_IMAGE,
                    "resources": {"limits": {run.world.resource: "1"}},
                }
            ]
        },
    }  # fmt: skip
    args = f"{namespace}/{name} forging VMI {vm_name}'s launcher pod, 1 x {run.world.resource}"
    try:
        stage.tenant.core.create_namespaced_pod(namespace, body, _request_timeout=TIMEOUT)
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {vm_name, name}
    text = f"{FORGED_ADMITTED}: {namespace}/{name} (forging VMI {vm_name}'s launcher pod)"
    stage.forged.append((text, stage.journal.last + 1))
    log.error("seed %d: %s", stage.seed, text)
    run.kube.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return args, "ADMITTED", {vm_name, name}


def ungate_pod(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    """The tenant admin removes the claims scheduling gate from one of its own gated
    launcher pods (the built-in admin role grants pods patch): ungated so, the pod would
    reach kube-scheduler unpinned and take any free unit. Only the controller may remove
    the gate, in the update that pins the pod (the launcher-gate policy)."""
    gated = [
        (pod.metadata.namespace, pod.metadata.name)
        for namespace in run.world.tenants
        for pod in run.kube.core.list_namespaced_pod(namespace, _request_timeout=TIMEOUT).items
        if any(g.name == keys.SCHEDULING_GATE_CLAIMS for g in pod.spec.scheduling_gates or [])
    ]
    if not gated:
        return "", "no gated launcher pod", set()
    namespace, name = stage.rng.choice(sorted(gated))
    args = f"{namespace}/{name}"
    patch = [{"op": "remove", "path": "/spec/schedulingGates"}]
    try:
        stage.tenant.core.patch_namespaced_pod(
            name, namespace, patch, _content_type="application/json-patch+json",
            _request_timeout=TIMEOUT,
        )  # fmt: skip
    except ApiException as exc:
        return args, f"refused: {message_of(exc)}", {name}
    text = f"{UNGATED_BY_TENANT}: {namespace}/{name}"
    stage.forged.append((text, stage.journal.last + 1))
    log.error("seed %d: %s", stage.seed, text)
    return args, "ADMITTED", {name}
