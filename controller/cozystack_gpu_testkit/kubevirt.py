"""KubeVirt's own virt-controller and virt-api on the test kit's control plane, so
VirtualMachines become VMIs and virt-launcher pods the way a cluster renders them, and every
VM and VMI passes virt-api's webhooks, not the way the team pictures them.

virt-operator is not run (it would deploy pods from images); the kit does what it would do
for virt-controller and virt-api, from what virt-operator's own generators print at the
pinned release (``kubevirt-manifests.yaml``, written by ``tools/build-binaries.sh``):

- the CRDs virt-controller watches that the plane lacks (the plane keeps the VMI, VM and
  instance-type CRDs of ``KUBEVIRT_VERSION``; the rest come from the components' release),
- the namespace ``kubevirt`` with the ServiceAccounts, ClusterRoles, Roles and bindings of
  virt-controller, virt-api and virt-handler (KubeVirt's own rules),
- a KubeVirt CR with ``status.phase: Deployed`` and the default architecture virt-operator
  writes (virt-controller and virt-api read their configuration only from a KubeVirt CR
  with a phase; virt-api's mutator gives new VMIs that architecture),
- KubeVirt's CA in the ConfigMap ``kubevirt-ca`` (a throw-away CA of the kit's), which
  signs virt-api's serving certificate,
- virt-api's webhook configurations as generated (``virt-api-mutator``,
  ``virt-api-validator``, ``virt-launcher-pod-mutator``: rules, failure and reinvocation
  policies, selectors), each webhook calling virt-api by URL on loopback with the kit's CA
  instead of through Service ``kubevirt/virt-api`` (no Service routes here), registered
  once virt-api serves and removed before it stops.

It starts ``virt-api`` (with the arguments virt-operator's Deployment gives it) and then
``virt-controller``, each a process with a token of its ServiceAccount, so the API server,
our webhooks and the raw-name policy see the users a cluster's KubeVirt is:
``system:serviceaccount:kubevirt:kubevirt-controller`` and ``...:kubevirt-apiserver``.
virt-api reads the front proxy's CA the plane publishes (``cluster.start``). Outside a pod
both take the namespace ``kubevirt`` (kubevirt.io/client-go's ``util.GetNamespace`` falls
back to it when no service-account namespace file exists), hence that namespace rather than
Cozystack's ``cozy-kubevirt``; tests render the chart's raw-name policy for this user.
virt-api's aggregated API (``v1.subresources.kubevirt.io``: console, VNC, ``virtctl``'s
subresources) is not registered: an APIService needs a Service with endpoints, and those
may not be loopback addresses. Nothing here calls it.

No virt-handler runs: a node is schedulable for launcher pods once it carries the labels
virt-handler and kubelet put on it and the devices its device plugins advertise
(``as_virt_handler``); with no heartbeat annotation virt-controller's node controller
leaves it alone. Nothing runs a launcher pod either: tests write pod and VMI status as
kubelet and virt-handler would (virt-controller itself moves a VMI to Scheduled, on the
pod's node, once its pod runs), VMI status with virt-handler's ServiceAccount
(``virt_handler``): virt-api's mutator puts back a VMI status changed by anyone but
KubeVirt's own accounts.

The rest of this module is what the start-path tests share: VirtualMachines as a tenant
writes them (``create_vm``), the VMI virt-controller makes for one, and the next one under
the same name (``wait_vmi``), its launcher pods by the VMI's uid (``launcher_pods``,
``wait_launcher``, ``LauncherWatch``), and the node's part: running a VMI (``runs``),
shutting one down that is deleted (``shuts_down``), ``virtctl stop`` and ``restart``
(``stops``, ``restarts``) and the clean-up of a test's VMs (``removes_vms``). Phases are
written as virt-handler writes them (``reports``): KubeVirt reads whether a VMI ran from
its phase transitions, and a VMI that never ran counts as a start failure.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.cluster import VIRT_API, VIRT_CONTROLLER, ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless, wait_for
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port

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
# VirtualMachineInstanceFinalizer; virt-controller also lifts the deprecated name without
# the prefix). virt-controller lifts it once no launcher pod of the VMI is left.
VMI_FINALIZER = "kubevirt.io/foregroundDeleteVirtualMachine"
TOKEN_SECONDS = 7 * 24 * 3600
READY_TIMEOUT_S = 120.0
# Selects every launcher pod virt-controller makes (its ``kubevirt.io`` label).
LAUNCHER_SELECTOR = "kubevirt.io=virt-launcher"
# virt-controller renders, start to finish, on a loaded 2-core machine in seconds; the
# scheduler and the binder add a few. This is the bound before a test calls it broken. A
# VM whose VMI failed before it ran waits out KubeVirt's start backoff (10 to 15 s after a
# first failure) before its next VMI: within this bound too.
START_TIMEOUT_S = 90.0


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


# --- VirtualMachines, as a tenant writes them, and what KubeVirt makes of them ------------


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
                "spec": {"configuration": {}},
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


# The kit's virt-handler identity on each plane KubeVirt was started on, by API server URL:
# ``reports`` writes VMI status with it.
_VIRT_HANDLERS: dict[str, Kube] = {}


def virt_handler(kube: Kube) -> Kube:
    """``kube``'s API server as virt-handler's ServiceAccount (``HANDLER_USER``), the only
    identity whose VMI status writes virt-api's mutator keeps, besides virt-controller's
    and its own: it puts a status changed by anyone else back as it was. Known once
    ``start`` has run on that plane."""
    server = kube.api.configuration.host
    try:
        return _VIRT_HANDLERS[server]
    except KeyError:
        raise KubeVirtError(
            f"no virt-handler identity for {server}: KubeVirt was not started there "
            "(kubevirt.start)"
        ) from None


class VirtApi:
    """A running virt-api with its webhooks registered: ``serving`` asks its readiness
    endpoint; ``stop`` removes the webhooks, then stops it."""

    def __init__(self, plane: ControlPlane, port: int, ca: CertificateAuthority) -> None:
        self.plane = plane
        self.port = port
        self.url = f"https://127.0.0.1:{port}"
        self.ca_pem = ca.cert_pem.decode()

    def serving(self) -> bool:
        """Whether it answers its readiness probe: its informers synced, its TLS server up
        and the API server reachable."""
        context = ssl.create_default_context(cadata=self.ca_pem)
        try:
            with urllib.request.urlopen(
                self.url + VIRT_API_HEALTHZ, context=context, timeout=2
            ) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        return self.plane.log_tail(VIRT_API, lines)

    def webhook_configurations(self) -> list[dict[str, Any]]:
        """virt-api's webhook configurations as virt-operator generates them, each webhook
        calling this virt-api by URL (there is no Service or kube-proxy to route
        ``kubevirt/virt-api`` here) with this kit's CA; rules, failure and reinvocation
        policies, selectors and timeouts as generated."""
        import base64

        configurations = [
            d
            for d in cluster.load_manifests(manifests_file(self.plane.bin_dir))
            if d["kind"] in WEBHOOK_KINDS
        ]
        bundle = base64.b64encode(self.ca_pem.encode()).decode()
        for configuration in configurations:
            for webhook in configuration["webhooks"]:
                service = webhook["clientConfig"]["service"]
                if (service["namespace"], service["name"]) != (NAMESPACE, VIRT_API):
                    raise KubeVirtError(f"{webhook['name']} calls {service}, not virt-api")
                webhook["clientConfig"] = {
                    "url": self.url + service.get("path", "/"),
                    "caBundle": bundle,
                }
        return configurations

    def register(self) -> None:
        """Writes the webhook configurations (replacing those of an earlier virt-api)."""
        admission = _admission(self.plane)
        for configuration in self.webhook_configurations():
            write, remove = _writers(admission, configuration["kind"])
            _gone(remove, configuration["metadata"]["name"])
            write(configuration)

    def unregister(self) -> None:
        admission = _admission(self.plane)
        for configuration in self.webhook_configurations():
            _create, remove = _writers(admission, configuration["kind"])
            _gone(remove, configuration["metadata"]["name"])

    def stop(self) -> None:
        """Removes its webhook configurations, then stops it: with failurePolicy Fail they
        would refuse every VM and VMI write once it is gone. No-op once the plane has
        stopped it."""
        if not self.plane.running(VIRT_API):
            return
        self.unregister()
        self.plane.stop_component(VIRT_API)


def _admission(plane: ControlPlane) -> Any:
    from kubernetes import client

    return client.AdmissionregistrationV1Api(plane.api_client())


def _writers(admission: Any, kind: str) -> tuple[Any, Any]:
    if kind == "MutatingWebhookConfiguration":
        return (
            admission.create_mutating_webhook_configuration,
            admission.delete_mutating_webhook_configuration,
        )
    return (
        admission.create_validating_webhook_configuration,
        admission.delete_validating_webhook_configuration,
    )


def _gone(delete: Any, *args: str) -> None:
    """``delete(*args)``, already gone (404) being as good."""
    from kubernetes.client.rest import ApiException

    try:
        delete(*args)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _probe_vmi(name: str) -> dict[str, Any]:
    """A VMI that passes the CRD's schema, for dry runs in KubeVirt's namespace."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "64Mi"}}},
    }


