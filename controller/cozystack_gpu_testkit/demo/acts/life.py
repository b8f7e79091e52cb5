"""Act 6, Life goes on: nodes drain and fail, claims move or go Lost."""

from __future__ import annotations

from typing import Any

from cozystack_gpu import keys
from cozystack_gpu_testkit.demo.acts.common import (
    ORDERS,
    RESEARCH,
    TENANT_USERS,
    VM,
    Demo,
    _claim_summary,
    _condition,
    _gpunode_ready,
    _gpunode_summary,
    _phase_is,
    _vmi,
    in_phase,
    left,
    summary,
    usage_record,
)
from cozystack_gpu_testkit.demo.console import check, wait_until


# one piece: an act of the demo, its scenes in the order the viewer sees them
def act_life(demo: Demo) -> None:
    console = demo.console
    console.act(
        6,
        "Life goes on",
        "Maintenance moves a hold; a node fails; claims follow; usage records follow them.",
    )
    spare_node = demo.claim_nodes["spare"]
    with console.step(f"kubectl cordon {spare_node}: the unattached hold spare moves") as found:
        demo.kube.cordon(spare_node)
        moved = wait_until(
            lambda: _moved(demo, "spare", spare_node),
            expected=f"claim spare Bound on another node than {spare_node}",
            saw=lambda: _claim_summary(demo, RESEARCH, "spare"),
            timeout=30,
        )
        reason = _condition(moved, keys.CONDITION_BOUND)
        check(reason.get("reason") == keys.ClaimReason.MOVED.value, "reason Moved", f"{reason}")
        desk = demo.claim(RESEARCH, "desk") or {}
        check(
            (desk.get("status") or {}).get("nodeName") == demo.claim_nodes["desk"],
            "desk (attached to the running VM) to stay",
            _claim_summary(demo, RESEARCH, "desk"),
        )
        demo.claim_nodes["spare"] = moved["status"]["nodeName"]
        found.append(f"spare → {moved['status']['nodeName']}: {reason.get('message')}")
        found.append(f"desk stays on {demo.claim_nodes['desk']}: attached to the running VM")

    with console.step(f"kubectl uncordon {spare_node}: the maintenance is over") as found:
        demo.kube.cordon(spare_node, False)
        wait_until(
            lambda: _gpunode_ready(demo, spare_node),
            expected=f"GPUNode {spare_node} Ready again",
            saw=lambda: _gpunode_summary(demo.gpunode(spare_node)),
            timeout=30,
        )
        spare = demo.claim(RESEARCH, "spare") or {}
        check(
            (spare.get("status") or {}).get("nodeName") == demo.claim_nodes["spare"],
            "spare to keep the node it moved to",
            _claim_summary(demo, RESEARCH, "spare"),
        )
        found.append(f"spare keeps {demo.claim_nodes['spare']}: holds keep the nodes they moved to")

    failed = demo.claim_nodes["desk"]
    stranded = [
        (ns, name) for ns, name, _cls, _n in ORDERS
        if name not in ("desk", "train") and demo.claim_nodes[name] == failed
    ]  # fmt: skip
    with console.step(f"{failed} fails: its kubelet stops reporting (NotReady)") as found:
        demo.kubelets.ready(failed, False)
        lost = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Lost"),
            expected="claim desk (attached to the VM on the failed node) Lost",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        wait_until(
            lambda: demo.workload(RESEARCH, "desk") is None,
            expected="desk's usage record gone while it is Lost",
            saw=lambda: "gpuclaim-desk still there",
            timeout=30,
        )
        message = _condition(lost, keys.CONDITION_BOUND).get("message")
        found.append(f"desk Lost: {message}; usage record gone")
        for ns, name in stranded:
            # An unattached hold on the failed node leaves it, or goes Lost with nowhere to go.
            claim = wait_until(
                left(demo, ns, name, failed),
                expected=f"claim {ns}/{name} off {failed} (moved, or Lost with nowhere to go)",
                saw=summary(demo, ns, name),
                timeout=30,
            )
            status = claim["status"]
            message = _condition(claim, keys.CONDITION_BOUND).get("message")
            where = f" on {status['nodeName']}" if status.get("nodeName") else ""
            found.append(f"{name}: {status['phase']}{where} ({message})")
        vmi_wait = _condition(demo.claim(RESEARCH, "desk"), keys.CONDITION_BOUND)
        found.append(f"desk waits: {vmi_wait.get('reason')}: {vmi_wait.get('message')}")

    user = TENANT_USERS[RESEARCH]
    with console.step(
        f"{user} stops VM {VM}; the hoster clears its pod off the dead node"
    ) as found:
        # virtctl stop, by the VM's owner: runStrategy Halted; virt-controller deletes the VMI.
        demo.as_tenant(RESEARCH).custom.patch_namespaced_custom_object(
            keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, VM,
            {"spec": {"runStrategy": "Halted"}},
        )  # fmt: skip
        # Nothing on a dead node confirms the pod's end: forced, as the hoster would.
        demo.kube.core.delete_namespaced_pod(demo.launcher, RESEARCH, grace_period_seconds=0)
        demo.kubelets.forget_pod(RESEARCH, demo.launcher)
        wait_until(
            lambda: True if _vmi(demo) is None else None,
            expected=f"virt-controller to delete VMI {VM} once its pod is gone",
            saw=lambda: f"VMI {VM} phase {((_vmi(demo) or {}).get('status') or {}).get('phase')}",
            timeout=60,
        )
        found.append(f"{user}: runStrategy Halted; virt-controller deleted VMI {VM}")
        rebound = wait_until(
            lambda: _phase_is(demo, RESEARCH, "desk", "Bound"),
            expected="claim desk rebound once its VMI is gone",
            saw=lambda: _claim_summary(demo, RESEARCH, "desk"),
            timeout=30,
        )
        reason = _condition(rebound, keys.CONDITION_BOUND)
        check(
            reason.get("reason") == keys.ClaimReason.REBOUND.value
            and rebound["status"]["nodeName"] != failed,
            f"desk Rebound on another node than {failed}",
            _claim_summary(demo, RESEARCH, "desk"),
        )
        wait_until(
            lambda: demo.workload(RESEARCH, "desk"),
            expected="desk's usage record back once it is Bound",
            saw=lambda: "none",
            timeout=30,
        )
        demo.claim_nodes["desk"] = rebound["status"]["nodeName"]
        found.append(f"desk Rebound on {rebound['status']['nodeName']}: {reason.get('message')}")
        found.append("usage record gpuclaim-desk back")

    with console.step(f"{failed} is repaired: Ready again") as found:
        demo.kubelets.ready(failed, True)
        for ns, name in stranded:
            claim = wait_until(
                in_phase(demo, ns, name, "Bound"),
                expected=f"claim {ns}/{name} Bound again",
                saw=summary(demo, ns, name),
                timeout=30,
            )
            wait_until(
                usage_record(demo, ns, name),
                expected=f"usage record gpuclaim-{name} back",
                saw=lambda: "none",
                timeout=30,
            )
            demo.claim_nodes[name] = claim["status"]["nodeName"]
            found.append(
                f"{name}: Bound on {claim['status']['nodeName']} "
                f"({_condition(claim, keys.CONDITION_BOUND).get('reason')}); usage record back"
            )
        wait_until(
            lambda: _gpunode_ready(demo, failed),
            expected=f"GPUNode {failed} Ready again",
            saw=lambda: _gpunode_summary(demo.gpunode(failed)),
            timeout=30,
        )
        found.append(f"GPUNode {failed}: {_gpunode_summary(demo.gpunode(failed))}")
    demo.show("get", "workloads", "-A")


def _moved(demo: Demo, name: str, old: str) -> dict[str, Any] | None:
    claim = _phase_is(demo, RESEARCH, name, "Bound")
    if claim and claim["status"].get("nodeName") not in (None, old):
        return claim
    return None
