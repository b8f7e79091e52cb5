"""virt-handler's part of a live migration, which no real component plays here (SPEC §12):
it marks a running VMI ``LiveMigratable`` (as it does for mdev vGPUs with KubeVirt's
``VGPULiveMigration`` gate), and, once the target pod runs, writes the migration's end and
the VMI on the target node (``lands``) or, when it fails, the failure on the source
(``fails``). KubeVirt's own virt-controller makes the target pod from a
``VirtualMachineInstanceMigration`` (``migrate``) and hands the VMI over."""

from __future__ import annotations

import datetime
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu_testkit.kubevirt.node import retried_on_conflict
from cozystack_gpu_testkit.kubevirt.virt_controller import virt_handler
from cozystack_gpu_testkit.kubevirt.vms import get_vmi
from cozystack_gpu_testkit.objects import Kube

MIGRATIONS = "virtualmachineinstancemigrations"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def handler_writes(kube: Kube, namespace: str, name: str, status: dict[str, Any]) -> None:
    """A VMI status change written as virt-handler writes it (virt-api's mutator drops a
    status change of anyone else), over the version read, kept beside the rest."""

    def write() -> None:
        found = get_vmi(kube, namespace, name)
        if found is None:
            raise AssertionError(f"VMI {namespace}/{name} is gone")
        merged = {**(found.get("status") or {}), **status}
        virt_handler(kube).custom.patch_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, name,
            {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]},
             "status": merged},
        )  # fmt: skip

    retried_on_conflict(write)


def migratable(kube: Kube, namespace: str, name: str) -> None:
    """The LiveMigratable condition, and what virt-controller waits for before a target
    pod: the SELinux context the guest runs in ("none" without SELinux) and the method."""
    found = get_vmi(kube, namespace, name)
    if found is None:
        raise AssertionError(f"VMI {namespace}/{name} is gone")
    conditions = [
        c for c in (found.get("status") or {}).get("conditions") or []
        if c.get("type") != "LiveMigratable"
    ]  # fmt: skip
    conditions.append(
        {"type": "LiveMigratable", "status": "True", "lastProbeTime": None,
         "lastTransitionTime": _now()}
    )  # fmt: skip
    handler_writes(
        kube, namespace, name,
        {"conditions": conditions, "selinuxContext": "none", "migrationMethod": "LiveMigration"},
    )  # fmt: skip


def is_migratable(vmi: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "LiveMigratable" and c.get("status") == "True"
        for c in (vmi.get("status") or {}).get("conditions") or []
    )


def migrate(kube: Kube, namespace: str, vmi: str, name: str) -> dict[str, Any]:
    """A ``VirtualMachineInstanceMigration`` of the VMI, as a tenant or the host upgrade
    makes one; ``kube`` is who makes it."""
    made: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, namespace, MIGRATIONS,
        {"apiVersion": keys.VMI.api_version, "kind": "VirtualMachineInstanceMigration",
         "metadata": {"name": name}, "spec": {"vmiName": vmi}},
    )  # fmt: skip
    return made


def lands(
    kube: Kube,
    namespace: str,
    name: str,
    uid: str,
    source: str,
    target: str,
    pod: str,
    source_pod: str | None = None,
) -> None:
    """The migration of ``uid`` succeeded: the target's address, its start and end, and the
    VMI on the target node (beside what virt-controller wrote in ``migrationState``)."""
    found = get_vmi(kube, namespace, name)
    if found is None:
        raise AssertionError(f"VMI {namespace}/{name} is gone")
    state = {**((found.get("status") or {}).get("migrationState") or {})}
    state.update(
        migrationUid=uid, sourceNode=source, targetNode=target, targetPod=pod,
        targetNodeAddress="127.0.0.1", startTimestamp=_now(), endTimestamp=_now(),
        completed=True,
    )  # fmt: skip
    if source_pod is not None:
        state["sourcePod"] = source_pod
    handler_writes(kube, namespace, name, {"nodeName": target, "migrationState": state})


def fails(
    kube: Kube, namespace: str, name: str, uid: str, source: str, target: str, pod: str
) -> None:
    """The migration of ``uid`` failed (the guest could not be moved): virt-handler ends it
    with ``failed``, the VMI stays on the source node, and the target pod's launcher exits
    (kubelet writes the pod Failed)."""
    found = get_vmi(kube, namespace, name)
    if found is None:
        raise AssertionError(f"VMI {namespace}/{name} is gone")
    state = {**((found.get("status") or {}).get("migrationState") or {})}
    state.update(
        migrationUid=uid, sourceNode=source, targetNode=target, startTimestamp=_now(),
        endTimestamp=_now(), completed=True, failed=True,
    )  # fmt: skip
    handler_writes(kube, namespace, name, {"nodeName": source, "migrationState": state})
    kube.core.patch_namespaced_pod_status(pod, namespace, {"status": {"phase": "Failed"}})
