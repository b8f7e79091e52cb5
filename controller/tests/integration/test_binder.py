"""The binder against the real API server: lifecycle rules of SPEC.md §5 and §7.

Each test gets its own binder and corner of the cluster (the ``env`` fixture, see
binder_env.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from binder_env import GRACE_S, Corner, Env, condition
from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Call
from cozystack_gpu.binder.calls.claims import Decision
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit.objects import Kube, binder_config, unless, wait_for

pytestmark = pytest.mark.apiserver


# --- binding -----------------------------------------------------------------------------


def test_claim_binds_when_ordered_before_any_pod_exists(env: Env) -> None:
    node = env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "vm-a", gpu_class, 2)
    bound = env.wait_phase("vm-a", "Bound")
    assert bound["status"]["nodeName"] == node
    assert bound["status"]["boundAt"]
    assert condition(bound)["status"] == "True"
    assert condition(bound)["reason"] == "Bound"


def _refusal(env: Env, claim: str, reason: str) -> dict[str, Any]:
    def refused() -> dict[str, Any] | None:
        cond = condition(env.kube.get_claim(env.tenant, claim))
        return cond if cond.get("reason") == reason else None

    cond: dict[str, Any] = wait_for(refused, what=f"a {reason} condition on {claim}")
    assert cond["status"] == "False"
    assert env.phase(claim) == "Pending", "a refused order waits, unbound, as Pending"
    return cond


def test_order_larger_than_any_node_waits_and_says_why(env: Env) -> None:
    env.node("n1", 2)
    env.node("n2", 1)
    gpu_class = env.gpu_class(maxCount=8)
    env.kube.claim(env.tenant, "big", gpu_class, 4)
    cond = _refusal(env, "big", "InsufficientCapacity")
    assert cond["message"] == (
        f"no node serving class {gpu_class} has 4 free units; the largest has 2"
    ), cond["message"]


def test_passthrough_max_count_defaults_to_the_gpus_of_one_node(env: Env) -> None:
    env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "big", gpu_class, 4)
    cond = _refusal(env, "big", "MaxCountExceeded")
    assert gpu_class in cond["message"] and "2" in cond["message"], cond["message"]


def test_refuse_to_bind_when_the_budget_is_used(env: Env) -> None:
    env.node("n1", 8)
    gpu_class = env.gpu_class()
    env.kube.quota(env.tenant, {keys.quota_key(gpu_class): 2})
    env.kube.claim(env.tenant, "first", gpu_class, 2)
    env.wait_phase("first", "Bound")
    # The tenant admin orders past its budget; no webhook here, so only the binder judges.
    env.tenant_admin().claim(env.tenant, "second", gpu_class, 1)

    cond = _refusal(env, "second", "BudgetExceeded")
    assert cond["message"].startswith(
        f"budget {keys.quota_key(gpu_class)} of {env.tenant} (this namespace's own quota) "
        "allows 2: 2 in use, the order asks 1 more"
    ), cond["message"]


def test_lost_claims_keep_counting_against_the_budget(env: Env) -> None:
    node = env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.kube.quota(env.tenant, {keys.quota_key(gpu_class): 1})
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    env.wait_phase("held", "Bound")
    env.kube.attach(env.tenant, "held", "vm-held")
    env.kube.vmi(env.tenant, "vm-held", claims=["held"], node=node)
    env.wait_phase("held", "Attached")
    env.kube.node_status(node, ready=False)
    env.wait_phase("held", "Lost")
    env.kube.claim(env.tenant, "newcomer", gpu_class, 1)
    _refusal(env, "newcomer", "BudgetExceeded")


# --- attachment --------------------------------------------------------------------------


@pytest.mark.parametrize("ending", ["Succeeded", "Failed", "deleted"])
def test_attached_returns_to_bound_when_the_vmi_ends(env: Env, ending: str) -> None:
    node = env.node("n1", 1)
    gpu_class = env.gpu_class()
    attached = env.attached(node, gpu_class)
    assert attached["status"]["attachedTo"] == "vm"
    if ending == "deleted":
        env.kube.delete_vmi(env.tenant, "vm")
    else:
        env.kube.vmi_phase(env.tenant, "vm", ending, node)
    back = env.wait_phase("c", "Bound")
    assert "attachedTo" not in back["status"]
    assert back["status"]["nodeName"] == node, "a stopped VM keeps its GPU"


def test_a_deletion_timestamp_on_the_vmi_is_not_enough(env: Env) -> None:
    node = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.attached(node, gpu_class)
    env.kube.custom.patch_namespaced_custom_object(
        "kubevirt.io", "v1", env.tenant, "virtualmachineinstances", "vm",
        {"metadata": {"finalizers": ["test.cozystack.io/hold"]}},
    )  # fmt: skip
    env.kube.delete_vmi(env.tenant, "vm")
    vmi = env.kube.custom.get_namespaced_custom_object(
        "kubevirt.io", "v1", env.tenant, "virtualmachineinstances", "vm"
    )
    assert vmi["metadata"]["deletionTimestamp"]
    # The binder has seen the deletion timestamp once its pass is done; the claim stays.
    loops = env.binder.stats.loops
    wait_for(lambda: env.binder.stats.loops > loops + 3, what="binder loops")
    assert env.phase("c") == "Attached"
    env.kube.custom.patch_namespaced_custom_object(
        "kubevirt.io", "v1", env.tenant, "virtualmachineinstances", "vm",
        {"metadata": {"finalizers": []}},
    )  # fmt: skip
    env.wait_phase("c", "Bound")


def test_an_attachment_whose_vmi_never_appears_is_cleared(env: Env) -> None:
    env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    env.wait_phase("c", "Bound")
    env.kube.attach(env.tenant, "c", "refused-vm")

    def cleared() -> dict[str, Any] | None:
        obj = env.kube.get_claim(env.tenant, "c")
        return obj if "attachedTo" not in obj["status"] else None

    obj = wait_for(cleared, timeout=GRACE_S + 10, what="the attachment to expire")
    assert obj["status"]["phase"] == "Bound"
    assert condition(obj)["reason"] == "AttachmentExpired"


# --- moves and losses --------------------------------------------------------------------


def test_cordon_moves_unattached_claims_of_a_move_class(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class(onCordon="Move")
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    assert env.wait_phase("c", "Bound")["status"]["nodeName"] == first
    second = env.node("n2", 1)
    env.kube.cordon(first)

    def moved() -> bool:
        return bool(env.kube.get_claim(env.tenant, "c")["status"].get("nodeName") == second)

    wait_for(moved, what="the claim to move off the cordoned node")
    assert env.phase("c") == "Bound"


def test_cordon_keeps_claims_of_a_stay_class(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class(onCordon="Stay")
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    env.wait_phase("c", "Bound")
    env.node("n2", 1)
    env.kube.cordon(first)
    loops = env.binder.stats.loops
    wait_for(lambda: env.binder.stats.loops > loops + 3, what="binder loops")
    obj = env.kube.get_claim(env.tenant, "c")
    assert obj["status"]["nodeName"] == first
    assert obj["status"]["phase"] == "Bound"


def test_not_ready_node_loses_attached_claims_which_rebind_once_the_vmi_is_final(
    env: Env,
) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.attached(first, gpu_class)
    second = env.node("n2", 1)
    env.kube.node_status(first, ready=False)
    env.wait_phase("c", "Lost")

    # While the VMI may still run on the lost node, the claim is not rebound elsewhere,
    # and it says so.
    def waits_for_vmi() -> dict[str, Any] | None:
        cond = condition(env.kube.get_claim(env.tenant, "c"))
        return cond if cond.get("reason") == "VMIStillRunning" else None

    cond = wait_for(waits_for_vmi, what="the Lost claim to say why it waits")
    assert "vm" in cond["message"]
    assert env.phase("c") == "Lost"
    env.kube.vmi_phase(env.tenant, "vm", "Failed", first)
    rebound = env.wait_phase("c", "Bound")
    assert rebound["status"]["nodeName"] == second
    assert "attachedTo" not in rebound["status"]


def test_lost_claim_returns_to_attached_when_its_node_comes_back(env: Env) -> None:
    node = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.attached(node, gpu_class)
    env.kube.node_status(node, ready=False)
    env.wait_phase("c", "Lost")
    env.kube.node_status(node, ready=True)
    back = env.wait_phase("c", "Attached")
    assert back["status"]["nodeName"] == node


def test_a_deleted_node_moves_its_unattached_claims(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    assert env.wait_phase("c", "Bound")["status"]["nodeName"] == first
    second = env.node("n2", 1)
    env.kube.core.delete_node(first)
    wait_for(
        lambda: env.kube.get_claim(env.tenant, "c")["status"].get("nodeName") == second,
        what="the claim to move off the deleted node",
    )


def test_a_deleted_node_releases_the_vmi_that_never_ran_there(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.attached(first, gpu_class, phase="Scheduling")
    second = env.node("n2", 1)
    env.kube.core.delete_node(first)

    def vmi_gone() -> bool:
        try:
            env.kube.custom.get_namespaced_custom_object(
                "kubevirt.io", "v1", env.tenant, "virtualmachineinstances", "vm"
            )
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(vmi_gone, what="the stuck VMI to be deleted")
    rebound = env.wait_phase("c", "Bound")
    assert rebound["status"]["nodeName"] == second


def test_a_vmi_that_ran_on_a_deleted_node_is_left_to_kubevirt(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.attached(first, gpu_class)
    env.kube.core.delete_node(first)
    env.wait_phase("c", "Lost")
    loops = env.binder.stats.loops
    wait_for(lambda: env.binder.stats.loops > loops + 3, what="binder loops")
    vmi = env.kube.custom.get_namespaced_custom_object(
        "kubevirt.io", "v1", env.tenant, "virtualmachineinstances", "vm"
    )
    assert "deletionTimestamp" not in vmi["metadata"]


def test_unattached_claim_goes_lost_when_nowhere_has_room(env: Env) -> None:
    first = env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    env.wait_phase("c", "Bound")
    env.kube.core.delete_node(first)
    env.wait_phase("c", "Lost")
    second = env.node("n2", 1)
    assert env.wait_phase("c", "Bound")["status"]["nodeName"] == second


# --- classes -----------------------------------------------------------------------------


def test_a_class_being_deleted_serves_held_claims_and_refuses_pending(env: Env) -> None:
    env.node("n1", 4)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "held", gpu_class, 1)
    env.wait_phase("held", "Bound")
    env.kube.custom.patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class,
        {"metadata": {"finalizers": ["test.cozystack.io/hold"]}},
    )  # fmt: skip
    env.kube.custom.delete_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
    )
    env.kube.claim(env.tenant, "late", gpu_class, 1)
    _refusal(env, "late", "ClassDeleting")
    assert env.phase("held") == "Bound"
    env.kube.custom.patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class,
        {"metadata": {"finalizers": []}},
    )  # fmt: skip


def test_class_status_shows_free_units_and_nothing_else(env: Env) -> None:
    first = env.node("n1", 4)
    env.node("n2", 2)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c", gpu_class, 3)
    env.wait_phase("c", "Bound")

    def status() -> dict[str, Any] | None:
        obj = env.kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, gpu_class
        )
        st = obj.get("status") or {}
        return st if st.get("free") == 3 else None

    st = wait_for(status, what="class status free=3")
    assert st["maxFreePerNode"] == 2
    assert set(st) == {"free", "maxFreePerNode", "conditions"}
    text = str(st)
    assert first not in text and env.name("n2") not in text, "class status names no node"


# --- usage records and settings ----------------------------------------------------------


def _records(env: Env) -> list[dict[str, Any]]:
    items = env.kube.custom.list_namespaced_custom_object(
        keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, env.tenant, keys.WORKLOAD_PLURAL
    )["items"]
    return list(items)


def test_usage_record_follows_the_phase_and_is_owned_by_the_claim(env: Env) -> None:
    node = env.node("n1", 2)
    gpu_class = env.gpu_class()
    claim = env.kube.claim(env.tenant, "billable", gpu_class, 2)
    env.wait_phase("billable", "Bound")
    (record,) = wait_for(lambda: _records(env), what="a usage record")
    assert record["metadata"]["name"] == "gpuclaim-billable"
    owner = record["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "GPUClaim",
        "billable",
        claim["metadata"]["uid"],
    )
    assert record["status"]["resources"] == {keys.quota_key(gpu_class): "2"}
    assert record["status"]["kind"] == "GPUClaim"
    # Lost: no record.
    env.kube.attach(env.tenant, "billable", "vm")
    env.kube.vmi(env.tenant, "vm", claims=["billable"], node=node)
    env.wait_phase("billable", "Attached")
    assert len(_records(env)) == 1
    env.kube.node_status(node, ready=False)
    env.wait_phase("billable", "Lost")
    wait_for(lambda: not _records(env), what="the record to go with the Lost phase")


def _record_status(env: Env, name: str) -> dict[str, Any] | None:
    try:
        obj = env.kube.custom.get_namespaced_custom_object(
            keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, env.tenant, keys.WORKLOAD_PLURAL, name
        )
    except ApiException as exc:
        if exc.status == 404:
            return None  # not written yet
        raise
    status: dict[str, Any] | None = obj.get("status")
    return status


def test_a_usage_record_whose_status_was_edited_or_never_written_is_restored(env: Env) -> None:
    """Billing reads the record's status: a careless hoster or another controller that
    edits it (tenants have no right on Workloads, the chart's tenant roles reach only
    claims and classes), or a record made without one, is written back to the claim's."""
    gpu_class = env.gpu_class()
    billed = {
        "kind": keys.WORKLOAD_STATUS_KIND,
        "type": keys.WORKLOAD_STATUS_TYPE,
        "resources": {keys.quota_key(gpu_class): "2"},
        "operational": True,
    }
    record = (keys.WORKLOAD_GROUP, keys.WORKLOAD_VERSION, env.tenant, keys.WORKLOAD_PLURAL)
    env.node("n1", 2)
    env.kube.claim(env.tenant, "billed", gpu_class, 2)
    env.wait_phase("billed", "Bound")
    wait_for(lambda: _record_status(env, "gpuclaim-billed") == billed, what="the record")
    # Without a status, as a record whose status write never landed.
    env.kube.custom.patch_namespaced_custom_object(*record, "gpuclaim-billed", {"status": None})
    wait_for(
        lambda: _record_status(env, "gpuclaim-billed") == billed,
        what="the record without a status to get the claim's (unbilled otherwise)",
        timeout=10,
    )
    # Edited: 0 units, not operational, and a key of its own.
    env.kube.custom.patch_namespaced_custom_object(
        *record,
        "gpuclaim-billed",
        {
            "status": {
                "resources": {keys.quota_key(gpu_class): "0", "extra": "1"},
                "operational": False,
                "note": "edited",
            }
        },
    )
    wait_for(
        lambda: _record_status(env, "gpuclaim-billed") == billed,
        what="the edited record's status (0 units billed) to be written back",
        timeout=10,
    )


