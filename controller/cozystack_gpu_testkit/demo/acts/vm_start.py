"""Act 4, A VM starts: its launcher pod is pinned and gets its devices."""

from __future__ import annotations

import json
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.demo.acts.common import (
    LICENSED,
    RESEARCH,
    TENANT_USERS,
    VM,
    Demo,
    _bound_pod,
    _claim_summary,
    _condition,
    _device,
    _device_used_by,
    _phase_is,
    _pod_summary,
    _virt_handler,
    _vmi,
)
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.demo.hosts import GPU_TAINT, L40S_24C


# one piece: an act of the demo, its scenes in the order the viewer sees them
def act_vm(demo: Demo) -> None:
    console = demo.console
    console.act(
        4,
        "A VM starts",
        f"VM {VM} holds claim desk; KubeVirt's virt-controller, the webhooks, the controller "
        "and kube-scheduler start it.",
    )
    node = demo.claim_nodes["desk"]
    annotation = json.dumps({"claims": ["desk"]})
    watcher = kubevirt.LauncherWatch(demo.kube, RESEARCH, timeout=300)
    user = TENANT_USERS[RESEARCH]
    with console.step(
        f"{user} creates VM {VM}, naming claim desk; virt-controller makes its VMI"
    ) as found:
        body = {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": VM},
            "spec": {
                "runStrategy": "Always",
                "template": {
                    "metadata": {
                        "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
                        "annotations": {keys.ANNOTATION_CLAIMS: annotation},
                    },
                    "spec": {"domain": {"devices": {}, "memory": {"guest": "16Gi"}}},
                },
            },
        }
        demo.as_tenant(RESEARCH).custom.create_namespaced_custom_object(
            keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, body
        )
        vmi = wait_until(
            lambda: _vmi(demo),
            expected=f"KubeVirt's virt-controller to create VMI {VM}",
            saw=lambda: "no VMI",
            timeout=60,
        )
        gpus = vmi["spec"]["domain"]["devices"].get("gpus") or []
        wanted = [{"name": f"{keys.VMI_GPU_NAME_PREFIX}0", "deviceName": L40S_24C}]
        check(gpus == wanted, f"the VMI webhook to add gpus {wanted}", f"gpus {gpus}")
        # The controller attaches the claim once it sees the VMI stored (the webhook writes
        # nothing).
        wait_until(
            lambda: (
                ((demo.claim(RESEARCH, "desk") or {}).get("status") or {}).get("attachedTo") == VM
            ),
            expected=f"claim desk attached to {VM}",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=60,
        )
        found.append(
            f"template annotation {keys.ANNOTATION_CLAIMS}: {annotation}, "
            f"label {keys.LABEL_CLAIMS_REF}=true; VMI {VM} made by virt-controller"
        )
        found.append(f"VMI webhook: gpus {gpus}; controller: desk.status.attachedTo={VM}")
        volume, disk = _license_disk(vmi)
        copy = keys.license_copy_name(LICENSED)
        check(
            (volume.get("secret") or {}).get("secretName") == copy
            and disk.get("serial") == keys.LICENSE_DISK_SERIAL,
            f"the VMI webhook to add volume {keys.LICENSE_VOLUME_NAME} of Secret {copy} and "
            f"its disk with serial {keys.LICENSE_DISK_SERIAL} ({LICENSED} is licensed)",
            f"volume {volume}, disk {disk}",
        )
        found.append(f"licence: volume {json.dumps(volume)}")
        found.append(
            f"licence: disk {json.dumps(disk)}: the guest reads the token from "
            f"/dev/disk/by-id/virtio-{keys.LICENSE_DISK_SERIAL}"
        )

    with console.step("virt-controller renders the launcher pod; the webhook gates it") as found:
        first = wait_until(
            lambda: watcher.versions[0] if watcher.versions else None,
            expected="virt-controller to create the launcher pod",
            saw=lambda: "no launcher pod",
            timeout=60,
        )
        demo.launcher = first["metadata"]["name"]
        gates = [g["name"] for g in first["spec"].get("schedulingGates") or []]
        check(
            keys.SCHEDULING_GATE_CLAIMS in gates,
            f"pod created with the scheduling gate {keys.SCHEDULING_GATE_CLAIMS}",
            f"gates {gates}",
        )
        tolerated = [t.get("key") for t in first["spec"].get("tolerations") or []]
        check(
            GPU_TAINT["key"] in tolerated,
            f"the class's toleration of {GPU_TAINT['key']} added to the pod",
            f"tolerations {first['spec'].get('tolerations')}",
        )
        (compute,) = [c for c in first["spec"]["containers"] if c["name"] == "compute"]
        limits = compute["resources"].get("limits") or {}
        check(
            limits.get(L40S_24C) == "1",
            f"KubeVirt's compute container to ask for {L40S_24C}: 1",
            f"limits {limits}",
        )
        found.append(f"{demo.launcher}: limits {limits}")
        found.append(f"schedulingGates {gates}; tolerations added for {GPU_TAINT['key']}")
    watcher.stop()

    with console.step("the controller pins and ungates it; kube-scheduler binds it") as found:
        bound = wait_until(
            lambda: _bound_pod(demo, RESEARCH, demo.launcher),
            expected=f"pod {demo.launcher} bound by kube-scheduler",
            saw=lambda: _pod_summary(demo, RESEARCH, demo.launcher),
            timeout=60,
        )
        pinned = vmi_pods.pinned_node(bound)
        check(
            pinned == node and not vmi_pods.is_gated(bound) and bound["spec"]["nodeName"] == node,
            f"pinned to {node} (desk's node), ungated, bound to {node}",
            _pod_summary(demo, RESEARCH, demo.launcher),
        )
        placed = _condition(demo.claim(RESEARCH, "desk"), keys.CONDITION_PLACED)
        check(
            placed.get("reason") == keys.ClaimReason.PINNED.value,
            "desk's Placed condition Pinned",
            f"{placed}",
        )
        found.append(f"node affinity metadata.name In [{pinned}], ungated: {placed['message']}")
        found.append(f"kube-scheduler bound {demo.launcher} to {bound['spec']['nodeName']}")

    with console.step("the VM runs: kubelet starts the pod, virt-handler the VMI") as found:
        devices = demo.kubelets.run_pod(node, RESEARCH, demo.launcher, {L40S_24C: 1})
        _virt_handler(demo).vmi_phase(RESEARCH, VM, "Running", node)
        attached = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Attached"),
            expected="claim desk Attached",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        (address,) = devices[L40S_24C]
        wait_until(
            lambda: _device_used_by(demo, node, address, demo.launcher),
            expected=f"GPUNode {node} to show {address} used by {demo.launcher}",
            saw=lambda: f"{_device(demo, node, address)}",
            timeout=30,
        )
        check(
            demo.workload(RESEARCH, "desk") is not None,
            "desk's usage record while Attached",
            "none",
        )
        wait_until(
            lambda: keys.FINALIZER_CLAIM in _finalizers(demo, RESEARCH, "desk"),
            expected=f"desk protected by {keys.FINALIZER_CLAIM} while its VM runs",
            saw=lambda: f"finalizers {_finalizers(demo, RESEARCH, 'desk')}",
            timeout=30,
        )
        found.append(f"device plugin allocated {address}; VMI Running on {node}")
        message = _condition(attached, keys.CONDITION_BOUND).get("message")
        found.append(f"desk: {attached['status']['phase']} ({message})")
        found.append(f"GPUNode {node}: {address} used by pod {RESEARCH}/{demo.launcher}")
        found.append(f"desk carries {keys.FINALIZER_CLAIM}; its usage record stays")


def _license_disk(vmi: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The VMI's licence volume and disk (empty where the webhook added none)."""
    name = keys.LICENSE_VOLUME_NAME
    volumes = vmi["spec"].get("volumes") or []
    disks = vmi["spec"]["domain"]["devices"].get("disks") or []
    return (
        next((v for v in volumes if v.get("name") == name), {}),
        next((d for d in disks if d.get("name") == name), {}),
    )


def _finalizers(demo: Demo, namespace: str, name: str) -> list[str]:
    claim = demo.claim(namespace, name) or {}
    return list((claim.get("metadata") or {}).get("finalizers") or [])