def _webhooks_in_force(plane: ControlPlane) -> bool:
    """Whether the API server calls virt-api's webhooks yet (it picks new configurations up
    a moment after they are written): a dry-run VMI comes back with the finalizer its
    mutator adds, and one with a disk of no volume is refused by its create validator."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from cozystack_gpu import keys

    custom = client.CustomObjectsApi(plane.api_client())
    args = (keys.VMI.group, keys.VMI.version, NAMESPACE, keys.VMI.plural)
    try:
        mutated = custom.create_namespaced_custom_object(
            *args, _probe_vmi("virt-api-probe"), dry_run="All"
        )
    except ApiException:
        return False
    if VMI_FINALIZER not in (mutated["metadata"].get("finalizers") or []):
        return False
    invalid = _probe_vmi("virt-api-probe-invalid")
    invalid["spec"]["domain"]["devices"]["disks"] = [{"name": "none", "disk": {}}]
    try:
        custom.create_namespaced_custom_object(*args, invalid, dry_run="All")
    except ApiException as exc:
        return "virtualmachineinstances-create-validator.kubevirt.io" in str(exc.body)
    return False


def start_virt_api(plane: ControlPlane, timeout: float = READY_TIMEOUT_S) -> VirtApi:
    """Starts virt-api as ``API_USER`` with the flags virt-operator's Deployment gives it
    (install first: ``install``), waits until it answers its readiness probe, then
    registers its webhooks and waits until the API server calls them."""
    from kubernetes import client

    workdir = plane.workdir / VIRT_API
    workdir.mkdir(exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    _token_kubeconfig(plane, kubeconfig, API_SERVICE_ACCOUNT)
    # KubeVirt's own CA (virt-operator's kubevirt-ca): it signs virt-api's serving
    # certificate, which the webhook configurations trust, and its client certificate for
    # virt-handler; virt-api reads the CA from the ConfigMap virt-operator publishes it in.
    ca = CertificateAuthority(CA_CONFIGMAP)
    ca.issue(
        VIRT_API,
        dns_names=(f"{VIRT_API}.{NAMESPACE}.svc",),
        ip_addresses=("127.0.0.1",),
        server=True,
    ).write(workdir / "tls.crt", workdir / "tls.key")
    ca.issue(HANDLER_CLIENT_CN, client=True).write(
        workdir / "handler-tls.crt", workdir / "handler-tls.key"
    )
    core = client.CoreV1Api(plane.api_client())
    body = {"metadata": {"name": CA_CONFIGMAP}, "data": {CA_BUNDLE_KEY: ca.cert_pem.decode()}}
    _gone(core.delete_namespaced_config_map, CA_CONFIGMAP, NAMESPACE)
    core.create_namespaced_config_map(NAMESPACE, body)
    port = free_port()
    plane._spawn(
        VIRT_API,
        [
            str(plane.bin_dir / VIRT_API),
            f"--kubeconfig={kubeconfig}",
            "--listen=127.0.0.1",
            f"--port={port}",
            # virt-operator's arguments; nothing reaches the console port here.
            "--console-server-port=8186",
            "--subresources-only",
            f"--ca-configmap-name={CA_CONFIGMAP}",
            f"--tls-cert-file={workdir / 'tls.crt'}",
            f"--tls-key-file={workdir / 'tls.key'}",
            f"--handler-cert-file={workdir / 'handler-tls.crt'}",
            f"--handler-key-file={workdir / 'handler-tls.key'}",
            "--v=2",
        ],
    )
    api = VirtApi(plane, port, ca)
    try:
        _await(plane, VIRT_API, api.serving, timeout, "answer its readiness probe", api.log_tail)
        api.register()
        _await(
            plane, VIRT_API, lambda: _webhooks_in_force(plane), timeout,
            "have its webhooks called by the API server", api.log_tail,
        )  # fmt: skip
    except BaseException:
        api.stop()
        raise
    return api


def _await(
    plane: ControlPlane,
    component: str,
    ready: Any,
    timeout: float,
    what: str,
    log_tail: Any,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not plane.running(component):
            raise KubeVirtError(f"{component} exited:\n{log_tail()}")
        if ready():
            return
        time.sleep(0.2)
    raise KubeVirtError(f"{component} did not {what} within {timeout:.0f} s:\n{log_tail()}")


class VirtController:
    """A running virt-controller beside its virt-api (``virt_api``): ``leading`` asks its
    /leader endpoint."""

    def __init__(
        self, plane: ControlPlane, port: int, ca: CertificateAuthority, virt_api: VirtApi
    ) -> None:
        self.plane = plane
        self.port = port
        self.virt_api = virt_api
        self._ca_pem = ca.cert_pem.decode()

    def leading(self) -> bool:
        """Whether it holds the lease and its controllers have started (its readiness)."""
        context = ssl.create_default_context(cadata=self._ca_pem)
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/leader", context=context, timeout=2
            ) as resp:
                body = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return bool(body.get("apiserver", {}).get("leader") == "true")

    def log_tail(self, lines: int = 40) -> str:
        return self.plane.log_tail(VIRT_CONTROLLER, lines)

    def stop(self, timeout: float = 60.0) -> None:
        """Stops it once no VirtualMachine or VMI awaits deletion (up to ``timeout``): their
        finalizers are virt-controller's, and without it a deleted namespace holding a VM
        would never go. Then virt-api, its webhooks removed first (``VirtApi.stop``): the
        tests after these write VMIs by hand, as no KubeVirt would leave them. No-op for
        what the plane has stopped already."""
        from kubernetes import client

        if self.plane.running(VIRT_CONTROLLER):
            custom = client.CustomObjectsApi(self.plane.api_client())

            def deleting() -> list[str]:
                names = []
                for plural in ("virtualmachines", "virtualmachineinstances"):
                    listed = custom.list_cluster_custom_object("kubevirt.io", "v1", plural)
                    names += [
                        f"{plural}/{o['metadata']['namespace']}/{o['metadata']['name']}"
                        for o in listed["items"]
                        if o["metadata"].get("deletionTimestamp")
                    ]
                return names

            deadline = time.monotonic() + timeout
            while deleting() and time.monotonic() < deadline:
                time.sleep(0.2)
            self.plane.stop_component(VIRT_CONTROLLER)
        self.virt_api.stop()
        _VIRT_HANDLERS.pop(self.plane.server, None)


def start(plane: ControlPlane, timeout: float = READY_TIMEOUT_S) -> VirtController:
    """Installs what virt-operator would (``install``), starts virt-api with its webhooks
    (``start_virt_api``: in force before any VMI is made), then virt-controller, and waits
    until it leads with its controllers running. Also makes the kit's virt-handler identity
    (``virt_handler``). Once per plane (again only after ``VirtController.stop``)."""
    if plane.running(VIRT_CONTROLLER) or plane.running(VIRT_API):
        raise cluster.ControlPlaneError("KubeVirt already runs on this plane")

    install(plane)
    workdir = plane.workdir / VIRT_CONTROLLER
    workdir.mkdir(exist_ok=True)
    handler_config = workdir / "virt-handler.kubeconfig"
    _token_kubeconfig(plane, handler_config, HANDLER_SERVICE_ACCOUNT)
    virt_api = start_virt_api(plane, timeout)
    try:
        controller = _start_virt_controller(plane, workdir, virt_api, timeout)
    except BaseException:
        virt_api.stop()
        raise
    _VIRT_HANDLERS[plane.server] = Kube(cluster.kubeconfig_client(handler_config, 16))
    return controller


def _start_virt_controller(
    plane: ControlPlane, workdir: Path, virt_api: VirtApi, timeout: float
) -> VirtController:
    kubeconfig = workdir / "kubeconfig"
    _token_kubeconfig(plane, kubeconfig)
    # Its metrics and probe endpoints serve TLS only: a certificate of a CA of its own.
    ca = CertificateAuthority("virt-controller-ca")
    ca.issue(VIRT_CONTROLLER, ip_addresses=("127.0.0.1",), server=True).write(
        workdir / "tls.crt", workdir / "tls.key"
    )
    port = free_port()
    plane._spawn(
        VIRT_CONTROLLER,
        [
            str(plane.bin_dir / VIRT_CONTROLLER),
            f"--kubeconfig={kubeconfig}",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--launcher-image={LAUNCHER_IMAGE}",
            f"--prom-cert-file={workdir / 'tls.crt'}",
            f"--prom-key-file={workdir / 'tls.key'}",
            "--v=2",
        ],
    )
    controller = VirtController(plane, port, ca, virt_api)
    try:
        _await(
            plane, VIRT_CONTROLLER, controller.leading, timeout,
            "lead", controller.log_tail,
        )  # fmt: skip
    except BaseException:
        plane.stop_component(VIRT_CONTROLLER)
        raise
    return controller


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
