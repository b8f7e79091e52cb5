"""Live migration keeps the hold (SPEC §12), on KubeVirt's own virt-controller: a
``VirtualMachineInstanceMigration`` makes virt-controller render the target pod; the pod
webhook gates it, the binder places the set's target on another node, records it on the
claim and pins and ungates the pod in one update; the real kube-scheduler binds it there.
The kit plays virt-handler (the VMI ``LiveMigratable``, then the VM landing on the target)
and kubelet. The hold follows the VM when it lands; a failed migration frees the target."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from admission_env import Replica, order, refusal
from binder_env import Env
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import kubevirt as kubevirt_kit
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

pytestmark = pytest.mark.apiserver

TIMEOUT = kubevirt_kit.START_TIMEOUT_S


def target_pod(kube: Kube, namespace: str, vmi_uid: str, migration_uid: str) -> Any:
    def found() -> dict[str, Any] | None:
        for pod in kubevirt_kit.launcher_pods(kube, namespace, vmi_uid):
            labels = pod["metadata"].get("labels") or {}
            if labels.get(keys.LABEL_MIGRATION_JOB_UID) == migration_uid:
                return pod
        return None

    return found


def removed(kube: Kube, namespace: str, found: Any) -> Any:
    """A wait for the target pod ``found`` finds to be gone, playing kubelet for each
    deleted launcher pod on the way."""

    def gone() -> bool:
        kubevirt_kit.kubelet_removes(kube, namespace)
        return found() is None

    return gone


def test_a_migration_target_is_placed_pinned_and_the_hold_follows_the_vm(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    nodes = [env.node(n, 2) for n in ("n1", "n2")]
    for node in nodes:
        kubevirt_kit.as_virt_handler(kube.api, node)
    gpu_class = env.gpu_class(maxCount=2)
    order(kube, env.tenant, "a", gpu_class, 1)
    source = env.wait_phase("a", "Bound", timeout=TIMEOUT)["status"]["nodeName"]
    (other,) = [n for n in nodes if n != source]
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": ["a"]})
    vmi = kubevirt_kit.runs(kube, env.tenant, kubevirt_kit.wait_vmi(kube, env.tenant, "vm"))
    assert vmi["status"]["nodeName"] == source
    env.wait_phase("a", "Attached", timeout=TIMEOUT)
    kubevirt_kit.migratable(kube, env.tenant, "vm")

    job = kubevirt_kit.migrate(kube, env.tenant, "vm", "move")
    uid = job["metadata"]["uid"]
    found = target_pod(kube, env.tenant, vmi["metadata"]["uid"], uid)
    try:
        first = wait_for(found, TIMEOUT, "virt-controller's target pod")
    except AssertionError:
        job = kube.custom.get_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, env.tenant, "virtualmachineinstancemigrations", "move"
        )
        now = kubevirt_kit.get_vmi(kube, env.tenant, "vm")
        raise AssertionError(
            f"VMIM: {job.get('status')}\nVMI status: {(now or {}).get('status')}\n"
            f"virt-controller:\n{kubevirt.log_tail()}"
        ) from None
    assert vmi_pods.is_gated(first) or vmi_pods.pinned_node(first) == other, first["metadata"]

    # The target recorded on the claim, then the pod pinned there and bound by the scheduler.
    def recorded() -> dict[str, Any] | None:
        status = kube.get_claim(env.tenant, "a").get("status") or {}
        return status if (status.get("migration") or {}).get("migrationUID") == uid else None

    status = wait_for(recorded, TIMEOUT, "the target recorded on claim a")
    assert status["migration"]["node"] == other and status["nodeName"] == source
    bound = wait_for(
        lambda: (p := found()) and p["spec"].get("nodeName") and p, TIMEOUT, "the target bound"
    )
    assert bound["spec"]["nodeName"] == other
    assert vmi_pods.pinned_node(bound) == other and not vmi_pods.is_gated(bound)

    # While it runs, the target's unit counts on its node: each node has one left, so an
    # order of two is refused at create.
    try:
        kube.claim(env.tenant, "two", gpu_class, 2)
    except ApiException as exc:
        assert exc.status == 403 and "the largest has 1" in refusal(exc), refusal(exc)
    else:
        raise AssertionError("an order took the unit the migration's target holds")

    # virt-handler: the VM runs on the target now.
    kubevirt_kit.kubelet_runs(kube.api, env.tenant, bound["metadata"]["name"])
    kubevirt_kit.lands(kube, env.tenant, "vm", uid, source, other, bound["metadata"]["name"])

    def moved() -> dict[str, Any] | None:
        status = kube.get_claim(env.tenant, "a").get("status") or {}
        return status if status.get("nodeName") == other and not status.get("migration") else None

    status = wait_for(moved, TIMEOUT, "the hold moved to the target")
    assert status["phase"] == "Attached" and status["attachedTo"] == "vm"


def running_migratable(env: Env, nodes: list[str], claim: str) -> tuple[dict[str, Any], str]:
    """VM "vm" holding ``claim``, Running where the claim is bound and marked migratable."""
    kube = env.kube
    for node in nodes:
        kubevirt_kit.as_virt_handler(kube.api, node)
    source = env.wait_phase(claim, "Bound", timeout=TIMEOUT)["status"]["nodeName"]
    kubevirt_kit.create_vm(kube, env.tenant, "vm", {"claims": [claim]})
    vmi = kubevirt_kit.runs(kube, env.tenant, kubevirt_kit.wait_vmi(kube, env.tenant, "vm"))
    env.wait_phase(claim, "Attached", timeout=TIMEOUT)
    kubevirt_kit.migratable(kube, env.tenant, "vm")
    return vmi, source


@dataclass
class UnderWay:
    """A migration of VM "vm" (holding claim "a" of one unit) whose target pod is bound to
    the other of two one-unit nodes: where each test of how one ends starts."""

    gpu_class: str
    source: str
    other: str
    uid: str
    found: Any  # the target pod, or None once gone


def migration_under_way(env: Env) -> UnderWay:
    kube = env.kube
    nodes = [env.node(n, 1) for n in ("n1", "n2")]
    gpu_class = env.gpu_class(maxCount=1)
    order(kube, env.tenant, "a", gpu_class, 1)
    vmi, source = running_migratable(env, nodes, "a")
    (other,) = [n for n in nodes if n != source]
    uid = kubevirt_kit.migrate(kube, env.tenant, "vm", "move")["metadata"]["uid"]
    found = target_pod(kube, env.tenant, vmi["metadata"]["uid"], uid)
    wait_for(lambda: (p := found()) and p["spec"].get("nodeName") and p, TIMEOUT, "target bound")
    assert kube.get_claim(env.tenant, "a")["status"]["migration"]["node"] == other
    return UnderWay(gpu_class, source, other, uid, found)


def target_cleared(kube: Kube, namespace: str) -> Any:
    """A wait for claim "a" to record no migration: its status then."""

    def cleared() -> dict[str, Any] | None:
        status = kube.get_claim(namespace, "a").get("status") or {}
        return status if not status.get("migration") else None

    return cleared


def test_a_cancelled_migration_frees_its_target_and_the_hold_stays(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    under_way = migration_under_way(env)
    # The tenant cancels: virt-controller deletes the target pod (kubelet removes it here).
    kube.custom.delete_namespaced_custom_object(
        keys.VMI.group, keys.VMI.version, env.tenant, "virtualmachineinstancemigrations", "move"
    )
    wait_for(removed(kube, env.tenant, under_way.found), TIMEOUT, "the target pod gone")
    status = wait_for(target_cleared(kube, env.tenant), TIMEOUT, "the target freed")
    assert status["nodeName"] == under_way.source, "the hold stays where the VM runs"
    # The target's unit is free again: an order takes it.
    order(kube, env.tenant, "b", under_way.gpu_class, 1)
    assert env.wait_phase("b", "Bound", timeout=TIMEOUT)["status"]["nodeName"] == under_way.other


def test_a_target_with_no_room_stays_gated_and_the_vmi_is_told(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    nodes = [env.node(n, 1) for n in ("n1", "n2")]
    gpu_class = env.gpu_class(maxCount=1)
    order(kube, env.tenant, "a", gpu_class, 1)
    order(kube, env.tenant, "b", gpu_class, 1)  # the other node's one unit
    vmi, _source = running_migratable(env, nodes, "a")
    # The tenant admin migrates its VM (kubevirt.io:admin, aggregated into admin, grants
    # it) to where the only unit is held: its target pod must not take that unit.
    job = kubevirt_kit.migrate(env.tenant_admin(), env.tenant, "vm", "move")
    found = target_pod(kube, env.tenant, vmi["metadata"]["uid"], job["metadata"]["uid"])
    first = wait_for(found, TIMEOUT, "virt-controller's target pod")

    def told() -> list[dict[str, Any]] | None:
        listed = kube.core.list_namespaced_event(
            env.tenant, field_selector="involvedObject.name=vm"
        ).items
        said = [e for e in listed if e.reason == keys.EventReason.SET_NOT_PLACED.value]
        return said or None

    (event, *_rest) = wait_for(told, TIMEOUT, "the VMI told why its target waits")
    assert "the live migration of VMI vm waits" in event.message, event.message
    pod = found()
    assert pod is not None and vmi_pods.is_gated(pod) and not pod["spec"].get("nodeName")
    assert pod["metadata"]["uid"] == first["metadata"]["uid"]
    assert not (kube.get_claim(env.tenant, "a").get("status") or {}).get("migration")

    def claim_told() -> dict[str, Any] | None:
        for cond in (kube.get_claim(env.tenant, "a").get("status") or {}).get("conditions", []):
            if cond["type"] == keys.CONDITION_MIGRATION and cond["status"] == "False":
                return dict(cond)
        return None

    said = wait_for(claim_told, TIMEOUT, "claim a told why its VM's target waits")
    assert said["reason"] == "MigrationTargetNotPlaced" and "has 1 free unit" in said["message"]


def test_a_new_leader_finds_the_migration_where_it_is_and_a_second_migration_moves_again(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    """The binder restarted between the target's record and the VM landing (a new leader
    knows only what status says), then the VM migrates back: each hold follows it."""
    env = vms
    kube = env.kube
    nodes = [env.node(n, 1) for n in ("n1", "n2")]
    gpu_class = env.gpu_class(maxCount=1)
    order(kube, env.tenant, "a", gpu_class, 1)
    vmi, source = running_migratable(env, nodes, "a")
    (other,) = [n for n in nodes if n != source]
    where = source
    for leg, to in enumerate((other, source)):
        job = kubevirt_kit.migrate(kube, env.tenant, "vm", f"move-{leg}")
        uid = job["metadata"]["uid"]
        found = target_pod(kube, env.tenant, vmi["metadata"]["uid"], uid)

        def recorded(uid: str = uid) -> dict[str, Any] | None:
            status = kube.get_claim(env.tenant, "a").get("status") or {}
            return status if (status.get("migration") or {}).get("migrationUID") == uid else None

        assert wait_for(recorded, TIMEOUT, "the target recorded")["migration"]["node"] == to
        if leg == 0:
            env.restart_binder()  # a new leader: memory gone, status kept
        bound = wait_for(
            lambda found=found: (p := found()) and p["spec"].get("nodeName") and p,
            TIMEOUT,
            "the target bound",
        )
        assert bound["spec"]["nodeName"] == to
        kubevirt_kit.kubelet_runs(kube.api, env.tenant, bound["metadata"]["name"])
        kubevirt_kit.lands(kube, env.tenant, "vm", uid, where, to, bound["metadata"]["name"])

        def moved(to: str = to) -> dict[str, Any] | None:
            status = kube.get_claim(env.tenant, "a").get("status") or {}
            landed = status.get("nodeName") == to and not status.get("migration")
            return status if landed else None

        try:
            wait_for(moved, TIMEOUT, f"the hold moved to {to}")
        except AssertionError:
            now = kubevirt_kit.get_vmi(kube, env.tenant, "vm") or {}
            raise AssertionError(
                f"claim {kube.get_claim(env.tenant, 'a').get('status')}\nvmi {now.get('status')}"
            ) from None
        # KubeVirt's own clean-up of the finished migration: its source pod goes.
        for pod in kubevirt_kit.launcher_pods(kube, env.tenant, vmi["metadata"]["uid"]):
            if pod["spec"].get("nodeName") == where:
                kube.core.delete_namespaced_pod(pod["metadata"]["name"], env.tenant)
        kubevirt_kit.kubelet_removes(kube, env.tenant)
        # The finished migration's object goes, so KubeVirt takes the next one.
        kube.custom.delete_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, env.tenant, "virtualmachineinstancemigrations",
            f"move-{leg}",
        )  # fmt: skip

        def job_gone(name: str = f"move-{leg}") -> bool:
            try:
                got = kube.custom.get_namespaced_custom_object(
                    keys.VMI.group, keys.VMI.version, env.tenant,
                    "virtualmachineinstancemigrations", name,
                )  # fmt: skip
            except ApiException as exc:
                return exc.status == 404
            return not got  # still there: virt-controller lifts its finalizer

        wait_for(job_gone, TIMEOUT, "the finished migration gone")
        where = to


def test_a_target_whose_node_is_lost_mid_migration_is_freed_and_the_hold_stays(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    under_way = migration_under_way(env)
    # The target's node fails before the VM lands: gone from the cluster.
    kube.core.delete_node(under_way.other)
    # Its GPUNode is owned by the Node: the garbage collector may have taken it already.
    unless(
        404,
        lambda: kube.custom.delete_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_NODES, under_way.other
        ),
    )
    status = wait_for(target_cleared(kube, env.tenant), TIMEOUT, "the lost target freed")
    assert (status["nodeName"], status["phase"]) == (under_way.source, "Attached")


def test_a_failed_migration_frees_its_target_and_the_hold_stays(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    env = vms
    kube = env.kube
    under_way = migration_under_way(env)
    pod = under_way.found()["metadata"]["name"]
    kubevirt_kit.kubelet_runs(kube.api, env.tenant, pod)
    # virt-handler: the guest could not be moved; the VM stays on the source, and the
    # target's launcher exits.
    kubevirt_kit.fails(
        kube, env.tenant, "vm", under_way.uid, under_way.source, under_way.other, pod
    )
    status = wait_for(target_cleared(kube, env.tenant), TIMEOUT, "the failed target freed")
    assert (status["nodeName"], status["phase"]) == (under_way.source, "Attached")
    # The target's unit is orders' again.
    order(kube, env.tenant, "b", under_way.gpu_class, 1)
    assert env.wait_phase("b", "Bound", timeout=TIMEOUT)["status"]["nodeName"] == under_way.other


def test_a_pod_forged_as_the_migrations_target_stays_gated_and_its_deletion_ends_nothing(
    kubevirt: kubevirt_kit.VirtController, kubevirt_webhooks: Replica, vms: Env
) -> None:
    """The tenant admin makes a pod of its own beside the real, pinned target: the labels
    of the migration's target pod and an owner reference to the VMI, no GPU request (no
    raw-name policy judges it). It must stay gated, and deleting it must not end the
    migration: the target's unit freed while the VM moves there would be ordered by another
    tenant and used twice when the VM lands."""
    env = vms
    kube = env.kube
    under_way = migration_under_way(env)
    real = under_way.found()
    vmi = kubevirt_kit.get_vmi(kube, env.tenant, "vm")
    assert vmi is not None
    labels = {
        "kubevirt.io": "virt-launcher",
        keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE,
        keys.LABEL_MIGRATION_JOB_UID: under_way.uid,
    }
    owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": "vm",
             "uid": vmi["metadata"]["uid"], "controller": True}  # fmt: skip
    forged = {
        "metadata": {"name": "forged-target", "labels": labels, "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "compute", "image": kubevirt_kit.LAUNCHER_IMAGE}]},
    }
    env.tenant_admin().core.create_namespaced_pod(env.tenant, forged)
    spare = env.node("n3", 2)

    def forged_pod() -> dict[str, Any]:
        return dict(kube.core.read_namespaced_pod("forged-target", env.tenant).to_dict())

    # An order bound after it: the leader has had its passes over the forged pod.
    order(kube, env.tenant, "after-forged", under_way.gpu_class, 1)
    assert env.wait_phase("after-forged", "Bound", timeout=TIMEOUT)["status"]["nodeName"] == spare
    pod = forged_pod()
    assert pod["spec"]["scheduling_gates"], "the forged pod was ungated"
    assert not pod["spec"].get("affinity"), "the forged pod was pinned"

    kube.core.delete_namespaced_pod("forged-target", env.tenant, grace_period_seconds=0)
    order(kube, env.tenant, "after-delete", under_way.gpu_class, 1)
    assert env.wait_phase("after-delete", "Bound", timeout=TIMEOUT)["status"]["nodeName"] == spare
    status = kube.get_claim(env.tenant, "a")["status"]
    assert (status.get("migration") or {}).get("migrationUID") == under_way.uid, status
    assert under_way.found()["metadata"]["uid"] == real["metadata"]["uid"]
