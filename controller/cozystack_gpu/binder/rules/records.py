"""Usage records: one Workload per ordered Bound or Attached claim, owned by it. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta, name_of, namespace_of

# --- Usage records -----------------------------------------------------------------------


# Every usage record the controller makes is named with this prefix: the name is the
# claim's (``gpuclaim-<claim>``) when that fits and is free, else the claim's uid's. A record
# is its claim's by its owner reference's uid, never by its name; a Workload of this prefix
# that no Bound or Attached order owns is removed, whoever made it.
RECORD_PREFIX = "gpuclaim-"
MAX_NAME = 253


def workload_name(claim_name: str) -> str:
    """The record's name for a claim, readable; may be too long (then ``uid_workload_name``)."""
    return RECORD_PREFIX + claim_name


def uid_workload_name(claim_uid: str) -> str:
    """The record's name when the readable one is too long or taken: always valid (a uid)."""
    return RECORD_PREFIX + claim_uid


def wants_usage_record(claim_obj: Obj) -> bool:
    """One record per ordered claim while it is Bound or Attached; template claims, and
    Pending or Lost ones, have none."""
    labels = meta(claim_obj).get("labels") or {}
    if labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE:
        return False
    phase = (claim_obj.get("status") or {}).get("phase")
    return phase in (Phase.BOUND.value, Phase.ATTACHED.value)


def usage_record(claim_obj: Obj, name: str | None = None) -> dict[str, Any]:
    return {
        "apiVersion": keys.WORKLOAD_API_VERSION,
        "kind": keys.WORKLOAD_KIND,
        "metadata": {
            "name": name or workload_name(name_of(claim_obj)),
            "namespace": namespace_of(claim_obj),
            # Owned by the claim: the garbage collector removes it with the claim, so no
            # monitor or reserved label has to guard it.
            "ownerReferences": [
                {
                    "apiVersion": keys.API_VERSION,
                    "kind": keys.KIND_CLAIM,
                    "name": name_of(claim_obj),
                    "uid": meta(claim_obj).get("uid"),
                    "blockOwnerDeletion": False,
                    "controller": True,
                }
            ],
        },
        "status": usage_status(claim_obj),
    }


def usage_status(claim_obj: Obj) -> dict[str, Any]:
    spec = claim_obj.get("spec") or {}
    return {
        "kind": keys.WORKLOAD_STATUS_KIND,
        "type": keys.WORKLOAD_STATUS_TYPE,
        "resources": {keys.quota_key(str(spec.get("class"))): str(int(spec.get("count") or 1))},
        "operational": True,
    }


def status_repair(workload: Obj, claim_obj: Obj) -> dict[str, Any] | None:
    """The merge patch that writes a record's status back to what its claim says, or None
    when it already does. Billing reads the status, so one edited (by a hoster, another
    controller) or never written is repaired; the patch carries the resourceVersion read,
    so it never overwrites a change it has not seen, and removes keys that do not belong."""
    want = usage_status(claim_obj)
    have = workload.get("status")
    if have == want:
        return None
    patch = dict(want)
    if isinstance(have, Mapping):
        for key in have:
            if key not in want:
                patch[key] = None
        resources = have.get("resources")
        if isinstance(resources, Mapping):
            patch["resources"] = {
                **{key: None for key in resources if key not in want["resources"]},
                **want["resources"],
            }
    return {
        "metadata": {"resourceVersion": meta(workload).get("resourceVersion")},
        "status": patch,
    }


def _claim_ref(workload: Obj) -> Mapping[str, Any] | None:
    for ref in meta(workload).get("ownerReferences") or []:
        if ref.get("kind") == keys.KIND_CLAIM and ref.get("apiVersion") == keys.API_VERSION:
            return dict(ref)
    return None


def owned_claim_name(workload: Obj) -> str | None:
    ref = _claim_ref(workload)
    return None if ref is None else str(ref.get("name"))


def owner_uid(workload: Obj) -> str | None:
    """The uid of the claim that owns the record: what makes it that claim's."""
    ref = _claim_ref(workload)
    return None if ref is None or not ref.get("uid") else str(ref["uid"])


def is_usage_record(workload: Obj) -> bool:
    """A record of the controller's: owned by a claim, or named with its prefix (one a
    tenant cut loose from its claim)."""
    return _claim_ref(workload) is not None or name_of(workload).startswith(RECORD_PREFIX)


Key = tuple[str, str]


@dataclass(frozen=True)
class RecordPlan:
    """What the publisher writes for the records: each a call of its own."""

    create: tuple[dict[str, Any], ...] = ()
    repair: tuple[tuple[Key, dict[str, Any]], ...] = ()
    delete: tuple[Key, ...] = ()


def plan_records(claims: Iterable[Obj], workloads: Mapping[Key, Obj]) -> RecordPlan:
    """One record of its own for each of ``claims`` (those that want one), and none else.

    A claim's record is the Workload whose owner reference carries the claim's uid: kept
    (its status written back if edited), and any second one removed. A claim with none gets
    one, named ``gpuclaim-<claim>`` when that is valid and free, else ``gpuclaim-<uid>``. A
    record of the controller's (``is_usage_record``) that no such claim owns is removed:
    its claim ended, was deleted, or is another claim of that name."""
    owned: dict[str, list[Key]] = {}
    for key, workload in workloads.items():
        uid = owner_uid(workload)
        if uid is not None:
            owned.setdefault(uid, []).append(key)
    create: list[dict[str, Any]] = []
    repair: list[tuple[Key, dict[str, Any]]] = []
    kept: set[Key] = set()
    for claim in claims:
        uid = str(meta(claim).get("uid") or "")
        namespace = namespace_of(claim)
        mine = sorted(k for k in owned.get(uid, []) if k[0] == namespace)
        if mine:
            readable = (namespace, workload_name(name_of(claim)))
            keep = readable if readable in mine else mine[0]
            kept.add(keep)
            patch = status_repair(workloads[keep], claim)
            if patch is not None:
                repair.append((keep, patch))
            continue
        name = workload_name(name_of(claim))
        if len(name) > MAX_NAME or (namespace, name) in workloads:
            name = uid_workload_name(uid)
        if (namespace, name) in workloads:
            continue  # taken by one it does not own: removed below, made by a later pass
        kept.add((namespace, name))
        create.append(usage_record(claim, name))
    delete = tuple(
        sorted(
            key
            for key, workload in workloads.items()
            if key not in kept and is_usage_record(workload)
        )
    )
    return RecordPlan(tuple(create), tuple(repair), delete)
