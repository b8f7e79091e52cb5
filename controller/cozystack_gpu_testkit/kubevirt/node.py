"""The node's part, which no real component plays here: what virt-handler does to its node
(``as_virt_handler``), kubelet running and removing launcher pods, virt-handler reporting
VMI phases (``reports``) and shutting deleted guests down, and, on top of those, a VMI
brought to Running (``runs``), ``virtctl stop`` and ``restart`` (``stops``,
``restarts``) and the clean-up of a test's VMs (``removes_vms``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from typing import Any

from cozystack_gpu_testkit.kubevirt.install import go_architecture
from cozystack_gpu_testkit.kubevirt.virt_controller import virt_handler
from cozystack_gpu_testkit.kubevirt.vms import (
    LAUNCHER_SELECTOR,
    START_TIMEOUT_S,
    get_vmi,
    set_run_strategy,
    uid_of,
    wait_launcher,
)
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

# Labels virt-handler sets on its node that every launcher pod's nodeSelector asks for: it
# is schedulable, and its node labeller lists the machine types its libvirt supports,
# among them q35 (the type virt-api's mutators give every VM and VMI on x86).
NODE_LABELS = {"kubevirt.io/schedulable": "true", "machine-type.node.kubevirt.io/q35": "true"}
# What kubelet labels its node with at registration that launcher pods ask for too: the
# architecture, which virt-api's mutator gives every VMI (virt-operator's default one).
KUBELET_LABELS = {"kubernetes.io/arch": go_architecture()}
# What virt-handler's permanent device plugins advertise on its node (1000 each, its
# --max-devices default); every launcher pod's compute container asks for one of each.
NODE_DEVICES = {f"devices.kubevirt.io/{name}": "1000" for name in ("kvm", "tun", "vhost-net")}
# The finalizer virt-api's mutator gives every new VMI (kubevirt.io/api v1's


def as_virt_handler(api: Any, node: str) -> None:
    """What virt-handler does to its node when it starts, as far as scheduling launcher pods
    needs: the ``NODE_LABELS`` and the ``NODE_DEVICES`` its device plugins advertise (written
    as kubelet reports device plugins, in capacity and allocatable). Also the
    ``KUBELET_LABELS`` a kubelet registers its node with, which the kit's nodes lack."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.patch_node(node, {"metadata": {"labels": {**KUBELET_LABELS, **NODE_LABELS}}})
    core.patch_node_status(
        node, {"status": {"capacity": NODE_DEVICES, "allocatable": NODE_DEVICES}}
    )


