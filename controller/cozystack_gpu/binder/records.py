"""Usage records: one Workload per ordered Bound or Attached claim, owned by it. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import meta, name_of, namespace_of

# --- Usage records -----------------------------------------------------------------------


def workload_name(claim_name: str) -> str:
    return ("gpuclaim-" + claim_name)[:253]


def wants_usage_record(claim_obj: Obj) -> bool:
    """One record per ordered claim while it is Bound or Attached; template claims, and
    Pending or Lost ones, have none."""
    labels = meta(claim_obj).get("labels") or {}
    if labels.get(keys.LABEL_TEMPLATE_CLAIM) == keys.LABEL_TEMPLATE_CLAIM_VALUE:
        return False
    phase = (claim_obj.get("status") or {}).get("phase")
    return phase in (Phase.BOUND.value, Phase.ATTACHED.value)


def usage_record(claim_obj: Obj) -> dict[str, Any]:
    return {
        "apiVersion": keys.WORKLOAD_API_VERSION,
        "kind": keys.WORKLOAD_KIND,
        "metadata": {
            "name": workload_name(name_of(claim_obj)),
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


def owned_claim_name(workload: Obj) -> str | None:
    for ref in meta(workload).get("ownerReferences") or []:
        if ref.get("kind") == keys.KIND_CLAIM and ref.get("apiVersion") == keys.API_VERSION:
            return str(ref.get("name"))
    return None