def test_template_claims_get_no_usage_record(env: Env) -> None:
    env.node("n1", 2)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "tmpl", gpu_class, 1, labels={keys.LABEL_TEMPLATE_CLAIM: "true"})
    env.kube.claim(env.tenant, "ordered", gpu_class, 1)
    env.wait_phase("ordered", "Bound")
    wait_for(lambda: _records(env), what="the ordered claim's record")
    names = [r["metadata"]["name"] for r in _records(env)]
    assert names == ["gpuclaim-ordered"]


def test_a_template_claim_cut_from_its_vmi_goes_with_that_vmi(env: Env) -> None:
    """Cut from its VMI owner (or its label taken off), a template claim is no longer the
    garbage collector's to delete: it would stay Bound after its VM, a hold with no usage
    record. The binder deletes it once the VMI of the uid it was made for is gone. The
    cuts are written as the platform admin, past the protection policy."""
    env.node("n1", 2)
    gpu_class = env.gpu_class()
    templates = [{"name": "a", "class": gpu_class}, {"name": "b", "class": gpu_class}]
    vmi = env.gated_vmi("vm", json.dumps({"claimTemplates": templates}), units=2)
    claims = (keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_CLAIMS)
    for name in ("vm-a", "vm-b"):
        wait_for(
            lambda name=name: unless(404, lambda: env.kube.get_claim(env.tenant, name)),
            15,
            f"the gate to make template claim {name}",
        )
        made = env.wait_phase(name, "Attached")  # attached to its VMI from the start
        uid = made["metadata"]["annotations"][keys.ANNOTATION_TEMPLATE_VMI_UID]
        assert uid == vmi["metadata"]["uid"], made["metadata"]
    mine = env.kube.core.create_namespaced_config_map(env.tenant, {"metadata": {"name": "mine"}})
    second = {"apiVersion": "v1", "kind": "ConfigMap", "name": "mine", "uid": mine.metadata.uid}
    env.kube.custom.patch_namespaced_custom_object(
        *claims, "vm-a", {"metadata": {"ownerReferences": None}}
    )
    env.kube.custom.patch_namespaced_custom_object(
        *claims, "vm-b", {"metadata": {"labels": None, "ownerReferences": [second]}}
    )
    # Its VMI still there, the claim stays: it was made for that VMI.
    assert {"vm-a", "vm-b"} <= {c["metadata"]["name"] for c in env.kube.claims(env.tenant)}
    env.kube.custom.delete_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, "vm"
    )

    def left() -> set[str]:
        return {c["metadata"]["name"] for c in env.kube.claims(env.tenant)} & {"vm-a", "vm-b"}

    try:
        wait_for(lambda: not left(), 15, "the binder to delete the left-over template claims")
    except AssertionError:
        raise AssertionError(
            f"template claims {sorted(left())} outlived VMI vm: Bound holds with no usage record"
        ) from None