def kubelet_runs(api: Any, namespace: str, pod: str) -> None:
    """What kubelet writes once a launcher pod's containers run and are ready (nothing runs
    them here). virt-controller then hands the VMI over: phase Scheduled, on the pod's
    node; ``Running`` is virt-handler's to write (``objects.Kube.vmi_phase``)."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    containers = core.read_namespaced_pod(pod, namespace).spec.containers
    core.patch_namespaced_pod_status(
        pod, namespace, {"status": running_status(containers, ready=True)}
    )


def reports(
    kube: Kube,
    namespace: str,
    name: str,
    phase: str,
    node: str | None = None,
    *,
    gone_ok: bool = False,
) -> None:
    """A VMI phase written as virt-handler writes it: by its ServiceAccount
    (``virt_handler``: virt-api's mutator drops a status change of anyone else), the phase
    (and node) and an entry in ``status.phaseTransitionTimestamps``. KubeVirt's VM
    controller reads that list, not the phase, to tell whether a VMI ever ran: a final VMI
    with no Running entry failed early, counts as a start failure and backs off the VM's
    next start (``startFailure``)."""
    import datetime

    from cozystack_gpu import keys

    # Read as the admin (virt-handler lists and watches VMIs but may not get one), written
    # as virt-handler.
    handler = virt_handler(kube)
    found = get_vmi(kube, namespace, name)
    if found is None:
        if gone_ok:
            return
        raise AssertionError(f"VMI {namespace}/{name} is gone: no phase {phase} to report")
    status = found.get("status") or {}
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    moves = [*(status.get("phaseTransitionTimestamps") or [])]
    moves.append({"phase": phase, "phaseTransitionTimestamp": now})
    written: dict[str, Any] = {"phase": phase, "phaseTransitionTimestamps": moves}
    if node:
        written["nodeName"] = node
    # KubeVirt's VMI CRD has no status subresource: status is written with the object,
    # over the version read (a write of virt-controller's in between is not undone).
    handler.custom.patch_namespaced_custom_object(
        keys.VMI.group,
        keys.VMI.version,
        namespace,
        keys.VMI.plural,
        name,
        {"metadata": {"resourceVersion": found["metadata"]["resourceVersion"]}, "status": written},
    )


def runs(kube: Kube, namespace: str, vmi: Mapping[str, Any]) -> dict[str, Any]:
    """A started VMI brought to Running as a node would: kubelet reports its bound launcher
    pod running, virt-controller hands the VMI over (Scheduled, on the pod's node), and
    virt-handler reports it Running there. Returns the VMI as it is then."""

    pod = wait_launcher(kube, namespace, vmi, bound=True)
    kubelet_runs(kube.api, namespace, pod["metadata"]["name"])
    name = vmi["metadata"]["name"]

    def scheduled() -> dict[str, Any] | None:
        found = get_vmi(kube, namespace, name)
        status = (found or {}).get("status") or {}
        same = found is not None and uid_of(found) == uid_of(vmi)
        return found if same and status.get("phase") == "Scheduled" else None

    handed = wait_for(scheduled, START_TIMEOUT_S, f"virt-controller to hand VMI {name} over")
    retried_on_conflict(
        lambda: reports(kube, namespace, name, "Running", handed["status"]["nodeName"])
    )
    running = get_vmi(kube, namespace, name)
    assert running is not None
    return running


def kubelet_removes(kube: Kube, namespace: str) -> list[str]:
    """What kubelet does once a deleted launcher pod's containers are gone: the pod object
    goes (nothing runs the pods here, so a deleted pod bound to a node would otherwise
    stay Terminating for ever). Returns the pods removed."""

    removed = []
    for pod in kube.core.list_namespaced_pod(namespace, label_selector=LAUNCHER_SELECTOR).items:
        if pod.metadata.deletion_timestamp is not None:
            name: str = pod.metadata.name
            unless(
                404,
                partial(kube.core.delete_namespaced_pod, name, namespace, grace_period_seconds=0),
            )
            removed.append(name)
    return removed


def shuts_down(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    """What virt-handler and kubelet do for a VMI being deleted: virt-handler shuts its
    guest down and reports the VMI Succeeded, then kubelet removes its launcher pod
    (``kubelet_removes``). In that order: a pod gone under a VMI that still runs is a crash
    to virt-controller (the VMI Failed, which KubeVirt counts as a start failure and
    backs off the next start for). Returns the VMI as it is then (None once gone)."""
    vmi = get_vmi(kube, namespace, name)
    if vmi is None or not vmi["metadata"].get("deletionTimestamp"):
        return vmi
    if (vmi.get("status") or {}).get("phase") in ("Scheduled", "Running"):
        retried_on_conflict(lambda: reports(kube, namespace, name, "Succeeded", gone_ok=True))
        return vmi
    # Final, or not running yet (no guest to shut down): only the pod to remove.
    kubelet_removes(kube, namespace)
    return vmi


def stops(kube: Kube, namespace: str, vm: str, timeout: float = START_TIMEOUT_S) -> None:
    """``virtctl stop``: the VM's runStrategy becomes Halted, virt-controller deletes its
    VMI and the VMI's launcher pod, virt-handler and kubelet (the kit, ``shuts_down``) stop
    the guest and remove the pod, and virt-controller lets the VMI go. Returns once no VMI
    of the VM is left."""

    set_run_strategy(kube, namespace, vm, "Halted")

    def gone() -> bool:
        return shuts_down(kube, namespace, vm) is None

    wait_for(gone, timeout, f"VM {namespace}/{vm} stopped, its VMI gone", interval=0.2)


def restarts(
    kube: Kube, namespace: str, vmi: Mapping[str, Any], timeout: float = START_TIMEOUT_S
) -> dict[str, Any]:
    """``virtctl restart`` of a VM run with runStrategy Always: its VMI is deleted,
    virt-handler and kubelet (the kit, ``shuts_down``) stop the guest and remove the
    launcher pod, the VMI goes, and the VM controller makes the next VMI under the same
    name. Returns that VMI."""

    name = vmi["metadata"]["name"]
    kube.delete_vmi(namespace, name)

    def next_vmi() -> dict[str, Any] | None:
        found = shuts_down(kube, namespace, name)
        return found if found and uid_of(found) != uid_of(vmi) else None

    result: dict[str, Any] = wait_for(
        next_vmi, timeout, f"the next VMI of VM {namespace}/{name}", interval=0.2
    )
    return result


def removes_vms(kube: Kube, namespace: str, timeout: float = START_TIMEOUT_S) -> None:
    """Deletes a namespace's VirtualMachines and plays virt-handler and kubelet
    (``shuts_down``) until virt-controller has let every VMI of the namespace go: with
    the finalizer virt-api's mutator adds (``VMI_FINALIZER``) a VMI waits for its pods,
    which no kubelet removes here."""
    from cozystack_gpu import keys

    kube.custom.delete_collection_namespaced_custom_object(
        keys.VM.group, keys.VM.version, namespace, keys.VM.plural
    )

    def gone() -> bool:
        listed = kube.custom.list_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural
        )["items"]
        for vmi in listed:
            if not vmi["metadata"].get("deletionTimestamp"):
                kube.delete_vmi(namespace, vmi["metadata"]["name"])
            shuts_down(kube, namespace, vmi["metadata"]["name"])
        return not listed

    wait_for(gone, timeout, f"the VMs and VMIs of {namespace} gone", interval=0.2)


def retried_on_conflict(write: Any, tries: int = 20) -> None:
    """``write()`` (a read, then a write over that version) again while another writer's
    update lands in between (409)."""
    from kubernetes.client.rest import ApiException

    for _attempt in range(tries - 1):
        try:
            write()
        except ApiException as exc:
            if exc.status != 409:
                raise
            time.sleep(0.05)
        else:
            return
    write()


def running_status(containers: list[Any], *, ready: bool) -> dict[str, Any]:
    """What kubelet writes on a scheduled pod whose containers run (ready or not)."""
    status = "True" if ready else "False"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "phase": "Running",
        "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": status},
            {"type": "Ready", "status": status},
        ],
        "containerStatuses": [
            {
                "name": _field(c, "name"),
                "image": _field(c, "image"),
                "imageID": "",
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            }
            for c in containers
        ],
    }


def _field(container: Any, name: str) -> str:
    """A container's field, from a dict or from the client's model."""
    return str(container[name] if isinstance(container, dict) else getattr(container, name))
