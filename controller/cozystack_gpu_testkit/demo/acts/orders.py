"""Act 3, Orders: tenants order GPUs within their budgets."""

from __future__ import annotations

import base64

from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu_testkit import tenants
from cozystack_gpu_testkit.demo.acts.common import (
    ACME,
    LICENSED,
    ORDERS,
    RESEARCH,
    STAND_IN_TOKEN,
    TENANT_USERS,
    TENANTS,
    TOKEN_SECRET,
    Demo,
    _claim_summary,
    _condition,
    _message,
    in_phase,
    summary,
    usage_record,
)
from cozystack_gpu_testkit.demo.console import Mismatch, check, wait_until
from cozystack_gpu_testkit.objects import unless


# one piece: an act of the demo, its scenes in the order the viewer sees them
def act_orders(demo: Demo) -> None:
    console = demo.console
    console.act(
        3,
        "Orders",
        "Tenants in a tree with budgets order claims; what does not fit is refused at once.",
    )
    with console.step("a tenant tree: budgets (ResourceQuota keys), vGPU entitlement") as found:
        for namespace, ancestors, budget, vgpu in TENANTS:
            labels = {f"{keys.TENANT_LABEL_PREFIX}{a}": "" for a in (*ancestors, namespace)}
            if vgpu:
                labels[keys.LABEL_VGPU_ENTITLEMENT] = keys.VGPU_ENTITLEMENT_VALUE
            demo.kube.namespace(namespace, {**labels, **demo.state.mark})
            demo.kube.quota(namespace, budget)
            found.append(
                "  " * len(ancestors)
                + f"{namespace}: {', '.join(f'{k} {v}' for k, v in budget.items())}"
                + (", vGPU entitled" if vgpu else "")
            )

    with console.step("each ordering tenant's user: the built-in admin role there") as found:
        for namespace, user in TENANT_USERS.items():
            # The chart installed its claim roles; KubeVirt's are stood in for where it has none.
            tenants.grant_tenant_admin(demo.api, (), user, [namespace], labels=demo.state.mark)
            found.append(
                f"RoleBinding {namespace}/{user}-admin: ClusterRole admin (the chart's claim "
                f"roles and KubeVirt's VM rights aggregate into it) for user {user}"
            )
        found.append("every order, VM and question of a tenant below is that user's own")

    copy = keys.license_copy_name(LICENSED)
    with console.step(f"class {LICENSED}'s licence reaches the vGPU-entitled tenant only") as found:
        entitled = [ns for ns, _a, _b, vgpu in TENANTS if vgpu]
        others = [ns for ns, _a, _b, vgpu in TENANTS if not vgpu]
        wait_until(
            lambda: _license_copies(demo) == entitled,
            expected=f"Secret {copy} in {', '.join(entitled)} only",
            saw=lambda: f"in {_license_copies(demo)}",
            timeout=30,
        )
        (where,) = entitled
        data = demo.kube.core.read_namespaced_secret(copy, where).data or {}
        token = base64.b64decode(data.get(keys.LICENSE_TOKEN_KEY, ""))
        check(token == STAND_IN_TOKEN, f"the copy to hold {TOKEN_SECRET}'s token", f"{token!r}")
        feature = base64.b64decode(data.get(keys.LICENSE_FEATURE_TYPE_KEY, "")).decode()
        for namespace in others:
            check(not _has_secret(demo, namespace, copy), f"no {copy} in {namespace}", "one")
        found.append(
            f"Secret {copy} in {where} (vGPU entitled) only: keys "
            f"{', '.join(sorted(data))} ({feature}), the controller's copy of {TOKEN_SECRET}"
        )
        found.append(f"no copy in {', '.join(others)} (not entitled)")

    for namespace, name, cls, count in ORDERS:
        user = TENANT_USERS[namespace]
        with console.step(f"{user} ({namespace}) orders {name}: {count} x {cls}") as found:
            demo.as_tenant(namespace).claim(namespace, name, cls, count)
            bound = wait_until(
                in_phase(demo, namespace, name, "Bound"),
                expected=f"GPUClaim {namespace}/{name} Bound",
                saw=summary(demo, namespace, name),
                timeout=30,
            )
            demo.claim_nodes[name] = bound["status"]["nodeName"]
            wait_until(
                usage_record(demo, namespace, name),
                expected=f"usage record (Workload) gpuclaim-{name} in {namespace}",
                saw=lambda: "none",
                timeout=30,
            )
            found.append(
                f"Bound on {bound['status']['nodeName']}: "
                f"{_condition(bound, keys.CONDITION_BOUND).get('message')}; "
                f"usage record gpuclaim-{name}"
            )

    with console.step(f"{TENANT_USERS[RESEARCH]} orders 1 more h100: over its budget") as found:
        message = _refused(demo, RESEARCH, "more", "h100", 1)
        wanted = (
            f"budget {keys.quota_key('h100')} of {RESEARCH} (this namespace's own quota) "
            "allows 2: 2 in use"
        )
        check(wanted in message, f"a refusal saying '{wanted}…'", message)
        found.append(f"refused at create time: {message}")

    with console.step(
        f"{TENANT_USERS[ACME]} ({ACME}) orders 4 x h100: more than any node has free"
    ) as found:
        message = _refused(demo, ACME, "big", "h100", 4)
        wanted = "no node serving class h100 has 4 free units; the largest has 2"
        check(wanted in message, f"a refusal saying '{wanted}'", message)
        found.append(f"refused at create time: {message}")
    demo.show("get", "gpuclaims", "-A")


def _license_copies(demo: Demo) -> list[str]:
    """The namespaces holding a copy of the licensed class's token, by the copies' label."""
    found = demo.kube.core.list_secret_for_all_namespaces(
        label_selector=f"{keys.LABEL_LICENSE_CLASS}={LICENSED}"
    )
    return sorted(s.metadata.namespace for s in found.items)


def _has_secret(demo: Demo, namespace: str, name: str) -> bool:
    return unless(404, lambda: demo.kube.core.read_namespaced_secret(name, namespace)) is not None


def _refused(demo: Demo, namespace: str, name: str, cls: str, count: int) -> str:
    """The create-time refusal of an order (the claim webhook's message)."""
    try:
        demo.as_tenant(namespace).claim(namespace, name, cls, count)
    except ApiException as exc:
        message = _message(exc)
        prefix = "denied the request: "
        return message.split(prefix, 1)[1] if prefix in message else message
    raise Mismatch(
        f"the order {namespace}/{name} refused at create time",
        f"it was admitted: {_claim_summary(demo, namespace, name)}",
    )
