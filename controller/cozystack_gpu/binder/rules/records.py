"""Usage records: one Workload per ordered Bound or Attached claim, owned by it, and one per
booked reservation, owned by it (SPEC §7, §11). Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import Phase
from cozystack_gpu.model import ReservationPhase
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.translate import (
    is_template_claim,
    meta,
    name_of,
    namespace_of,
    reservation_info,
    rfc3339,
    window_reservation_uid,
)

# --- What a record is made for -----------------------------------------------------------

# A reservation's record runs from Booked to its window's end or its deletion. Lost keeps it:
# the booking stands (the window is still owed to the tenant, and the binder books it again,
# first, as soon as a node has room), so its record must not end and begin again with each
# move; while Lost it says it is not operational, as no node holds the window.
RECORDED_WINDOW_PHASES = frozenset(
    {ReservationPhase.BOOKED, ReservationPhase.ACTIVE, ReservationPhase.LOST}
)
# The annotations a reservation's record carries (keys.ANNOTATION_RECORD_*), judged on every
# record: none else of a record's annotations is the controller's.
RECORD_ANNOTATIONS = (
    keys.ANNOTATION_RECORD_START,
    keys.ANNOTATION_RECORD_END,
    keys.ANNOTATION_RECORD_NODE,
)


def _always(_owner: Obj) -> bool:
    return True


def _no_annotations(_owner: Obj) -> dict[str, str]:
    return {}


def _window_booked(reservation: Obj) -> bool:
    info = reservation_info(reservation)
    return info is not None and info.phase is not ReservationPhase.LOST


def _window_annotations(reservation: Obj) -> dict[str, str]:
    """The window (RFC 3339) and, while booked on one, the node: the Workload's status has
    no field for them (Cozystack's CRD prunes any other), so they ride on its metadata."""
    info = reservation_info(reservation)
    if info is None:
        return {}
    found = {
        keys.ANNOTATION_RECORD_START: rfc3339(info.start),
        keys.ANNOTATION_RECORD_END: rfc3339(info.end),
    }
    if info.node and info.phase in (ReservationPhase.BOOKED, ReservationPhase.ACTIVE):
        found[keys.ANNOTATION_RECORD_NODE] = info.node
    return found


@dataclass(frozen=True)
class RecordKind:
    """What a kind of owner's record says: who owns it (ownerReference kind), its name's
    prefix, the status kind and type billing reads, whether it is operational, and the
    annotations it carries. Class and count are ``status.resources`` for every kind."""

    owner: str
    prefix: str
    status_kind: str
    status_type: str
    operational: Callable[[Obj], bool] = _always
    annotations: Callable[[Obj], dict[str, str]] = _no_annotations


CLAIM = RecordKind(
    keys.KIND_CLAIM, "gpuclaim-", keys.WORKLOAD_STATUS_KIND, keys.WORKLOAD_STATUS_TYPE
)
RESERVATION = RecordKind(
    keys.KIND_RESERVATION,
    "gpureservation-",
    keys.WORKLOAD_RESERVATION_STATUS_KIND,
    keys.WORKLOAD_RESERVATION_STATUS_TYPE,
    operational=_window_booked,
    annotations=_window_annotations,
)
OWNER_KINDS = frozenset({CLAIM.owner, RESERVATION.owner})

# --- Usage records -----------------------------------------------------------------------


# Every usage record the controller makes is named with its kind's prefix: the name is the
# owner's (``gpuclaim-<claim>``, ``gpureservation-<reservation>``) when that fits and is
# free, else the owner's uid's. A record is its owner's by its owner reference's uid, never
# by its name; a Workload of these prefixes that no owner wanting a record owns is removed,
# whoever made it.
RECORD_PREFIX = CLAIM.prefix
MAX_NAME = 253


def workload_name(owner_name: str, kind: RecordKind = CLAIM) -> str:
    """The record's name for an owner, readable; may be too long (then ``uid_workload_name``)."""
    return kind.prefix + owner_name


def uid_workload_name(owner_uid: str, kind: RecordKind = CLAIM) -> str:
    """The record's name when the readable one is too long or taken: always valid (a uid)."""
    return kind.prefix + owner_uid


def wants_usage_record(claim_obj: Obj, windows: Mapping[str, Obj] | None = None) -> bool:
    """One record per ordered claim while it is Bound or Attached; template claims, and
    Pending or Lost ones, have none. Nor has a window claim while its reservation (among
    ``windows``, by uid) has a record: a window is billed once, from the reservation."""
    if is_template_claim(claim_obj) or billed_as_window(claim_obj, windows or {}):
        return False
    phase = (claim_obj.get("status") or {}).get("phase")
    return phase in (Phase.BOUND.value, Phase.ATTACHED.value)


def billed_as_window(claim_obj: Obj, windows: Mapping[str, Obj]) -> bool:
    """A window claim (``translate.is_window_claim``) whose reservation has a record of its
    own, for the same class and count: the units it holds are the window's. A claim that only
    says so (the label and owner on another class or count) is billed as an order."""
    uid = window_reservation_uid(claim_obj)
    reservation = windows.get(uid) if uid else None
    if reservation is None:
        return False
    mine, its = claim_obj.get("spec") or {}, reservation.get("spec") or {}
    return bool(
        str(mine.get("class")) == str(its.get("class"))
        and int(mine.get("count") or 1) == int(its.get("count") or 1)
    )


def wants_reservation_record(reservation_obj: Obj, now: float) -> bool:
    """One record per reservation from Booked until its window's end or its deletion
    (``RECORDED_WINDOW_PHASES`` says why Lost keeps it); Pending and Ended ones have none,
    nor one whose window has ended, whatever its status says."""
    info = reservation_info(reservation_obj)
    return info is not None and info.phase in RECORDED_WINDOW_PHASES and now < info.end


def record_owners(
    claims: Iterable[Obj], reservations: Iterable[Obj], now: float
) -> tuple[list[Obj], list[Obj]]:
    """The claims and the reservations that want a record of their own at ``now``."""
    windows = {
        str(meta(r).get("uid") or ""): r for r in reservations if wants_reservation_record(r, now)
    }
    return [c for c in claims if wants_usage_record(c, windows)], list(windows.values())


def usage_record(
    owner_obj: Obj, name: str | None = None, kind: RecordKind = CLAIM
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name or workload_name(name_of(owner_obj), kind),
        "namespace": namespace_of(owner_obj),
        # Owned by the claim or reservation: the garbage collector removes it with its
        # owner, so no monitor or reserved label has to guard it.
        "ownerReferences": [
            {
                "apiVersion": keys.API_VERSION,
                "kind": kind.owner,
                "name": name_of(owner_obj),
                "uid": meta(owner_obj).get("uid"),
                "blockOwnerDeletion": False,
                "controller": True,
            }
        ],
    }
    annotations = kind.annotations(owner_obj)
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": keys.WORKLOAD_API_VERSION,
        "kind": keys.WORKLOAD_KIND,
        "metadata": metadata,
        "status": usage_status(owner_obj, kind),
    }


