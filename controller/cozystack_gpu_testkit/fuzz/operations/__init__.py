"""The fuzz's operations, each a function of the stage and the run that returns what it did
(its arguments as the journal shows them), what came of it, and the names it touched; one
module per thing they touch: ``claims``, ``reservations``, ``vms``, ``pods`` (a tenant's
own), ``nodes``, ``controller``. ``OPERATIONS`` names each as ``FuzzSettings.weights`` does."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.operations import (
    claims,
    controller,
    nodes,
    pods,
    reservations,
    vms,
)
from cozystack_gpu_testkit.fuzz.stage import Stage

# (arguments, outcome, names touched)
Operation = Callable[[Stage, Run], tuple[str, str, set[str]]]

OPERATIONS: Mapping[str, Operation] = {
    "order": claims.order,
    "delete_claim": claims.delete_claim,
    "strip_finalizers": claims.strip_finalizers,
    "cut_owner": claims.cut_owner,
    "squat_template": claims.squat_template,
    "create_vm": vms.create_vm,
    "odd_vm": vms.odd_vm,
    "nad_vm": vms.nad_vm,
    "stop_vm": vms.stop_vm,
    "start_vm": vms.start_vm,
    "restart_vm": vms.restart_vm,
    "delete_vmi": vms.delete_vmi,
    "delete_vm": vms.delete_vm,
    "forged_pod": pods.forged_pod,
    "ungate_pod": pods.ungate_pod,
    "preempting_vm": vms.preempting_vm,
    "huge_annotation_vm": vms.huge_annotation_vm,
    "odd_name_order": claims.odd_name_order,
    "orphan_record": claims.orphan_record,
    "node_not_ready": nodes.node_not_ready,
    "node_cordon": nodes.node_cordon,
    "node_memory_short": nodes.node_memory_short,
    "node_gpu_short": nodes.node_gpu_short,
    "node_restore": nodes.node_restore,
    "kill_leader": controller.kill_leader,
    "book": reservations.book,
    "cancel_booking": reservations.cancel_booking,
    "migrate_vm": vms.migrate_vm,
    "cancel_migration": vms.cancel_migration,
}
