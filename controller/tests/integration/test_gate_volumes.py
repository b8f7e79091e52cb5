"""A VM's volumes against the real API server: the gate starts a VM only where its volumes
can be used, and waits while one is not bound; a stopped VM's hold stays with its local
disk. The binder learns of volumes from its watches (it never reads them while deciding);
the tests play the PV controller (no kube-controller-manager binds volumes here). A
starting VM runs on KubeVirt's own virt-controller, which renders its launcher pod with the
disk's PersistentVolumeClaim, behind the product's webhooks; a stopped VM is a
VirtualMachine with runStrategy Halted, for which KubeVirt makes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from admission_env import order
from binder_env import Env, condition
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.objects import unless, wait_for

pytestmark = pytest.mark.apiserver

HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture
def volumes(env: Env) -> Iterator[list[str]]:
    """PVs this test made (cluster-scoped, so its namespaces' clean-up leaves them)."""
    made: list[str] = []
    yield made
    for name in made:
        unless(404, lambda name=name: env.kube.core.delete_persistent_volume(name))


def host(env: Env, base: str, gpus: int) -> str:
    """A GPU node labelled with its hostname, as kubelet labels every node."""
    return env.node(base, gpus, labels={HOSTNAME: env.name(base)})


def local_pv(env: Env, made: list[str], node: str) -> str:
    """A local PersistentVolume on ``node``: its required node affinity names the node."""
    name = f"pv-{node}"
    env.kube.core.create_persistent_volume(
        {
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "local": {"path": "/mnt/disks/vm"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": HOSTNAME, "operator": "In", "values": [node]}
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )
    made.append(name)
    return name


def pvc(env: Env, name: str, volume: str | None = None) -> None:
    """A PersistentVolumeClaim of no StorageClass (bound to a PV by hand, not at first
    consumer), bound to ``volume`` from the start when given."""
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "",
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if volume is not None:
        spec["volumeName"] = volume
    env.kube.core.create_namespaced_persistent_volume_claim(
        env.tenant, {"metadata": {"name": name}, "spec": spec}
    )


def bind(env: Env, claim: str, volume: str) -> None:
    """What the PV controller does when it binds a claim to a volume."""
    env.kube.core.patch_namespaced_persistent_volume_claim(
        claim,
        env.tenant,
        {
            "metadata": {"annotations": {"pv.kubernetes.io/bind-completed": "yes"}},
            "spec": {"volumeName": volume},
        },
    )


def stopped_vm(env: Env, name: str, claims: list[str], disk: str) -> None:
    """A stopped VirtualMachine whose template holds ``claims`` and mounts the PVC ``disk``."""
    env.kube.custom.create_namespaced_custom_object(
        keys.VM.group,
        keys.VM.version,
        env.tenant,
        keys.VM.plural,
        {
            "apiVersion": keys.VM.api_version,
            "kind": keys.VM.kind,
            "metadata": {"name": name},
            "spec": {
                "runStrategy": "Halted",
                "template": {
                    "metadata": {
                        "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                        "annotations": {keys.ANNOTATION_CLAIMS: json.dumps({"claims": claims})},
                    },
                    "spec": {
                        "domain": {"devices": {}},
                        "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": disk}}],
                    },
                },
            },
        },
    )


def node_of(env: Env, claim: str) -> str | None:
    status: dict[str, Any] = env.kube.get_claim(env.tenant, claim).get("status") or {}
    return status.get("nodeName")