def usage_status(owner_obj: Obj, kind: RecordKind = CLAIM) -> dict[str, Any]:
    spec = owner_obj.get("spec") or {}
    return {
        "kind": kind.status_kind,
        "type": kind.status_type,
        "resources": {keys.quota_key(str(spec.get("class"))): str(int(spec.get("count") or 1))},
        "operational": kind.operational(owner_obj),
    }


def status_repair(workload: Obj, owner_obj: Obj, kind: RecordKind = CLAIM) -> dict[str, Any] | None:
    """The merge patch that writes a record's status back to what its owner says, or None
    when it already does. Billing reads the status, so one edited (by a hoster, another
    controller) or never written is repaired; the patch carries the resourceVersion read,
    so it never overwrites a change it has not seen, and removes keys that do not belong."""
    want = usage_status(owner_obj, kind)
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


def annotation_repair(
    workload: Obj, owner_obj: Obj, kind: RecordKind = CLAIM
) -> dict[str, Any] | None:
    """The merge patch that writes the controller's annotations of a record back to what its
    owner says (a reservation's window and node: the node changes when it moves or is Lost),
    or None when they already do; others' annotations are left alone. Over the
    resourceVersion read, as ``status_repair``."""
    want = kind.annotations(owner_obj)
    have = meta(workload).get("annotations") or {}
    changes = {key: want.get(key) for key in RECORD_ANNOTATIONS if have.get(key) != want.get(key)}
    if not changes:
        return None
    return {
        "metadata": {
            "resourceVersion": meta(workload).get("resourceVersion"),
            "annotations": changes,
        }
    }


