"""VirtualMachines as a tenant writes them (``virtual_machine``, ``create_vm``), and what
virt-controller makes of them: the VMI (named after its VM; ``wait_vmi``, the next one under
the same name too) and its launcher pods, by the VMI's uid (``launcher_pods``,
``wait_launcher``, ``LauncherWatch``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from typing import Any

from cozystack_gpu_testkit.objects import Kube, wait_for

LAUNCHER_SELECTOR = "kubevirt.io=virt-launcher"
# virt-controller renders, start to finish, on a loaded 2-core machine in seconds; the
# scheduler and the binder add a few. This is the bound before a test calls it broken. A
# VM whose VMI failed before it ran waits out KubeVirt's start backoff (10 to 15 s after a
# first failure) before its next VMI: within this bound too.
START_TIMEOUT_S = 90.0


def virtual_machine(
    name: str,
    request: Mapping[str, Any],
    *,
    run_strategy: str = "Always",
    guest: str = "1Gi",
    disks: Mapping[str, str] | None = None,
    networks: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A VirtualMachine as a tenant writes it: the claims annotation (``request`` as JSON)
    and the reference label on its template (KubeVirt copies both to the VMI), no GPU
    anywhere in its spec, ``guest`` memory (its launcher pod asks for more: KubeVirt adds
    its overhead), a virtio disk per entry of ``disks`` (disk name: the name of the
    PersistentVolumeClaim it is), and beside the pod network a bridged multus network per
    entry of ``networks`` (network name: the NetworkAttachmentDefinition it uses)."""
    from cozystack_gpu import keys

    devices: dict[str, Any] = {}
    spec: dict[str, Any] = {"domain": {"devices": devices, "memory": {"guest": guest}}}
    if networks:
        devices["interfaces"] = [{"name": "default", "masquerade": {}}] + [
            {"name": name, "bridge": {}} for name in networks
        ]
        spec["networks"] = [{"name": "default", "pod": {}}] + [
            {"name": name, "multus": {"networkName": nad}} for name, nad in networks.items()
        ]
    if disks:
        devices["disks"] = [{"name": disk, "disk": {"bus": "virtio"}} for disk in disks]
        spec["volumes"] = [
            {"name": disk, "persistentVolumeClaim": {"claimName": pvc}}
            for disk, pvc in disks.items()
        ]
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {
            "runStrategy": run_strategy,
            "template": {
                "metadata": {
                    "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                    "annotations": {keys.ANNOTATION_CLAIMS: json.dumps(dict(request))},
                },
                "spec": spec,
            },
        },
    }


def create_vm(
    kube: Kube, namespace: str, name: str, request: Mapping[str, Any], **kw: Any
) -> dict[str, Any]:
    """Creates ``virtual_machine(name, request, **kw)``; virt-controller starts it."""
    from cozystack_gpu import keys

    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        keys.VM.group,
        keys.VM.version,
        namespace,
        keys.VM.plural,
        virtual_machine(name, request, **kw),
    )
    return created


def get_vm(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    from cozystack_gpu import keys

    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        keys.VM.group, keys.VM.version, namespace, keys.VM.plural, name
    )
    return found


def set_run_strategy(kube: Kube, namespace: str, name: str, strategy: str) -> None:
    """What ``virtctl stop`` (``Halted``) and ``virtctl start`` (``Always``) change on a VM
    run by its runStrategy."""
    from cozystack_gpu import keys

    kube.custom.patch_namespaced_custom_object(
        keys.VM.group,
        keys.VM.version,
        namespace,
        keys.VM.plural,
        name,
        {"spec": {"runStrategy": strategy}},
    )


def get_vmi(kube: Kube, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes.client.rest import ApiException

    from cozystack_gpu import keys

    try:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def wait_vmi(
    kube: Kube,
    namespace: str,
    name: str,
    *,
    after: Mapping[str, Any] | None = None,
    timeout: float = START_TIMEOUT_S,
) -> dict[str, Any]:
    """The VMI virt-controller made for VM ``name`` (named after it); with ``after``, the
    next one: KubeVirt re-creates a VM's VMI under the same name, with another uid."""

    old = (after or {}).get("metadata", {}).get("uid")

    def made() -> dict[str, Any] | None:
        found = get_vmi(kube, namespace, name)
        return found if found and found["metadata"]["uid"] != old else None

    what = f"virt-controller's {'next ' if old else ''}VMI {namespace}/{name}"
    result: dict[str, Any] = wait_for(made, timeout, what)
    return result


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(obj["metadata"]["uid"])


def launcher_pods(kube: Kube, namespace: str, vmi_uid: str) -> list[dict[str, Any]]:
    """The launcher pods of one VMI, by its uid: virt-controller labels each with
    ``kubevirt.io/created-by`` and names it ``virt-launcher-<vm>-<random>``, so the name
    never tells which VMI of a VM a pod is for."""
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"{LAUNCHER_SELECTOR},kubevirt.io/created-by={vmi_uid}"
    ).items
    return [kube.api.sanitize_for_serialization(p) for p in pods]


def wait_launcher(
    kube: Kube,
    namespace: str,
    vmi: Mapping[str, Any],
    *,
    bound: bool = False,
    timeout: float = START_TIMEOUT_S,
) -> dict[str, Any]:
    """The launcher pod virt-controller made for ``vmi``; with ``bound``, once
    kube-scheduler has bound it to a node."""

    def found() -> dict[str, Any] | None:
        pods = launcher_pods(kube, namespace, uid_of(vmi))
        return next((p for p in pods if p["spec"].get("nodeName") or not bound), None)

    what = f"the launcher pod of VMI {vmi['metadata']['name']}"
    result: dict[str, Any] = wait_for(
        found, timeout, f"{what} bound by kube-scheduler" if bound else what
    )
    return result


class LauncherWatch:
    """Every version of a namespace's launcher pods the API server shows, from before
    virt-controller creates one (start it first), to check how each was updated."""

    def __init__(self, kube: Kube, namespace: str, timeout: float = START_TIMEOUT_S * 2) -> None:
        from kubernetes import watch

        self.versions: list[dict[str, Any]] = []
        self._stopping = False
        self._watch = watch.Watch()
        self._stream = self._watch.stream(
            kube.core.list_namespaced_pod,
            namespace,
            label_selector=LAUNCHER_SELECTOR,
            timeout_seconds=int(timeout),
            deserialize=False,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for event in self._stream:
                self.versions.append(event["object"])
        except Exception:  # stop() closes the stream under the reader
            if not self._stopping:
                raise

    def stop(self, pod: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Stops watching; the versions seen, only those of ``pod`` (by uid) if given."""
        self._stopping = True
        self._watch.stop()
        self._thread.join(5)
        if pod is None:
            return self.versions
        return [v for v in self.versions if v["metadata"]["uid"] == uid_of(pod)]
