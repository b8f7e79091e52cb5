"""The start path judged by KubeVirt's own virt-controller (v1.8.2, built from source) on the
real kube-apiserver and kube-scheduler: a VirtualMachine whose VMI holds two GPUClaims and
orders one from a template. virt-controller makes the VMI and renders its launcher pod;
the product's VMI webhook gives the VMI its gpus entries, the pod webhook gates the pod and
adds the classes' tolerations, the binder places the set and pins the pod inside KubeVirt's
own required node-affinity term, and the real scheduler binds it. The chart's raw-name
policy is in force (rawResourceNames: forbidden): the pod passes it through its
virt-controller exception, with the user a cluster's virt-controller has.

docs/start-path.md ("What KubeVirt really renders") describes this pod; each of its lines
is checked here.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import (
    Replica,
    helm_template,
    order,
    refusal,
    remove_policies,
    suffixed,
)
from binder_env import Env
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from cozystack_gpu import keys
from cozystack_gpu.keys import RawNamesPolicy
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.chart import install_policies
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver

GPU_TAINT = {"key": "gpu.example.com/dedicated", "operator": "Exists", "effect": "NoSchedule"}
NODE_TAINT = {"key": "gpu.example.com/dedicated", "value": "yes", "effect": "NoSchedule"}
# KubeVirt's required node-affinity requirement of a VMI with the default (host-model) CPU.
HOST_MODEL_TERM = {
    "key": "node-labeller.kubevirt.io/obsolete-host-model",
    "operator": "DoesNotExist",
}
START_TIMEOUT_S = kubevirt_kit.START_TIMEOUT_S


@pytest.fixture
def forbidden(vms: Env) -> Iterator[Env]:
    """The test's binder publishing rawResourceNames: forbidden, and the chart's raw-name
    policy bound to its settings, with virt-controller's exception for the user the test
    kit runs virt-controller as (in force for a class's resource name once
    ``raw_pod_refused``)."""
    env = vms
    env.restart_binder(raw_resource_names=RawNamesPolicy.FORBIDDEN)
    objects = suffixed(
        helm_template(
            "raw-names-policy.yaml",
            env.controller_ns,
            {"rawNamePolicy": {"virtControllerUser": kubevirt_kit.USER}},
        ),
        env.id,
    )
    install_policies(env.kube.api, objects)
    try:
        yield env
    finally:
        remove_policies(env.kube.api, objects)


def raw_pod_refused(env: Env) -> bool:
    """Whether a pod an admin writes in the tenant namespace with the test's GPU resource
    name is refused by the raw-name policy (a dry run)."""
    body = {
        "metadata": {"name": "raw", "labels": {"kubevirt.io": "virt-launcher"}},
        "spec": {
            "containers": [
                {
                    "name": "compute",
                    "image": kubevirt_kit.LAUNCHER_IMAGE,
                    "resources": {"limits": {env.resource: "1"}},
                }
            ]
        },
    }
    try:
        env.kube.core.create_namespaced_pod(env.tenant, body, dry_run="All")
    except ApiException as exc:
        return exc.status == 403 and "GPU resource names are forbidden" in refusal(exc)
    return False


def test_the_pod_virt_controller_renders_is_gated_pinned_inside_its_affinity_and_bound(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, forbidden: Env
) -> None:
    env = forbidden
    kube = env.kube
    node = env.node("n1", 4, taints=[NODE_TAINT])
    kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=4, tolerations=[GPU_TAINT])
    # The class's resource name published by the binder: raw requests of it are refused.
    wait_for(
        lambda: raw_pod_refused(env), START_TIMEOUT_S, "the raw-name policy to refuse a raw GPU pod"
    )
    for held in ("a", "b"):
        order(kube, env.tenant, held, gpu_class, 1)
        assert env.wait_phase(held, "Bound", timeout=START_TIMEOUT_S)["status"]["nodeName"] == node
    # A node as free and as schedulable, made after the claims were bound: only the pin
    # keeps the pod off it.
    decoy = env.node("n2", 4, taints=[NODE_TAINT])
    kubevirt_kit.as_virt_handler(kube.api, decoy)
    request = {"claims": ["a", "b"], "claimTemplates": [{"name": "more", "class": gpu_class}]}
    watcher = kubevirt_kit.LauncherWatch(kube, env.tenant)
    kubevirt_kit.create_vm(kube, env.tenant, "vm", request)
    vmi = kubevirt_kit.wait_vmi(kube, env.tenant, "vm")
    try:
        pod = kubevirt_kit.wait_launcher(kube, env.tenant, vmi, bound=True)
    except AssertionError:
        pods = kubevirt_kit.launcher_pods(kube, env.tenant, vmi["metadata"]["uid"])
        raise AssertionError(
            f"pods: {json.dumps(pods, indent=1)}\nvirt-controller:\n{kubevirt.log_tail()}"
        ) from None
    versions = watcher.stop(pod)
    vmi = kubevirt_kit.get_vmi(kube, env.tenant, "vm")
    assert vmi is not None
    spec = pod["spec"]

    # The pod webhook gated it at creation (the first version the API server stored), and
    # no version was ever ungated and unpinned: the binder pinned and ungated in one update.
    assert vmi_pods.is_gated(versions[0]) and vmi_pods.pinned_node(versions[0]) is None
    for version in versions:
        assert vmi_pods.is_gated(version) == (vmi_pods.pinned_node(version) is None), version[
            "metadata"
        ]
    assert pod["metadata"]["generateName"] == "virt-launcher-vm-"

    # The VMI virt-controller made from the VM (named after it, controlled by it) carries the
    # template's claims annotation and label; the VMI webhook gave it one gpus entry per
    # unit (two held, one from the template).
    gpus = vmi["spec"]["domain"]["devices"]["gpus"]
    assert [g["deviceName"] for g in gpus] == [env.resource] * 3
    assert [g["name"] for g in gpus] == [f"{keys.VMI_GPU_NAME_PREFIX}{i}" for i in range(3)]
    owner = vmi["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner.get("controller")) == ("VirtualMachine", "vm", True)
    assert vmi["metadata"]["labels"][keys.LABEL_CLAIMS_REF] == keys.LABEL_CLAIMS_REF_VALUE
    assert json.loads(vmi["metadata"]["annotations"][keys.ANNOTATION_CLAIMS]) == request

    # KubeVirt turned them into requests and limits of the compute container, beside its
    # own devices (virt-handler's device plugins), memory with its overhead on top of the
    # guest's and ephemeral storage; the serial console goes to an init container.
    (compute,) = [c for c in spec["containers"] if c["name"] == "compute"]
    requests, limits = compute["resources"]["requests"], compute["resources"]["limits"]
    assert limits[env.resource] == requests[env.resource] == "3"
    for device in ("kvm", "tun", "vhost-net"):
        assert limits[f"devices.kubevirt.io/{device}"] == "1"
    assert parse_quantity(requests["memory"]) > parse_quantity("1Gi")
    assert "ephemeral-storage" in requests
    assert compute["image"] == kubevirt_kit.LAUNCHER_IMAGE
    assert [c["name"] for c in spec.get("initContainers") or []] == ["guest-console-log"]

    # The pod is KubeVirt's: the VMI is its controlling owner; the VMI's labels and the
    # claims annotation travel with it; it selects nodes virt-handler made schedulable, of
    # the architecture and machine type virt-api's mutator gave the VMI.
    (owner,) = pod["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "VirtualMachineInstance",
        vmi["metadata"]["uid"],
        True,
    )
    assert pod["metadata"]["labels"][keys.LABEL_CLAIMS_REF] == keys.LABEL_CLAIMS_REF_VALUE
    assert json.loads(pod["metadata"]["annotations"][keys.ANNOTATION_CLAIMS]) == request
    assert spec["nodeSelector"] == {**kubevirt_kit.NODE_LABELS, **kubevirt_kit.KUBELET_LABELS}

    # The gate is gone; the class's toleration follows KubeVirt's own (the nodes' taint
    # needs it); the pin is inside KubeVirt's one required term: one term, both
    # requirements, so the host-model requirement still holds on the pinned node.
    assert not spec.get("schedulingGates")
    assert [t["key"] for t in spec["tolerations"]] == [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        GPU_TAINT["key"],
    ]
    assert spec["tolerations"][-1] == GPU_TAINT
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    (term,) = required["nodeSelectorTerms"]
    assert term["matchExpressions"] == [HOST_MODEL_TERM]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": [node]}]
    assert spec["nodeName"] == node != decoy

    # The template claim was made for this VMI, owned by it, and bound to the same node.
    made = kube.get_claim(env.tenant, keys.template_claim_name("vm", "more"))
    assert made["status"]["nodeName"] == node
    assert made["metadata"]["ownerReferences"][0]["uid"] == vmi["metadata"]["uid"]


def vm_holding_one_claim(env: Env) -> tuple[str, dict[str, Any]]:
    """Node ``n1`` as virt-handler labels it, claim ``a`` ordered on it, and VM ``vm``
    holding it created: the node and the VMI virt-controller made."""
    kube = env.kube
    node = env.node("n1", 2)
    kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    order(kube, env.tenant, "a", gpu_class, 1)
    # Bound, and at once Attached when the VM controller's next try comes first.
    wait_for(
        lambda: env.phase("a") in ("Bound", "Attached"),
        START_TIMEOUT_S,
        "claim a Bound (or already Attached to the VM's next VMI)",
    )
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    return node, kubevirt_kit.wait_vmi(kube, env.tenant, "vm")


def test_virt_controller_hands_the_vmi_to_the_claims_node_once_its_pod_runs(
    vms: Env,
) -> None:
    """After the start: kubelet (the test) reports the launcher pod running, virt-controller
    moves the VMI to Scheduled on the pod's node, virt-handler (the test) reports it
    Running; the held claim stays Attached to it on that node."""
    env = vms
    kube = env.kube
    node, vmi = vm_holding_one_claim(env)
    pod = kubevirt_kit.wait_launcher(kube, env.tenant, vmi, bound=True)
    assert pod["spec"]["nodeName"] == node
    # kubelet reports it running; virt-controller hands the VMI over (Scheduled, on the
    # pod's node); virt-handler reports it Running.
    running = kubevirt_kit.runs(kube, env.tenant, vmi)
    assert running["status"]["nodeName"] == node
    assert running["metadata"]["labels"]["kubevirt.io/nodeName"] == node
    claim = env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)
    assert (claim["status"]["attachedTo"], claim["status"]["nodeName"]) == ("vm", node)


def test_the_vmi_carries_what_virt_apis_mutators_add_and_the_webhooks_gpus_entries(
    vms: Env,
) -> None:
    """Every VM and VMI passes KubeVirt's own virt-api. Its VM mutator gives the VM's
    template the architecture and machine type; the VMI virt-controller makes from it passes
    our VMI webhook first (configuration ``cozystack-gpu-*`` sorts before
    ``virt-api-mutator``), then virt-api's VMI mutator, which adds its finalizer, the
    default architecture, machine type, CPU topology and pod network and writes the first
    phase, Pending; then our webhook again (reinvocationPolicy IfNeeded: virt-api changed
    the object), which adds nothing twice; then virt-api's create validator, which accepts
    our gpus entries. docs/start-path.md ("virt-api's webhooks") says what each sees."""
    env = vms
    kube = env.kube
    _node, vmi = vm_holding_one_claim(env)
    arch = kubevirt_kit.go_architecture()

    # virt-api's VM mutator on the VM (the tenant wrote neither).
    template = kubevirt_kit.get_vm(kube, env.tenant, "vm")["spec"]["template"]["spec"]
    assert template["architecture"] == arch
    assert template["domain"]["machine"] == {"type": "q35"}

    # virt-api's VMI mutator on the VMI.
    spec = vmi["spec"]
    assert kubevirt_kit.VMI_FINALIZER in vmi["metadata"]["finalizers"]
    assert spec["architecture"] == arch
    assert spec["domain"]["machine"] == {"type": "q35"}
    cpu = spec["domain"]["cpu"]
    assert (cpu["model"], cpu["sockets"], cpu["cores"], cpu["threads"]) == ("host-model", 1, 1, 1)
    assert spec["networks"] == [{"name": "default", "pod": {}}]
    assert spec["domain"]["devices"]["interfaces"] == [{"name": "default", "bridge": {}}]
    first = vmi["status"]["phaseTransitionTimestamps"][0]
    assert first["phase"] == "Pending"

    # Our VMI webhook's entry, once: virt-api neither dropped nor refused it, and our
    # reinvocation added nothing twice.
    gpus = spec["domain"]["devices"]["gpus"]
    assert gpus == [{"name": f"{keys.VMI_GPU_NAME_PREFIX}0", "deviceName": env.resource}]
    assert env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)["status"]["attachedTo"] == "vm"


def test_a_refused_vmi_reaches_its_vm_which_starts_by_itself_once_the_claim_is_bound(
    vms: Env,
) -> None:
    """KubeVirt's VM controller, refused by the VMI webhook, reports the refusal on the VM
    (its Failure condition and FailedCreate events, printableStatus Stopped) and tries
    again; once the claim it names is ordered and Bound, the VM starts with no one
    touching it."""
    env = vms
    kube = env.kube
    node = env.node("n1", 2)
    kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    refusal_text = f"GPUClaim a named in {keys.ANNOTATION_CLAIMS} does not exist"

    def failure() -> dict[str, Any] | None:
        status = kubevirt_kit.get_vm(kube, env.tenant, "vm").get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions") or []}
        return status if "Failure" in conditions else None

    status = wait_for(failure, START_TIMEOUT_S, "the refusal on the VM's status")
    (cond,) = [c for c in status["conditions"] if c["type"] == "Failure"]
    assert (cond["status"], cond["reason"]) == ("True", "FailedCreate")
    assert 'admission webhook "vmi.gpu.cozystack.io" denied the request' in cond["message"]
    assert refusal_text in cond["message"]
    assert status["printableStatus"] == "Stopped"

    def retried() -> int:
        events = kube.core.list_namespaced_event(
            env.tenant, field_selector="involvedObject.kind=VirtualMachine,reason=FailedCreate"
        ).items
        return sum(e.count or 1 for e in events if refusal_text in (e.message or ""))

    assert wait_for(lambda: retried() >= 2, START_TIMEOUT_S, "a second try refused")
    assert kubevirt_kit.get_vmi(kube, env.tenant, "vm") is None

    order(kube, env.tenant, "a", gpu_class, 1)
    # Bound, and at once Attached when the VM controller's next try comes first.
    wait_for(
        lambda: env.phase("a") in ("Bound", "Attached"),
        START_TIMEOUT_S,
        "claim a Bound (or already Attached to the VM's next VMI)",
    )
    vmi = kubevirt_kit.wait_vmi(kube, env.tenant, "vm")  # the VM starts by itself
    assert [g["deviceName"] for g in vmi["spec"]["domain"]["devices"]["gpus"]] == [env.resource]
    assert env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)["status"]["attachedTo"] == "vm"


def test_a_vm_whose_running_pod_is_deleted_comes_back_as_a_new_vmi_holding_its_claims(
    vms: Env,
) -> None:
    """runStrategy Always, the running VMI's launcher pod deleted: virt-controller fails the
    VMI and deletes it, the claim goes back to Bound, and the VM makes a new VMI under the
    same name (another UID) at once (a VMI that ran is no start failure: no backoff) that
    holds the claim again, its pod pinned to the claim's node."""
    env = vms
    kube = env.kube
    node = env.node("n1", 2)
    kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    order(kube, env.tenant, "a", gpu_class, 1)
    # Bound, and at once Attached when the VM controller's next try comes first.
    wait_for(
        lambda: env.phase("a") in ("Bound", "Attached"),
        START_TIMEOUT_S,
        "claim a Bound (or already Attached to the VM's next VMI)",
    )
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    first = kubevirt_kit.wait_vmi(kube, env.tenant, "vm")
    pod = kubevirt_kit.wait_launcher(kube, env.tenant, first, bound=True)
    kubevirt_kit.runs(kube, env.tenant, first)
    held = env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)["status"]
    assert held["attachedToUID"] == first["metadata"]["uid"]

    kube.core.delete_namespaced_pod(pod["metadata"]["name"], env.tenant, grace_period_seconds=0)

    def let_go() -> dict[str, Any] | None:
        # The first VMI's hold ends: either the binder's release (Bound, no attachment) is
        # seen, or the binder already attached the claim to the VM's next VMI (its uid). A
        # poll cannot promise to see the first.
        status = env.kube.get_claim(env.tenant, "a").get("status") or {}
        if status.get("attachedToUID") == first["metadata"]["uid"]:
            return None
        return status

    released = wait_for(let_go, START_TIMEOUT_S, "claim a let go of the first VMI")
    assert released["phase"] in ("Bound", "Attached")

    second = kubevirt_kit.wait_vmi(kube, env.tenant, "vm", after=first)
    vm = kubevirt_kit.get_vm(kube, env.tenant, "vm")
    # The VMI had run (virt-handler's Running entry in its phaseTransitionTimestamps): its
    # failure is no start failure, and the next VMI came at once, with no backoff.
    assert "startFailure" not in vm["status"]
    assert [g["deviceName"] for g in second["spec"]["domain"]["devices"]["gpus"]] == [env.resource]
    again = kubevirt_kit.wait_launcher(kube, env.tenant, second, bound=True)
    assert vmi_pods.pinned_node(again) == again["spec"]["nodeName"] == node
    # The hold is the second VMI's once the binder attaches it by uid.
    wait_for(
        lambda: (
            (env.kube.get_claim(env.tenant, "a").get("status") or {}).get("attachedToUID")
            == second["metadata"]["uid"]
        ),
        START_TIMEOUT_S,
        "claim a held by the second VMI",
    )
    holds = env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)["status"]
    assert (holds["attachedTo"], holds["attachedToUID"]) == ("vm", second["metadata"]["uid"])


