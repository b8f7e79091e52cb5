"""Act 7, Day two: upgrades, a tenant admin's own rights, a claim template."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cli import main as kubectl_gpu
from cozystack_gpu.model import Reason
from cozystack_gpu_testkit.demo import local_pods, node_pods, platform, run_state
from cozystack_gpu_testkit.demo.acts.common import (
    ACME,
    BURST,
    BURST_TEMPLATE,
    RESEARCH,
    TENANT_USER,
    UPGRADE_SETTING,
    Demo,
    _condition,
    _phase_is,
    serving,
    summary,
)
from cozystack_gpu_testkit.demo.console import check, wait_until
from cozystack_gpu_testkit.demo.hosts import HOSTS, WORKER
from cozystack_gpu_testkit.objects import Kube


def act_day_two(demo: Demo) -> None:
    console = demo.console
    console.act(
        7,
        "Day two",
        "The hoster upgrades the chart; a tenant asks why its VM waits; the hoster looks at "
        "the nodes.",
    )
    upgrade_controller(demo)

    claim_name = keys.template_claim_name(BURST, str(BURST_TEMPLATE["name"]))
    with console.step(
        f"{TENANT_USER} ({RESEARCH}'s admin) starts VM {BURST}: a claim template of "
        f"{BURST_TEMPLATE['count']} x {BURST_TEMPLATE['class']}, beyond its budget"
    ) as found:
        _start_burst(demo, demo.as_tenant(RESEARCH))
        waiting = wait_until(
            lambda: _placed_reason(demo, claim_name),
            expected=f"template claim {claim_name} Pending, its Placed condition saying why",
            saw=summary(demo, RESEARCH, claim_name),
            timeout=60,
        )
        check(
            waiting.get("reason") == Reason.BUDGET_EXCEEDED.value,
            f"{claim_name} waiting on its budget ({Reason.BUDGET_EXCEEDED.value})",
            f"{waiting}",
        )
        found.append(f"{TENANT_USER} creates the VM with its own rights (ClusterRole admin)")
        found.append(f"GPUClaim {claim_name}: Pending; the launcher pod stays gated")

    with console.step(f"{TENANT_USER} asks about its VM, with its own rights (--as)") as found:
        argv = ["explain", "vm", BURST, "-n", RESEARCH, "--as", TENANT_USER]
        code, lines, err = _kubectl_gpu(demo, *argv)
        check(code == 0, "kubectl gpu explain vm to exit 0", f"exit {code}: {err}")
        text = "\n".join(lines)
        check(claim_name in text, f"the VM's claim {claim_name} named", text)
        found.append("$ kubectl gpu " + " ".join(argv))
        found.extend("  " + line for line in lines)

    with console.step(f"{TENANT_USER} asks why, with its own rights (--as)") as found:
        argv = ["explain", "claim", claim_name, "-n", RESEARCH, "--as", TENANT_USER]
        code, lines, err = _kubectl_gpu(demo, *argv)
        check(code == 0, "kubectl gpu explain to exit 0", f"exit {code}: {err}")
        text = "\n".join(lines)
        check(
            "Phase:      Pending" in text and Reason.BUDGET_EXCEEDED.value in text,
            "the claim's phase and its reason",
            text,
        )
        seen = [n for n in (*(h.name for h in HOSTS), WORKER, "render", ACME + "/") if n in text]
        check(not seen, "no node and no other tenant's claim named to a tenant", f"{seen}")
        found.append("$ kubectl gpu " + " ".join(argv))
        found.extend("  " + line for line in lines)

    with console.step("the hoster looks at the nodes") as found:
        code, lines, err = _kubectl_gpu(demo, "top", "nodes")
        check(code == 0, "kubectl gpu top nodes to exit 0", f"exit {code}: {err}")
        listed = {line.split()[0] for line in lines[1:] if line.split()}
        check(
            listed == {h.name for h in HOSTS},
            "a row per GPU node and class",
            "\n".join(lines),
        )
        found.append("$ kubectl gpu top nodes")
        found.extend("  " + line for line in lines)
        code, _lines, err = _kubectl_gpu(demo, "top", "nodes", "--as", TENANT_USER)
        check(code == 1, f"top as {TENANT_USER} refused (exit 1)", f"exit {code}")
        found.append(f"as {TENANT_USER}: exit {code}: {err.strip()}")


def upgrade_controller(demo: Demo) -> None:
    """Act 7's helm upgrade of a controller setting, and the controller rolled: its pods on
    the real node, or its local process."""
    if demo.node is not None:
        _upgrade_pods(demo)
    else:
        _upgrade_process(demo)


def _upgrade_pods(demo: Demo) -> None:
    """helm upgrade of a setting: the Deployment replaces its pods on the real node, one at
    a time (its PodDisruptionBudget and readiness keep a webhook server up)."""
    value_name, env_name, value = UPGRADE_SETTING
    with demo.console.step(
        f"helm upgrade --set controller.settings.{value_name}={value}: the Deployment rolls "
        "its pods"
    ) as found:
        before = node_pods.controller_pods(demo.api)
        old = {p.metadata.name for p in before}
        old_value = node_pods.container_env(before[0], env_name)
        revision = _upgrade(demo, value_name, value)
        pods = wait_until(
            lambda: _replaced(demo, old),
            expected=f"both pods replaced from the new template, Running and Ready on {WORKER}",
            saw=lambda: node_pods.describe(node_pods.controller_pods(demo.api)),
            timeout=240,
        )
        values = {node_pods.container_env(p, env_name) for p in pods}
        check(values == {str(value)}, f"{env_name}={value} in the new pods", f"{values}")
        new = {p.metadata.name for p in pods}
        lease = serving(demo, new)
        found.append(f"{revision}; the Deployment's pod template changed ({env_name})")
        found.append(
            f"{', '.join(sorted(old))} → {node_pods.describe(pods)}, {env_name} {old_value} → "
            f"{value}; Ready, Lease held by {lease}, webhooks answering"
        )


def _replaced(demo: Demo, old: set[str]) -> list[Any] | None:
    pods = node_pods.rolled_out(demo.api)
    return pods if pods and not old & {p.metadata.name for p in pods} else None


def _upgrade_process(demo: Demo) -> None:
    """helm upgrade of a setting: the local kubelet restarts the controller's process."""
    value_name, env_name, value = UPGRADE_SETTING
    assert demo.controller is not None
    pod_name = demo.controller.name
    with demo.console.step(
        f"helm upgrade --set controller.settings.{value_name}={value}: the pod is rolled"
    ) as found:
        old_pid = local_pods.local_pid(demo.dir, pod_name)
        old_value = local_pods.process_env(old_pid).get(env_name)
        revision = _upgrade(demo, value_name, value)
        new_pid = wait_until(
            lambda: _rolled(demo, pod_name, old_pid),
            expected=f"the local kubelet to restart pod {pod_name} from the new template, Ready",
            saw=lambda: (
                f"pid {local_pods.local_pid(demo.dir, pod_name)}; the local kubelet's log:\n"
                + _tail(demo.logs / "local-kubelet.log")
            ),
            timeout=60,
        )
        new_value = local_pods.process_env(new_pid).get(env_name)
        check(new_value == str(value), f"{env_name}={value} in the new process", f"{new_value}")
        lease = serving(demo, {pod_name})
        found.append(f"{revision}; the Deployment's pod template changed ({env_name})")
        found.append(
            f"{pod_name}: pid {old_pid} → {new_pid}, {env_name} {old_value} → {new_value}; "
            f"Ready, Lease held by {lease}, webhooks answering"
        )


