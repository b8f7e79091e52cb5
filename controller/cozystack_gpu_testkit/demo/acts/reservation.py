"""Act 5, A booked window: a tenant books GPUs for a window ahead (SPEC §11); an order that
would take them is refused; the window opens, a VM runs on it, and at its end the VM stops.

The window is real time and whole minutes, as every window is: it opens at the first whole
minute at least ``WINDOW_LEAD_S`` after the act begins (the booking and the refused order
come first) and lasts ``WINDOW_MINUTES``; the demo's chart values make the hoster's
``warnBefore`` 30 s so the warning comes inside it (``common.CHART_VALUES``). The act waits
on the clock for the window, so it takes two and a half to three and a half minutes. It
books the h100 units acts 3 and 4 leave free, and gives them back before act 6.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import translate, vmi_pods
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.demo.acts.common import (
    ACME,
    TENANT_USERS,
    WINDOW_MAX_LEAD,
    WINDOW_WARN_S,
    Demo,
    _claim_summary,
    _condition,
    _device_used_by,
    _free,
    _message,
    _phase_is,
    _pod_summary,
    _virt_handler,
    _vmi,
    in_phase,
    summary,
)
from cozystack_gpu_testkit.demo.console import Mismatch, check, wait_until
from cozystack_gpu_testkit.demo.hosts import H100
from cozystack_gpu_testkit.objects import Kube, unless

MINUTE = 60
DAY = 24 * 60 * MINUTE
# At least this long from the act's start to the window's: the booking and the refused order
# come before it opens.
WINDOW_LEAD_S = 30
WINDOW_MINUTES = 2
RESERVATION = "sprint"
WINDOW_VM = "sprint-vm"
WINDOW_CLASS = "h100"
# Every h100 unit acts 3 and 4 leave free to orders (train holds the other two): with them
# booked, an order of one finds none.
WINDOW_COUNT = 2
ON_DEMAND = "on-demand"
# How long a step waits beyond the moment it waits for (the binder looks twice a second).
SLACK_S = 30


def window_times(
    now: float, lead_s: float = WINDOW_LEAD_S, minutes: int = WINDOW_MINUTES
) -> tuple[int, int]:
    """The act's window, in epoch seconds: from the first whole minute at least ``lead_s``
    after ``now``, ``minutes`` long."""
    start = math.ceil((now + lead_s) / MINUTE) * MINUTE
    return start, start + minutes * MINUTE


def clock(t: float) -> str:
    """A moment as a person reads it off a clock: 14:07:30 UTC, seconds only when not 0."""
    shown = time.strftime("%H:%M:%S" if int(t) % MINUTE else "%H:%M", time.gmtime(t))
    return f"{shown} UTC"


# one piece: an act of the demo, its scenes in the order the viewer sees them
def act_window(demo: Demo) -> None:
    console = demo.console
    console.act(
        5,
        "A booked window",
        "A tenant books GPUs for a window minutes ahead; no order can take them; a VM runs "
        "in the window and is stopped at its end.",
    )
    user = TENANT_USERS[ACME]
    tenant = demo.as_tenant(ACME)
    free_before = _free(demo).get(WINDOW_CLASS)
    start, end = window_times(time.time())
    asked = f"{WINDOW_COUNT} x {WINDOW_CLASS}"

    with console.step(
        f"{user} ({ACME}) asks for {asked} tomorrow: further ahead than the hoster allows"
    ) as found:
        message = _refused(
            lambda: tenant.reservation(
                ACME, RESERVATION, WINDOW_CLASS, WINDOW_COUNT, start + DAY, end + DAY
            ),
            f"GPUReservation {ACME}/{RESERVATION} a day ahead",
            lambda: f"{_reservation_summary(demo)}",
        )
        wanted = (
            f"a window starts at most {WINDOW_MAX_LEAD} ahead (reservations.maxLead, which "
            "the hoster sets)"
        )
        check(wanted in message, f"a refusal saying '…{wanted}…'", message)
        found.append(f"refused at create time: {message}")

    with console.step(
        f"{user} books {asked} from {clock(start)} to {clock(end)}: GPUReservation {RESERVATION}"
    ) as found:
        check(
            free_before == WINDOW_COUNT,
            f"{WINDOW_COUNT} x {WINDOW_CLASS} free to orders before the booking",
            f"free {free_before}",
        )
        tenant.reservation(ACME, RESERVATION, WINDOW_CLASS, WINDOW_COUNT, start, end)
        booked = wait_until(
            lambda: _reservation_in(demo, "Booked"),
            expected=f"GPUReservation {RESERVATION} Booked",
            saw=lambda: _reservation_summary(demo),
            timeout=SLACK_S,
        )
        node = str(booked["status"]["nodeName"])
        record = f"gpureservation-{RESERVATION}"
        wait_until(
            lambda: demo.record(ACME, record),
            expected=f"usage record (Workload) {record} in {ACME}",
            saw=lambda: "none",
            timeout=SLACK_S,
        )
        lead = start - time.time()
        said = _condition(booked, keys.CONDITION_BOOKED).get("message")
        found.append(f"Booked {lead:.0f} s ahead of its window: {said}")
        found.append(f"usage record {record}: the window is billed from the reservation")

    with console.step(
        f"{user} orders 1 x {WINDOW_CLASS} now: it would eat into the booked window"
    ) as found:
        wanted = (
            f"no node serving class {WINDOW_CLASS} has 1 free unit; the largest has 0 "
            "(units reservations booked for their windows are not free to orders)"
        )
        # The webhook's view follows the binder's booking within moments: asked dry first.
        wait_until(
            lambda: wanted in _order_refusal(tenant, dry_run="All"),
            expected="the claim webhook to count the booking",
            saw=lambda: _order_refusal(tenant, dry_run="All") or "the order admitted",
            timeout=SLACK_S,
        )
        message = _order_refusal(tenant)
        check(wanted in message, f"a refusal saying '{wanted}'", message or "it was admitted")
        found.append(f"refused at create time: {message}")

    with console.step(
        f"{clock(start)}: the window opens; the controller makes claim {RESERVATION} on {node}"
    ) as found:
        active = wait_until(
            lambda: _reservation_in(demo, "Active"),
            expected=f"GPUReservation {RESERVATION} Active at {translate.rfc3339(start)}",
            saw=lambda: _reservation_summary(demo),
            timeout=_until(start) + SLACK_S,
        )
        claim = wait_until(
            in_phase(demo, ACME, RESERVATION, "Bound"),
            expected=f"GPUClaim {ACME}/{RESERVATION} Bound",
            saw=summary(demo, ACME, RESERVATION),
            timeout=SLACK_S,
        )
        labels = claim["metadata"].get("labels") or {}
        owners = [
            (o.get("kind"), o.get("uid")) for o in claim["metadata"].get("ownerReferences") or []
        ]
        check(
            claim["status"].get("nodeName") == node
            and labels.get(keys.LABEL_RESERVATION) == RESERVATION
            and owners == [(keys.KIND_RESERVATION, active["metadata"]["uid"])],
            f"claim {RESERVATION} Bound on {node}, labelled {keys.LABEL_RESERVATION}="
            f"{RESERVATION}, owned by the reservation",
            f"node {claim['status'].get('nodeName')}, labels {labels}, owners {owners}",
        )
        check(
            demo.workload(ACME, RESERVATION) is None,
            f"no usage record of claim {RESERVATION} (the window is billed once)",
            f"gpuclaim-{RESERVATION}",
        )
        found.append(
            f"{RESERVATION}: Active: {_condition(active, keys.CONDITION_BOOKED)['message']}"
        )
        found.append(
            f"GPUClaim {RESERVATION}: Bound on {node}, labelled {keys.LABEL_RESERVATION}="
            f"{RESERVATION}, owned by GPUReservation {RESERVATION}; no usage record of its own"
        )

    annotation = json.dumps({"claims": [RESERVATION]})
    with console.step(
        f"{user} starts VM {WINDOW_VM} on claim {RESERVATION}; virt-controller makes its VMI"
    ) as found:
        tenant.custom.create_namespaced_custom_object(
            keys.VM.group, keys.VM.version, ACME, keys.VM.plural, _vm_body(annotation)
        )
        vmi = wait_until(
            lambda: _vmi(demo, ACME, WINDOW_VM),
            expected=f"KubeVirt's virt-controller to create VMI {WINDOW_VM}",
            saw=lambda: "no VMI",
            timeout=60,
        )
        gpus = vmi["spec"]["domain"]["devices"].get("gpus") or []
        wanted_gpus = [
            {"name": f"{keys.VMI_GPU_NAME_PREFIX}{i}", "deviceName": H100}
            for i in range(WINDOW_COUNT)
        ]
        check(gpus == wanted_gpus, f"the VMI webhook to add gpus {wanted_gpus}", f"gpus {gpus}")
        wait_until(
            lambda: (
                ((demo.claim(ACME, RESERVATION) or {}).get("status") or {}).get("attachedTo")
                == WINDOW_VM
            ),
            expected=f"claim {RESERVATION} attached to {WINDOW_VM}",
            saw=lambda: _claim_summary(demo, ACME, RESERVATION),
            timeout=60,
        )
        found.append(f"template annotation {keys.ANNOTATION_CLAIMS}: {annotation}")
        found.append(f"VMI webhook: gpus {gpus}; controller: {RESERVATION}.status.attachedTo")

    with console.step(
        f"its launcher pod is pinned to {node}, where the window is booked; kube-scheduler "
        "binds it there"
    ) as found:
        pod = wait_until(
            lambda: _bound_launcher(demo, vmi),
            expected=f"VMI {WINDOW_VM}'s launcher pod bound by kube-scheduler",
            saw=lambda: _launcher_summary(demo, vmi),
            timeout=60,
        )
        launcher = pod["metadata"]["name"]
        pinned = vmi_pods.pinned_node(pod)
        check(
            pinned == node and not vmi_pods.is_gated(pod) and pod["spec"]["nodeName"] == node,
            f"pinned to {node} (the window's node), ungated, bound to {node}",
            _pod_summary(demo, ACME, launcher),
        )
        placed = _condition(demo.claim(ACME, RESERVATION), keys.CONDITION_PLACED)
        check(
            placed.get("reason") == keys.ClaimReason.PINNED.value,
            f"{RESERVATION}'s Placed condition Pinned",
            f"{placed}",
        )
        found.append(f"node affinity metadata.name In [{pinned}], ungated: {placed['message']}")
        found.append(f"kube-scheduler bound {launcher} to {node}")

    handler = _virt_handler(demo)
    with console.step(f"the VM runs on the window's {asked}") as found:
        devices = demo.kubelets.run_pod(node, ACME, launcher, {H100: WINDOW_COUNT})
        handler.vmi_phase(ACME, WINDOW_VM, "Running", node)
        attached = wait_until(
            lambda: _phase_is(demo, ACME, RESERVATION, "Attached"),
            expected=f"claim {RESERVATION} Attached",
            saw=lambda: _claim_summary(demo, ACME, RESERVATION),
            timeout=SLACK_S,
        )
        addresses = devices[H100]
        wait_until(
            lambda: all(_device_used_by(demo, node, a, launcher) for a in addresses),
            expected=f"GPUNode {node} to show {', '.join(addresses)} used by {launcher}",
            saw=lambda: f"{demo.gpunode(node)}",
            timeout=SLACK_S,
        )
        found.append(f"device plugin allocated {', '.join(addresses)}; VMI Running on {node}")
        bound = _condition(attached, keys.CONDITION_BOUND).get("message")
        found.append(f"{RESERVATION}: Attached ({bound})")

    warn_at = end - WINDOW_WARN_S
    with console.step(
        f"{clock(warn_at)}: {WINDOW_WARN_S} s before the end (warnBefore), the reservation "
        "and the VMI are told"
    ) as found:
        ending = wait_until(
            lambda: _ending(demo),
            expected=f"GPUReservation {RESERVATION}'s condition Ending True (WindowEnding)",
            saw=lambda: _reservation_summary(demo),
            timeout=_until(warn_at) + SLACK_S,
        )
        wait_until(
            lambda: (
                _told(demo, keys.KIND_RESERVATION, RESERVATION)
                and _told(demo, keys.VMI.kind, WINDOW_VM)
            ),
            expected=f"Events WindowEnding on GPUReservation {RESERVATION} and VMI {WINDOW_VM}",
            saw=lambda: (
                f"on the reservation {_told(demo, keys.KIND_RESERVATION, RESERVATION)}, on "
                f"the VMI {_told(demo, keys.VMI.kind, WINDOW_VM)}"
            ),
            timeout=SLACK_S,
        )
        found.append(f"{RESERVATION}: condition Ending ({ending['reason']}): {ending['message']}")
        found.append(
            f"Events {ending['reason']} on GPUReservation {RESERVATION} and VMI {WINDOW_VM}"
        )

    with console.step(
        f"{clock(end)}: the window ends; the controller stops VM {WINDOW_VM} and takes the "
        "claim back"
    ) as found:
        ended = wait_until(
            lambda: _reservation_in(demo, "Ended"),
            expected=f"GPUReservation {RESERVATION} Ended at {translate.rfc3339(end)}",
            saw=lambda: _reservation_summary(demo),
            timeout=_until(end) + SLACK_S,
        )
        wait_until(
            lambda: _run_strategy(demo) == "Halted",
            expected=f"VM {WINDOW_VM} runStrategy Halted",
            saw=lambda: f"runStrategy {_run_strategy(demo)}",
            timeout=SLACK_S,
        )
        # virt-controller deletes a halted VM's VMI; the demo's hosts stop the guest.
        wait_until(
            lambda: _shut_down(demo, handler, launcher),
            expected=f"VMI {WINDOW_VM} gone: the guest stopped, its launcher pod removed",
            saw=lambda: _vmi_summary(demo, launcher),
            timeout=60,
        )
        wait_until(
            lambda: demo.claim(ACME, RESERVATION) is None,
            expected=f"claim {RESERVATION} gone once its VMI stopped",
            saw=lambda: _claim_summary(demo, ACME, RESERVATION),
            timeout=SLACK_S,
        )
        wait_until(
            lambda: _free(demo).get(WINDOW_CLASS) == free_before,
            expected=f"{free_before} x {WINDOW_CLASS} free to orders again",
            saw=lambda: f"free {_free(demo)}",
            timeout=SLACK_S,
        )
        found.append(f"VM {WINDOW_VM}: runStrategy Halted by the controller; VMI gone")
        found.append(f"{RESERVATION}: Ended: {_condition(ended, keys.CONDITION_BOOKED)['message']}")
        found.append(
            f"claim {RESERVATION} deleted; {free_before} x {WINDOW_CLASS} free to orders again"
        )
    demo.show("get", "gpureservations", "-n", ACME)


def _until(t: float) -> float:
    """Seconds from now to ``t`` (0 once past)."""
    return max(0.0, t - time.time())


def _reservation(demo: Demo) -> dict[str, Any] | None:
    found: dict[str, Any] | None = unless(404, lambda: demo.kube.get_reservation(ACME, RESERVATION))
    return found


def _reservation_in(demo: Demo, phase: str) -> dict[str, Any] | None:
    found = _reservation(demo)
    return found if found and (found.get("status") or {}).get("phase") == phase else None


def _reservation_summary(demo: Demo) -> str:
    found = _reservation(demo)
    if found is None:
        return f"no GPUReservation {ACME}/{RESERVATION}"
    status = found.get("status") or {}
    conditions = [
        f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message')})"
        for c in status.get("conditions") or []
    ]
    return f"phase {status.get('phase')}, node {status.get('nodeName')}; {'; '.join(conditions)}"


def _ending(demo: Demo) -> dict[str, Any] | None:
    ending = _condition(_reservation(demo), keys.CONDITION_ENDING)
    return ending if ending.get("status") == "True" else None


def _told(demo: Demo, kind: str, name: str) -> list[dict[str, Any]]:
    """The WindowEnding Events about one object of the act's namespace (read raw: the
    controller's Events need not fill every field the client's model asks for)."""
    listed = demo.kube.core.list_namespaced_event(
        ACME, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    return [
        e
        for e in json.loads(listed.data)["items"]
        if e.get("reason") == "WindowEnding" and (e.get("involvedObject") or {}).get("kind") == kind
    ]


def _refused(create: Callable[[], Any], what: str, saw: Callable[[], str]) -> str:
    """The create-time refusal of ``create`` (a webhook's message)."""
    try:
        create()
    except ApiException as exc:
        return _denied(exc)
    raise Mismatch(f"{what} refused at create time", f"it was admitted: {saw()}")


def _denied(exc: ApiException) -> str:
    message = _message(exc)
    prefix = "denied the request: "
    return message.split(prefix, 1)[1] if prefix in message else message


def _order_refusal(tenant: Kube, **kw: Any) -> str:
    """The claim webhook's refusal of the on-demand order ("" when admitted)."""
    body = {
        "apiVersion": keys.API_VERSION,
        "kind": keys.KIND_CLAIM,
        "metadata": {"name": ON_DEMAND},
        "spec": {"class": WINDOW_CLASS, "count": 1},
    }
    try:
        tenant.custom.create_namespaced_custom_object(
            keys.GROUP, keys.VERSION, ACME, keys.PLURAL_CLAIMS, body, **kw
        )
    except ApiException as exc:
        return _denied(exc)
    return ""


def _vm_body(annotation: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": WINDOW_VM},
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


def _bound_launcher(demo: Demo, vmi: dict[str, Any]) -> dict[str, Any] | None:
    pods = kubevirt.launcher_pods(demo.kube, ACME, kubevirt.uid_of(vmi))
    return next((p for p in pods if p["spec"].get("nodeName")), None)


def _launcher_summary(demo: Demo, vmi: dict[str, Any]) -> str:
    pods = kubevirt.launcher_pods(demo.kube, ACME, kubevirt.uid_of(vmi))
    if not pods:
        return "no launcher pod"
    return "; ".join(
        f"{p['metadata']['name']}: {_pod_summary(demo, ACME, p['metadata']['name'])}" for p in pods
    )


def _run_strategy(demo: Demo) -> str | None:
    vm = demo.kube.custom.get_namespaced_custom_object(
        keys.VM.group, keys.VM.version, ACME, keys.VM.plural, WINDOW_VM
    )
    strategy = (vm.get("spec") or {}).get("runStrategy")
    return str(strategy) if strategy is not None else None


def _shut_down(demo: Demo, handler: Kube, launcher: str) -> bool:
    """One look, as the host's virt-handler and kubelet, at the halted VM's VMI; True once
    it is gone. virt-controller deletes the VMI (and its pod); virt-handler stops the guest
    and reports the VMI Succeeded; kubelet then removes the pod, and virt-controller lets
    the VMI go."""
    vmi = _vmi(demo, ACME, WINDOW_VM)
    if vmi is None:
        return True
    if not vmi["metadata"].get("deletionTimestamp"):
        return False
    if (vmi.get("status") or {}).get("phase") in ("Scheduled", "Running"):
        unless(404, lambda: handler.vmi_phase(ACME, WINDOW_VM, "Succeeded"))
        return False
    pod = demo.pod(ACME, launcher)
    if pod is not None and pod["metadata"].get("deletionTimestamp"):
        unless(
            404,
            lambda: demo.kube.core.delete_namespaced_pod(launcher, ACME, grace_period_seconds=0),
        )
        demo.kubelets.forget_pod(ACME, launcher)
    return False


def _vmi_summary(demo: Demo, launcher: str) -> str:
    vmi = _vmi(demo, ACME, WINDOW_VM)
    if vmi is None:
        return f"no VMI {WINDOW_VM}"
    pod = demo.pod(ACME, launcher)
    return (
        f"VMI {WINDOW_VM} phase {(vmi.get('status') or {}).get('phase')}, deletionTimestamp "
        f"{vmi['metadata'].get('deletionTimestamp')}; pod {launcher} "
        + (
            "gone"
            if pod is None
            else f"deletionTimestamp {pod['metadata'].get('deletionTimestamp')}"
        )
    )