def test_a_network_naming_the_gpu_resource_keeps_the_launcher_pod_gated(vms: Env) -> None:
    """KubeVirt adds to the launcher pod a request for the resource a multus network's
    NetworkAttachmentDefinition names. Here the definition does not exist yet when the VMI
    is admitted (so the VMI webhook cannot tell); virt-controller renders the pod once it
    exists, asking 2 units for a 1-unit claim template: the gate keeps it gated and says
    how much beyond the claims, from which container.

    The tenant admin creates the VM; the definition is written after, as the hoster (the
    tenant admin's roles write none: test_admission_vmi.py shows the 403)."""
    env = vms
    kube = env.kube
    node = env.node("n1", 2)
    kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    request = {"claimTemplates": [{"name": "g", "class": gpu_class}]}
    tenant = env.tenant_admin()
    kubevirt_kit.create_vm(tenant, env.tenant, "vm", request, networks={"gpunet": "gpu-net"})
    vmi = kubevirt_kit.wait_vmi(kube, env.tenant, "vm")
    kube.nad(env.tenant, "gpu-net", env.resource)
    pod = kubevirt_kit.wait_launcher(kube, env.tenant, vmi)
    (compute,) = [c for c in pod["spec"]["containers"] if c["name"] == "compute"]
    assert compute["resources"]["limits"][env.resource] == "2", compute["resources"]
    claim_name = keys.template_claim_name("vm", "g")

    def told() -> dict[str, Any] | None:
        try:
            obj = kube.get_claim(env.tenant, claim_name)
        except ApiException:
            return None
        cond = next(
            (c for c in (obj.get("status") or {}).get("conditions") or []
             if c["type"] == keys.CONDITION_PLACED), None,
        )  # fmt: skip
        return cond if cond and cond["status"] == "False" else None

    cond = wait_for(told, START_TIMEOUT_S, "the template claim told why its VM cannot start")
    assert cond["reason"] == keys.ClaimReason.REQUESTS_BEYOND_CLAIMS.value, cond
    assert (
        f"1 unit(s) of {env.resource} beyond its claims, which cover 1 (container compute: 2)"
        in cond["message"]
    ), cond["message"]
    (pod,) = kubevirt_kit.launcher_pods(kube, env.tenant, kubevirt_kit.uid_of(vmi))
    assert vmi_pods.is_gated(pod), "a launcher pod asking 2 units for a 1-unit claim started"
    assert vmi_pods.pinned_node(pod) is None and not pod["spec"].get("nodeName")


