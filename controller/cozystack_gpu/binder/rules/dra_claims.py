"""What a claim of a ``dra`` class needs of its ResourceClaim next (SPEC §13). Pure.

The controller makes one ResourceClaim per claim, of the claim's name, owned by it
(``objects.dra.resource_claim_for``), once the claim holds units on a node; kube-scheduler
allocates it on that node at the VM's first start (the launcher pod is pinned there). The
controller then puts the claim itself in its ``reservedFor`` (the API takes no entry before
an allocation), so the allocation stays while the VM is stopped and no pod uses it.

- A claim held on a node with no ResourceClaim: create it.
- Allocated on the claim's node and not reserved for the claim: reserve it.
- Allocated elsewhere (the claim moved or was bound again after its node went), or the
  claim no longer held: let the allocation go, once no pod uses it: the claim's entry out
  of ``reservedFor`` first (the allocation is kept while any consumer is listed), then the
  ResourceClaim deleted (once: one being deleted is waited for); the next look makes a new
  one where the claim is held.
- A claim being deleted, or gone: its entry out of ``reservedFor``, so the garbage
  collector's deletion of the ResourceClaim (it is owned by the claim) is not held back.
- A ResourceClaim of the claim's name the controller did not make for it: never touched;
  the claim cannot start on it (``NAME_TAKEN``, told on the claim).
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.objects import Obj, dra
from cozystack_gpu.objects.translate import meta

HELD = (Phase.BOUND.value, Phase.ATTACHED.value)


class Step(Enum):
    NONE = "none"
    CREATE = "create"
    RESERVE = "reserve"
    RELEASE = "release"  # the claim's reservedFor entry taken out
    DELETE = "delete"
    NAME_TAKEN = "name-taken"


def allocated_node(resource_claim: Obj) -> str | None:
    """The node a ResourceClaim is allocated on (the one ``metadata.name`` its allocation's
    node selector names, as kube-scheduler writes it for node-local devices); "" for an
    allocation not tied to one node; None when it is not allocated."""
    allocation = (resource_claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    terms = (allocation.get("nodeSelector") or {}).get("nodeSelectorTerms") or []
    for term in terms:
        for field in term.get("matchFields") or []:
            values = field.get("values") or []
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and values:
                return str(values[0])
    return ""


def pods_reserved(resource_claim: Obj) -> bool:
    """Whether a pod is among the ResourceClaim's consumers (a VM uses its devices)."""
    return any(
        entry.get("resource") == "pods" and not entry.get("apiGroup")
        for entry in (resource_claim.get("status") or {}).get("reservedFor") or ()
    )


def next_step(claim: Obj | None, source: dra.DraSource | None, resource_claim: Obj | None) -> Step:
    """What the claim's ResourceClaim needs next (``Step``), from the claim, its class's
    ``dra`` source (None for a claim of another source) and the ResourceClaim of its name."""
    if claim is None:
        return Step.RELEASE if resource_claim and _reserved_for_gone(resource_claim) else Step.NONE
    if source is None:
        return Step.NONE
    ours = resource_claim is not None and dra.made_for(resource_claim, claim)
    if resource_claim is not None and not ours:
        return Step.NONE if meta(claim).get("deletionTimestamp") else Step.NAME_TAKEN
    reserved = resource_claim is not None and dra.is_reserved_for(resource_claim, claim)
    if meta(claim).get("deletionTimestamp"):
        return Step.RELEASE if reserved else Step.NONE
    status: dict[str, Any] = claim.get("status") or {}
    held = str(status.get("nodeName") or "") if status.get("phase") in HELD else ""
    if resource_claim is None:
        return Step.CREATE if held else Step.NONE
    node = allocated_node(resource_claim)
    if node is None:
        return Step.NONE  # the VM's first start on the claim's node allocates it
    if held and node == held:
        return Step.NONE if reserved else Step.RESERVE
    if pods_reserved(resource_claim):
        return Step.NONE  # a VM still runs on it: let go once it has stopped
    if reserved:
        return Step.RELEASE
    # Deleted already, its finalizer held until kube-controller-manager lets the allocation
    # go: asked again, the delete would be sent on every look until it is gone.
    return Step.NONE if meta(resource_claim).get("deletionTimestamp") else Step.DELETE


def _owners_entry(resource_claim: Obj) -> dict[str, str] | None:
    """The ``reservedFor`` entry of the claim the ResourceClaim was made for, if listed."""
    uid = dra.controller_claim_uid(resource_claim)
    for entry in (resource_claim.get("status") or {}).get("reservedFor") or ():
        if uid and entry.get("apiGroup") == keys.GROUP and entry.get("uid") == uid:
            return {k: str(v) for k, v in entry.items()}
    return None


def _reserved_for_gone(resource_claim: Obj) -> bool:
    """A ResourceClaim the controller made for a claim that is gone, still reserved for it."""
    return _owners_entry(resource_claim) is not None


def reserved_for_with(resource_claim: Obj, claim: Obj | None, listed: bool) -> list[dict[str, Any]]:
    """The ResourceClaim's ``reservedFor`` with the claim's entry in (``listed``) or out
    (with no ``claim``: the entry of the claim it was made for), the other consumers as
    they are."""
    entry = dra.reserved_for_entry(claim) if claim is not None else _owners_entry(resource_claim)
    others = [
        dict(e)
        for e in (resource_claim.get("status") or {}).get("reservedFor") or ()
        if entry is None or {k: str(e.get(k) or "") for k in entry} != entry
    ]
    return [*others, entry] if listed and entry is not None else others