def _upgrade(demo: Demo, value_name: str, value: object) -> str:
    """helm upgrade with one controller setting changed; returns helm's REVISION line."""
    values = json.loads(json.dumps(demo.chart_values))
    values["controller"].setdefault("settings", {})[value_name] = value
    output = platform.helm_install(demo.state, values, demo.logs / "helm.log", demo.options.chart)
    return next((ln for ln in output.splitlines() if ln.startswith("REVISION:")), "")


def _start_burst(demo: Demo, tenant: Kube) -> None:
    annotation = json.dumps({"claimTemplates": [BURST_TEMPLATE]})
    body = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": BURST},
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
    tenant.custom.create_namespaced_custom_object(
        keys.VM.group, keys.VM.version, RESEARCH, keys.VM.plural, body
    )


def _placed_reason(demo: Demo, name: str) -> dict[str, Any] | None:
    """A Pending claim's Placed condition once the binder has judged its VM's set."""
    claim = _phase_is(demo, RESEARCH, name, "Pending")
    placed = _condition(claim, keys.CONDITION_PLACED)
    return placed if placed.get("status") == "False" and placed.get("reason") else None


def _kubectl_gpu(demo: Demo, *argv: str) -> tuple[int, list[str], str]:
    """``kubectl gpu ...`` (the plugin's main, in this process) with the demo's kubeconfig:
    its exit status, its output lines and what it wrote to stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        code = kubectl_gpu.main(["--kubeconfig", demo.state.kubeconfig, *argv], out)
    return code, out.getvalue().splitlines(), err.getvalue()


def _rolled(demo: Demo, pod: str, old: int | None) -> int | None:
    pid = local_pods.local_pid(demo.dir, pod)
    obj = demo.pod(run_state.NAMESPACE, pod)
    ready = _condition(obj, "Ready").get("status") == "True"
    return pid if pid is not None and pid != old and ready else None


def _tail(path: Path, lines: int = 10) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])