def _owner_ref(workload: Obj, kinds: frozenset[str] = OWNER_KINDS) -> Mapping[str, Any] | None:
    for ref in meta(workload).get("ownerReferences") or []:
        if ref.get("kind") in kinds and ref.get("apiVersion") == keys.API_VERSION:
            return dict(ref)
    return None


def owned_claim_name(workload: Obj) -> str | None:
    ref = _owner_ref(workload, frozenset({CLAIM.owner}))
    return None if ref is None else str(ref.get("name"))


def owner_uid(workload: Obj) -> str | None:
    """The uid of the claim or reservation that owns the record: what makes it that one's."""
    ref = _owner_ref(workload)
    return None if ref is None or not ref.get("uid") else str(ref["uid"])


def is_usage_record(workload: Obj) -> bool:
    """A record of the controller's: owned by a claim or a reservation, or named with a
    record's prefix (one a tenant cut loose from its owner)."""
    name = name_of(workload)
    return _owner_ref(workload) is not None or any(
        name.startswith(kind.prefix) for kind in (CLAIM, RESERVATION)
    )


Key = tuple[str, str]


@dataclass(frozen=True)
class RecordPlan:
    """What the publisher writes for the records: each a call of its own."""

    create: tuple[dict[str, Any], ...] = ()
    repair: tuple[tuple[Key, dict[str, Any]], ...] = ()
    delete: tuple[Key, ...] = ()
    annotate: tuple[tuple[Key, dict[str, Any]], ...] = ()


def plan_records(
    claims: Iterable[Obj], workloads: Mapping[Key, Obj], reservations: Iterable[Obj] = ()
) -> RecordPlan:
    """One record of its own for each of ``claims`` and ``reservations`` (those that want
    one: ``record_owners``), and none else.

    An owner's record is the Workload whose owner reference carries the owner's uid: kept
    (its status and annotations written back if edited), and any second one removed. An
    owner with none gets one, named ``<prefix><name>`` when that is valid and free, else
    ``<prefix><uid>``. A record of the controller's (``is_usage_record``) that no such owner
    owns is removed: its owner ended, was deleted, or is another one of that name."""
    owned: dict[str, list[Key]] = {}
    for key, workload in workloads.items():
        uid = owner_uid(workload)
        if uid is not None:
            owned.setdefault(uid, []).append(key)
    create: list[dict[str, Any]] = []
    repair: list[tuple[Key, dict[str, Any]]] = []
    annotate: list[tuple[Key, dict[str, Any]]] = []
    kept: set[Key] = set()
    owners = [(CLAIM, c) for c in claims] + [(RESERVATION, r) for r in reservations]
    for kind, owner in owners:
        uid = str(meta(owner).get("uid") or "")
        namespace = namespace_of(owner)
        mine = sorted(k for k in owned.get(uid, []) if k[0] == namespace)
        if mine:
            readable = (namespace, workload_name(name_of(owner), kind))
            keep = readable if readable in mine else mine[0]
            kept.add(keep)
            patch = status_repair(workloads[keep], owner, kind)
            if patch is not None:
                repair.append((keep, patch))
            patch = annotation_repair(workloads[keep], owner, kind)
            if patch is not None:
                annotate.append((keep, patch))
            continue
        name = workload_name(name_of(owner), kind)
        if len(name) > MAX_NAME or (namespace, name) in workloads:
            name = uid_workload_name(uid, kind)
        if (namespace, name) in workloads:
            continue  # taken by one it does not own: removed below, made by a later pass
        kept.add((namespace, name))
        create.append(usage_record(owner, name, kind))
    delete = tuple(
        sorted(
            key
            for key, workload in workloads.items()
            if key not in kept and is_usage_record(workload)
        )
    )
    return RecordPlan(tuple(create), tuple(repair), delete, tuple(annotate))
