"""The gate with a VMI whose claims annotation it cannot act on: the launcher pod stays
gated, and the VMI (and its claims) say why.

Found by the fault suite's fuzzing of claims annotations (VMIs stored without the VMI
webhook, which refuses both at admission): a VMI naming a claim that does not exist kept
its pod at the gate for ever without a word (its template claims were created and never
told anything), and a VMI whose annotation cannot be read had its pod ungated without a
pin, so the scheduler could place it anywhere with GPU requests the binder never counts.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from binder_env import Env, condition

from cozystack_gpu import keys
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit.objects import wait_for

pytestmark = pytest.mark.apiserver


def warning(env: Env, vmi: str) -> str | None:
    events = env.kube.core.list_namespaced_event(
        env.tenant, field_selector=f"involvedObject.name={vmi}"
    )
    for event in events.items:
        if event.reason == keys.EventReason.SET_NOT_PLACED.value and event.type == "Warning":
            return str(event.message)
    return None


def still_gated(env: Env, vmi: str) -> bool:
    pod = env.kube.api.sanitize_for_serialization(
        env.kube.core.read_namespaced_pod(f"virt-launcher-{vmi}", env.tenant)
    )
    return vmi_pods.is_gated(pod) and not pod["spec"].get("nodeName")


def test_a_set_naming_a_claim_that_does_not_exist_waits_gated_and_says_which(env: Env) -> None:
    env.node("n1", 2)
    gpu_class = env.gpu_class()
    annotation = {"claims": ["nope"], "claimTemplates": [{"name": "t", "class": gpu_class}]}
    env.gated_vmi("vm", json.dumps(annotation), units=1)

    told = wait_for(lambda: warning(env, "vm"), 20, "a Warning event on the VMI")
    assert "nope" in told and "does not exist" in told, told
    template = keys.template_claim_name("vm", "t")

    def placed() -> dict[str, Any]:
        return condition(env.kube.get_claim(env.tenant, template), keys.CONDITION_PLACED)

    cond = wait_for(placed, 20, "the Placed condition on the template claim")
    assert cond["status"] == "False" and cond["reason"] == keys.AdmissionReason.CLAIM_NOT_FOUND
    assert "nope" in cond["message"]
    assert still_gated(env, "vm")


def test_a_malformed_annotation_keeps_the_pod_gated_and_says_why(env: Env) -> None:
    env.node("n1", 2)
    env.gpu_class()
    env.gated_vmi("vm", '{"claims": ["a"', units=1)

    told = wait_for(lambda: warning(env, "vm"), 20, "a Warning event on the VMI")
    assert "malformed" in told and keys.ANNOTATION_CLAIMS in told, told
    time.sleep(2.0)  # several passes of the gate
    assert still_gated(env, "vm"), "a pod whose claims cannot be read was ungated"
