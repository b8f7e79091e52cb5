"""Live migration keeps the hold (SPEC §12), on KubeVirt's own virt-controller: a
``VirtualMachineInstanceMigration`` makes virt-controller render the target pod; the pod
webhook gates it, the binder places the set's target on another node, records it on the
claim and pins and ungates the pod in one update; the real kube-scheduler binds it there.
The kit plays virt-handler (the VMI ``LiveMigratable``, then the VM landing on the target)
and kubelet. The hold follows the VM when it lands; a failed migration frees the target."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from admission_env import Replica, order
from binder_env import Env

from cozystack_gpu import keys
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.kubevirt.virt_controller import virt_handler
from cozystack_gpu_testkit.objects import Kube, wait_for

pytestmark = pytest.mark.apiserver

TIMEOUT = kubevirt_kit.START_TIMEOUT_S


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_handler_writes(kube: Kube, namespace: str, name: str, status: dict[str, Any]) -> None:
    """A VMI status change written as virt-handler writes it (virt-api's mutator drops a
    status change of anyone else), over the version read."""

    def write() -> None:
        found = kubevirt_kit.get_vmi(kube, namespace, name)
        assert found is not None
        merged = {**(found.get("status") or {}), **status}
        virt_handler(kube).custom.patch_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, name,
            {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
             "status": merged},
        )  # fmt: skip

    kubevirt_kit.retried_on_conflict(write)


def migratable(kube: Kube, namespace: str, name: str) -> None:
    """What virt-handler reports of a VMI whose devices can move (mdev vGPU with KubeVirt's
    VGPULiveMigration gate): the LiveMigratable condition."""
    found = kubevirt_kit.get_vmi(kube, namespace, name)
    assert found is not None
    conditions = [
        c for c in (found.get("status") or {}).get("conditions") or []
        if c.get("type") != "LiveMigratable"
    ]  # fmt: skip
    conditions.append({"type": "LiveMigratable", "status": "True", "lastTransitionTime": _now()})
    as_handler_writes(kube, namespace, name, {"conditions": conditions})


def migrate(kube: Kube, namespace: str, vmi: str, name: str) -> dict[str, Any]:
    made: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, namespace, "virtualmachineinstancemigrations",
        {"apiVersion": keys.VMI.api_version, "kind": "VirtualMachineInstanceMigration",
         "metadata": {"name": name}, "spec": {"vmiName": vmi}},
    )  # fmt: skip
    return made


def target_pod(kube: Kube, namespace: str, vmi_uid: str, migration_uid: str) -> Any:
    def found() -> dict[str, Any] | None:
        for pod in kubevirt_kit.launcher_pods(kube, namespace, vmi_uid):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(keys.LABEL_MIGRATION_JOB_UID) == migration_uid:
                return pod
        return None

    return found


def test_a_migration_target_is_placed_pinned_and_the_hold_follows_the_vm(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    nodes = [env.node(n, 2) for n in ("n1", "n2")]
    for node in nodes:
        kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    order(kube, env.tenant, "a", gpu_class, 1)
    source = env.wait_phase("a", "Bound", timeout=TIMEOUT)["status"]["nodeName"]
    (other,) = [n for n in nodes if n != source]
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    vmi = kubevirt_kit.runs(kube, env.tenant, kubevirt_kit.wait_vmi(kube, env.tenant, "vm"))
    assert vmi["status"]["nodeName"] == source
    env.wait_phase("a", "Attached", timeout=TIMEOUT)
    migratable(kube, env.tenant, "vm")

    job = migrate(kube, env.tenant, "vm", "move")
    uid = job["metadata"]["uid"]
    found = target_pod(kube, env.tenant, vmi["metadata"]["uid"], uid)
    first = wait_for(found, TIMEOUT, "virt-controller's target pod")
    assert vmi_pods.is_gated(first) or vmi_pods.pinned_node(first) == other, first["metadata"]

    # The target recorded on the claim, then the pod pinned there and bound by the scheduler.
    def recorded() -> dict[str, Any] | None:
        status = kube.get_claim(env.tenant, "a").get("status") or {}
        return status if (status.get("migration") or {}).get("migrationUID") == uid else None

    status = wait_for(recorded, TIMEOUT, "the target recorded on claim a")
    assert status["migration"]["node"] == other and status["nodeName"] == source
    bound = wait_for(
        lambda: (p := found()) and p["spec"].get("nodeName") and p, TIMEOUT, "the target bound"
    )
    assert bound["spec"]["nodeName"] == other
    assert vmi_pods.pinned_node(bound) == other and not vmi_pods.is_gated(bound)

    # While it runs, the target's unit counts on its node: the other node has one left.
    order(kube, env.tenant, "two", gpu_class, 2)
    assert env.phase("two") != "Bound"

    # virt-handler: the VM runs on the target now.
    kubevirt_kit.kubelet_runs(kube.api, env.tenant, bound["metadata"]["name"])
    state = {"migrationUid": uid, "sourceNode": source, "targetNode": other,
             "targetPod": bound["metadata"]["name"], "completed": True,
             "startTimestamp": _now(), "endTimestamp": _now()}  # fmt: skip
    as_handler_writes(kube, env.tenant, "vm", {"nodeName": other, "migrationState": state})

    def moved() -> dict[str, Any] | None:
        status = kube.get_claim(env.tenant, "a").get("status") or {}
        return status if status.get("nodeName") == other and not status.get("migration") else None

    status = wait_for(moved, TIMEOUT, "the hold moved to the target")
    assert status["phase"] == "Attached" and status["attachedTo"] == "vm"