def test_a_tenant_admin_cannot_end_its_running_vmi_by_writing_its_status(vms: Env) -> None:
    """KubeVirt's VMI has no status subresource, and the built-in admin role (with KubeVirt's
    rights) patches VMIs: a VMI written Succeeded while it runs would have the binder detach
    its claims and let them move while the guest keeps its units. KubeVirt's virt-api keeps
    a VMI's status to its own components: the tenant's patch is answered, and changes
    nothing the binder reads (the second reading of issue 41's boundary)."""
    env = vms
    kube = env.kube
    _node, vmi = vm_holding_one_claim(env)
    kubevirt_kit.wait_launcher(kube, env.tenant, vmi, bound=True)
    kubevirt_kit.runs(kube, env.tenant, vmi)
    env.wait_phase("a", "Attached", timeout=START_TIMEOUT_S)
    with contextlib.suppress(ApiException):  # a refusal would do as well
        env.tenant_admin().custom.patch_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, "vm",
            {"status": {"phase": "Succeeded"}},
        )  # fmt: skip
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        now = kubevirt_kit.get_vmi(kube, env.tenant, "vm") or {}
        assert (now.get("status") or {}).get("phase") == "Running", now.get("status")
        assert env.phase("a") == "Attached"
        time.sleep(0.5)