def test_a_gated_pod_waits_for_its_volume_and_starts_where_the_volume_can_be_used(
    vms: Env, volumes: list[str]
) -> None:
    """On KubeVirt's virt-controller: the VM's disk is a PersistentVolumeClaim not bound
    yet, and virt-controller's launcher pod mounts it."""
    env = vms
    first, second = host(env, "n1", 1), host(env, "n2", 1)
    for node in (first, second):
        kubevirt_kit.as_virt_handler(env.kube.api, node)
    gpu_class = env.gpu_class()
    order(env.kube, env.tenant, "held", gpu_class, 1)
    assert env.wait_phase("held", "Bound")["status"]["nodeName"] == first
    pvc(env, "disk")
    kubevirt_kit.create_vm(env.kube, env.tenant, "vm", {"claims": ["held"]}, disks={"disk": "disk"})
    vmi = kubevirt_kit.wait_vmi(env.kube, env.tenant, "vm")

    def told() -> dict[str, Any] | None:
        cond = condition(env.kube.get_claim(env.tenant, "held"), keys.CONDITION_PLACED)
        return cond if cond.get("status") == "False" else None

    cond = wait_for(told, 30, "the Placed condition saying the volume is not bound")
    assert cond["reason"] == keys.ClaimReason.VOLUME_NOT_BOUND.value
    assert "disk" in cond["message"]
    waiting = kubevirt_kit.wait_launcher(env.kube, env.tenant, vmi)
    assert vmi_pods.is_gated(waiting) and vmi_pods.pinned_node(waiting) is None
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in waiting["spec"]["volumes"]
        if v.get("persistentVolumeClaim")
    ]
    assert claims == ["disk"]
    assert node_of(env, "held") == first
    # The PV controller binds the claim to a local disk on the other node: the binder hears
    # it from its watch and starts the VM there, moving its hold.
    bind(env, "disk", local_pv(env, volumes, second))
    started = kubevirt_kit.wait_launcher(env.kube, env.tenant, vmi, bound=True)
    assert vmi_pods.pinned_node(started) == started["spec"]["nodeName"] == second
    assert node_of(env, "held") == second


def _gpunode_reason(env: Env, node: str) -> str | None:
    obj = env.kube.custom.get_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_NODES, node
    )
    reason: str | None = condition(obj, keys.CONDITION_READY).get("reason")
    return reason


def test_a_stopped_vms_hold_stays_with_its_local_disk_through_a_cordon_and_packing(
    env: Env, volumes: list[str]
) -> None:
    first, second = host(env, "n1", 2), host(env, "n2", 2)
    gpu_class = env.gpu_class(onCordon="Move")
    pvc(env, "disk", local_pv(env, volumes, first))
    stopped_vm(env, "vm", ["held"], "disk")
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    assert env.wait_phase("held", "Bound")["status"]["nodeName"] == first

    def knows_the_disk() -> bool:
        claim = env.binder.snapshot.claim(ClaimKey(env.tenant, "held"))
        return claim is not None and bool(claim.volumes)

    wait_for(knows_the_disk, 30, "the binder to see the VM's disk")
    # Cordoned under onCordon: Move, the node keeps the stopped VM's hold: its disk is there.
    env.kube.cordon(first)
    wait_for(lambda: _gpunode_reason(env, first) == "Cordoned", 30, "the cordon seen")
    # An order of the whole other node binds only if the hold did not move there (holds
    # are judged before orders in every pass).
    env.kube.claim(env.tenant, "probe", gpu_class, 2)
    assert env.wait_phase("probe", "Bound")["status"]["nodeName"] == second
    assert node_of(env, "held") == first
    env.kube.custom.delete_namespaced_custom_object(
        keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_CLAIMS, "probe"
    )

    def gone() -> bool:
        try:
            env.kube.get_claim(env.tenant, "probe")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, 30, "the probe order to go")
    env.kube.claim(env.tenant, "other", gpu_class, 1)
    assert env.wait_phase("other", "Bound")["status"]["nodeName"] == second
    env.kube.cordon(first, False)
    # One free unit on each node, and an order of two: packing frees a node, and it may not
    # be the disk's: the plain hold moves instead.
    env.kube.claim(env.tenant, "big", gpu_class, 2)
    assert env.wait_phase("big", "Bound")["status"]["nodeName"] == second
    assert node_of(env, "other") == first
    assert node_of(env, "held") == first
