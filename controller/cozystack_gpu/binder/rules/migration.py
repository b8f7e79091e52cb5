"""What the binder reads of a live migration and writes on its claims (SPEC §12). Pure.

KubeVirt's virt-controller makes the target pod of a ``VirtualMachineInstanceMigration``
(labelled ``kubevirt.io/migrationJobUID``); virt-handler writes the VMI's
``status.migrationState`` (``migrationUid``, ``targetNode``, ``completed``, ``failed``) and,
once the VM runs on the target, ``status.nodeName``. The binder records the target it
placed on each claim of the set (``status.migration``), and reads the outcome here.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.binder.rules.claim_status import condition_patch
from cozystack_gpu.keys import ClaimReason
from cozystack_gpu.model import MigrationTarget
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition, merge_conditions
from cozystack_gpu.objects.translate import meta, rfc3339, timestamp


class Outcome(Enum):
    RUNNING = "running"  # still on its way: the target keeps its units
    LANDED = "landed"  # the VM runs on the target: the claims move there
    ENDED = "ended"  # failed, cancelled, its target pod or its VMI gone: the target goes


def record_patch(claim: Obj, target: MigrationTarget) -> dict[str, Any]:
    """The target placed for a migration, on one claim of the set, over the version read,
    and the Migration condition that says so."""
    words = (
        f"live migration {target.uid}: the target's units are held on node {target.node} "
        "until the VM lands there or the migration ends"
    )
    told = condition(
        keys.CONDITION_MIGRATION, True, ClaimReason.MIGRATION_TARGET_PLACED, words, target.since
    )
    current = (claim.get("status") or {}).get("conditions") or []
    return {
        "metadata": {"resourceVersion": meta(claim).get("resourceVersion")},
        "status": {
            "migration": {
                "node": target.node,
                "migrationUID": target.uid,
                "since": rfc3339(target.since),
            },
            "conditions": merge_conditions(current, told),
        },
    }


def not_placed_patch(claim: Obj, words: str, now: float) -> dict[str, Any]:
    """Why the target of the VM's migration waits (``not_placed_words``), on a claim."""
    told = condition(
        keys.CONDITION_MIGRATION, False, ClaimReason.MIGRATION_TARGET_NOT_PLACED, words, now
    )
    return condition_patch(claim, told)


def told_ended(
    body: dict[str, Any], claim: Obj, target: MigrationTarget, landed: bool, now: float
) -> None:
    """The Migration condition of a status write that moves the claim to its target
    (``landed``) or clears the target, merged into ``body``."""
    if landed:
        reason, words = ClaimReason.MIGRATION_LANDED, f"live migration {target.uid} landed"
    else:
        reason = ClaimReason.MIGRATION_ENDED
        words = (
            f"live migration {target.uid} ended before the VM landed on node {target.node} "
            "(failed, cancelled, or its target pod or node went): the target's units are free"
        )
    told = condition(keys.CONDITION_MIGRATION, False, reason, words, now)
    status = body["status"]
    current = status.get("conditions", (claim.get("status") or {}).get("conditions") or [])
    status["conditions"] = merge_conditions(current, told)


def outcome(
    target: MigrationTarget, vmi: Obj | None, target_pod_live: bool, source: str | None
) -> Outcome:
    """Where the migration the claim records stands, from its VMI (as virt-handler writes
    it) and whether its target pod is still there.

    - the VMI gone or final: ended (its claims detach as at any VM's end);
    - the VMI on the target node: landed (virt-handler moves ``nodeName`` once it runs
      there), whatever the target pod does next;
    - ``migrationState`` of this migration failed, or of one started after this one's
      target was placed: ended;
    - its target pod gone or final while the VMI is still on ``source``: ended;
    - else running.
    """
    if vmi is None:
        return Outcome.ENDED
    status = vmi.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return Outcome.ENDED
    if status.get("nodeName") == target.node:
        return Outcome.LANDED
    state = status.get("migrationState") or {}
    uid = state.get("migrationUid")
    if uid == target.uid and state.get("failed"):
        return Outcome.ENDED
    started = timestamp(state.get("startTimestamp"))
    if uid and uid != target.uid and started is not None and started > target.since:
        return Outcome.ENDED  # a later migration has started: this one is over
    # (An earlier migration's state, still on the VMI, says nothing of this one.)
    if not target_pod_live and status.get("nodeName") == source:
        return Outcome.ENDED
    return Outcome.RUNNING


# The phases of a VirtualMachineInstanceMigration before virt-controller's target pod runs:
# the binder may place the target then, ahead of the pod.
BEFORE_TARGET_POD = ("", "Pending", "Scheduling")


def ahead(job: Obj, vmi: Obj) -> bool:
    """Whether the target of migration ``job`` may be placed before its pod is seen: the
    migration has not got past scheduling its target pod (later, the pod is there and
    placed; once it lands, the claims are on the target and must not be placed again),
    and its VMI runs and is one KubeVirt calls migratable (virt-controller makes no target
    pod for another)."""
    if str((job.get("status") or {}).get("phase") or "") not in BEFORE_TARGET_POD:
        return False
    status = vmi.get("status") or {}
    migratable = any(
        c.get("type") == "LiveMigratable" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return status.get("phase") == "Running" and migratable


def not_placed_words(vmi: str, refusal: str) -> str:
    return (
        f"the live migration of VMI {vmi} waits: {refusal}. Its target pod stays gated, and "
        "KubeVirt fails the migration at its own timeout; the VM keeps running where it is"
    )