def test_settings_configmap_lists_gpu_resource_names_and_raw_policy(env: Env) -> None:
    env.node("n1", 1)
    env.gpu_class()
    core = client.CoreV1Api(env.kube.api)

    def settings() -> dict[str, str] | None:
        try:
            cm = core.read_namespaced_config_map(keys.SETTINGS_CONFIGMAP, env.controller_ns)
        except ApiException:
            return None
        names = keys.parse_resource_names(cm.data.get(keys.SETTINGS_KEY_RESOURCE_NAMES, ""))
        return dict(cm.data) if env.resource in names else None

    data = wait_for(settings, what="the settings ConfigMap")
    names = data[keys.SETTINGS_KEY_RESOURCE_NAMES].split(",")
    assert names == sorted(set(names)), "sorted and unique"
    assert data[keys.SETTINGS_KEY_RAW_RESOURCE_NAMES] == "allowed"


# --- optimistic concurrency --------------------------------------------------------------


class _Meddling(Binder):
    """A binder whose first bind is overtaken: someone writes the claim between the
    decision and the status write, so the write carries a stale resourceVersion."""

    def __init__(self, *args: Any, meddle: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._meddle = meddle
        self.meddled = 0

    def send(self, call: Call) -> None:
        if isinstance(call, Decision) and call.step == "Bind" and not self.meddled:
            self.meddled += 1
            self._meddle(call.claim)
        super().send(call)


def test_a_bind_overtaken_by_another_write_is_judged_again_and_books_once(
    api_client: Any, kube: Kube, corner: Corner
) -> None:
    test_id, controller_ns, tenant = corner.id, corner.controller_ns, corner.tenant
    corner.node("n1", 1)
    corner.gpu_class()

    def meddle(key: Any) -> None:
        kube.custom.patch_namespaced_custom_object(
            keys.GROUP, keys.VERSION, key.namespace, keys.PLURAL_CLAIMS, key.name,
            {"metadata": {"labels": {"touched": "yes"}}},
        )  # fmt: skip

    binder = _Meddling(api_client, binder_config(controller_ns), meddle=meddle)
    binder.start()
    try:
        assert binder.synced.wait(30)
        kube.claim(tenant, "first", f"h100-{test_id}", 1)
        kube.claim(tenant, "second", f"h100-{test_id}", 1)

        def settled() -> list[dict[str, Any]] | None:
            claims = kube.claims(tenant)
            bound = [c for c in claims if (c.get("status") or {}).get("phase") == "Bound"]
            return claims if bound and binder.stats.conflicts >= 1 else None

        wait_for(settled, what="a conflict and a bind")
        loops = binder.stats.loops
        wait_for(lambda: binder.stats.loops > loops + 3, what="binder loops")
        claims = wait_for(
            lambda: (
                (found := kube.claims(tenant))
                and all((c.get("status") or {}).get("phase") for c in found)
                and found
            ),
            what="both claims to show a phase",
        )
    finally:
        binder.stop()
    phases = {c["metadata"]["name"]: (c.get("status") or {}).get("phase") for c in claims}
    assert binder.meddled == 1
    assert sorted(phases.values()) == ["Bound", "Pending"], f"one unit, one bind: {phases}"


def test_a_running_launcher_pod_keeps_its_units_after_its_claim_is_deleted_by_force(
    env: Env,
) -> None:
    """Defence in depth behind the protection policy: the units a running launcher pod uses
    stay occupied on its node when no claim covers them any more."""
    gpu_class = env.gpu_class()
    node = env.node("n1", 1)
    env.attached(node, gpu_class)
    vmi = env.kube.custom.get_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, keys.VMI.plural, "vm"
    )
    owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": "vm"}
    resources = {env.resource: "1"}
    env.kube.core.create_namespaced_pod(
        env.tenant,
        {
            "metadata": {
                "name": "virt-launcher-vm",
                "labels": {"kubevirt.io": "virt-launcher", keys.LABEL_CLAIMS_REF: "true"},
                "ownerReferences": [{**owner, "uid": vmi["metadata"]["uid"], "controller": True}],
            },
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "compute",
                        "image": "virt-launcher",
                        "resources": {"requests": resources, "limits": resources},
                    }
                ],
            },
        },
    )
    # An admin deletes the claim and strips its finalizer: claim and record are gone.
    claims = (keys.GROUP, keys.VERSION, env.tenant, keys.PLURAL_CLAIMS)
    env.kube.custom.delete_namespaced_custom_object(*claims, "c")
    env.kube.custom.patch_namespaced_custom_object(*claims, "c", {"metadata": {"finalizers": None}})
    wait_for(
        lambda: "c" not in {c["metadata"]["name"] for c in env.kube.claims(env.tenant)},
        15,
        "the claim to go",
    )
    env.kube.claim(env.tenant, "next", gpu_class, 1)

    def judged() -> dict[str, Any] | None:
        obj = env.kube.get_claim(env.tenant, "next")
        return obj if condition(obj).get("status") == "False" else None

    waiting = wait_for(judged, 15, "the order to be judged")
    assert (waiting.get("status") or {}).get("nodeName") is None
    assert condition(waiting)["reason"] == "InsufficientCapacity", condition(waiting)
    # The pod goes: its unit is free again.
    env.kube.core.delete_namespaced_pod("virt-launcher-vm", env.tenant, grace_period_seconds=0)
    env.wait_phase("next", "Bound")
