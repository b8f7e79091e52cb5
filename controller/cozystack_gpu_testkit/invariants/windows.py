"""The invariants' reading of reservations (SPEC §11) and of what claims hold over time:
a Booked window holds its units on its node over its window, an Active window's claim until
the window's end, a live migration's target on the target node (SPEC §12), and Booked and
Lost windows count under their budgets; each window has a usage record until its end."""

from __future__ import annotations

from collections.abc import Callable

from cozystack_gpu import keys
from cozystack_gpu.objects import MutableObj
from cozystack_gpu_testkit.invariants.reading import (
    FINAL_VMI,
    HOLDING,
    _count,
    _epoch,
    _name,
    _namespace,
    _owner_ref,
    _resource_name,
)
from cozystack_gpu_testkit.invariants.state import State, _meta

WINDOW_HOLDING = ("Booked",)  # on their node (Active: its claim holds them)
WINDOW_COUNTING = ("Booked", "Lost")  # under their budgets
WINDOW_RECORDED = ("Booked", "Active", "Lost")  # each with a usage record until its end


def _billed_window(claim: MutableObj, windows: dict[str, MutableObj]) -> bool:
    """The claim a window makes (labelled with its reservation's name, its own, and owned
    by it) while that reservation, of the same class and count, has a record."""
    name = _name(claim)
    if (_meta(claim).get("labels") or {}).get(keys.LABEL_RESERVATION) != name:
        return False
    for ref in _meta(claim).get("ownerReferences") or []:
        reservation = windows.get(str(ref.get("uid")))
        if ref.get("kind") == keys.KIND_RESERVATION and reservation and ref.get("name") == name:
            spec, its = claim.get("spec") or {}, reservation.get("spec") or {}
            return bool(
                spec.get("class") == its.get("class") and _count(claim) == _count(reservation)
            )
    return False


def _window(reservation: MutableObj) -> tuple[float, float] | None:
    spec = reservation.get("spec") or {}
    start, end = _epoch(spec.get("start")), _epoch(spec.get("end"))
    return None if start is None or end is None else (start, end)


def _peak(windows: list[tuple[float, float, int]], now: float) -> int:
    """The most units ``windows`` (start, end, units) hold at any moment from ``now`` on."""
    moments = [now, *(start for start, _end, _units in windows if start > now)]
    return max(sum(u for s, e, u in windows if s <= t < e) for t in moments)


def _claim_holds(
    state: State,
    resource_of: dict[str, str],
    add: Callable[..., None],
    holders: dict[tuple[str, str], list[str]],
    release_grace_s: float = 0.0,
) -> dict[tuple[str, str], list[tuple[float, float, int]]]:
    """What claims hold, given to ``add``: a Bound or Attached claim on its node, a Lost one
    while its VMI runs there, and a live migration's target on the target node (SPEC §12).
    The claim an Active window made holds its units until the window's end, not for good
    (a window booked on the node after that end may count on them, SPEC §11): those are
    returned as windows, per node and resource name. A window that ended less than
    ``release_grace_s`` ago has its claim's release due: it holds nothing."""
    running = {
        (_namespace(v), _name(v)): (v.get("status") or {}).get("nodeName")
        for v in state.vmis
        if (v.get("status") or {}).get("phase") not in FINAL_VMI
    }
    open_windows = _open_windows(state, release_grace_s)
    window_claims: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for claim in state.claims:
        status = claim.get("status") or {}
        node, phase = status.get("nodeName"), status.get("phase")
        resource = resource_of.get(str((claim.get("spec") or {}).get("class")))
        if not node or not resource:
            continue
        vmi_there = running.get((_namespace(claim), str(status.get("attachedTo")))) == node
        if not (phase in HOLDING or (phase == "Lost" and vmi_there)):
            continue
        who = f"claim {_namespace(claim)}/{_name(claim)} {phase} {status.get('attachedTo')}"
        target = (status.get("migration") or {}).get("node")
        if target and target != node:
            add(str(target), resource, _count(claim), f"{who} migration target", None)
        end = open_windows.get(_owner_uid(claim, keys.KIND_RESERVATION) or "")
        if end is not None and phase in HOLDING:
            window_claims.setdefault((str(node), resource), []).append(
                (state.read_at, end, _count(claim))
            )
            holders.setdefault((str(node), resource), []).append(f"{who} until its end")
            continue
        add(str(node), resource, _count(claim), who, _epoch(status.get("boundAt")))
    return window_claims


def _open_windows(state: State, release_grace_s: float = 0.0) -> dict[str, float]:
    """Active reservations whose window has not ended, by uid: the end of each. With
    ``release_grace_s``, also those (Active or Ended) whose window ended less than that
    ago: their claim's release is the leader's next write, and it holds nothing from now."""
    ends: dict[str, float] = {}
    for reservation in state.reservations:
        window = _window(reservation)
        phase = (reservation.get("status") or {}).get("phase")
        if window is None:
            continue
        open_now = phase == "Active" and window[1] > state.read_at
        release_due = phase in ("Active", "Ended") and state.read_at < window[1] + release_grace_s
        if open_now or release_due:
            ends[str(_meta(reservation).get("uid"))] = window[1]
    return ends


def _owner_uid(obj: MutableObj, kind: str) -> str | None:
    owner = _owner_ref(obj, kind)
    return str(owner.get("uid")) if owner is not None else None


def _windows(
    state: State,
    resource_of: dict[str, str],
    window_claims: dict[tuple[str, str], list[tuple[float, float, int]]],
) -> dict[tuple[str, str], tuple[int, str, float | None]]:
    """Per node and resource name: the units its Booked windows, and the claims Active
    windows made (until their end), hold at their busiest moment from now on, who the
    windows are, and the latest bookedAt among them."""
    rows: dict[tuple[str, str], list[tuple[float, float, int]]] = {
        key: list(claims) for key, claims in window_claims.items()
    }
    names: dict[tuple[str, str], list[str]] = {}
    latest: dict[tuple[str, str], float] = {}
    for reservation in state.reservations:
        status = reservation.get("status") or {}
        node = status.get("nodeName")
        resource = resource_of.get(str((reservation.get("spec") or {}).get("class")))
        window = _window(reservation)
        if status.get("phase") not in WINDOW_HOLDING or not node or not resource or not window:
            continue
        if window[1] <= state.read_at:
            continue  # ended: it holds nothing
        key = (str(node), resource)
        rows.setdefault(key, []).append((*window, _count(reservation)))
        names.setdefault(key, []).append(f"window {_namespace(reservation)}/{_name(reservation)}")
        booked = _epoch(status.get("bookedAt")) or float("inf")
        latest[key] = max(latest.get(key, 0.0), booked)
    return {
        key: (_peak(windows, state.read_at), ", ".join(names.get(key, [])), latest.get(key))
        for key, windows in rows.items()
    }


def _booked_budgets(
    state: State,
    ancestors: dict[str, frozenset[str]],
    resource_of: dict[str, str],
    window_claims: list[tuple[MutableObj, float]],
) -> dict[tuple[str, str], int]:
    """Per tenant and budget key: the units windows below it count at their busiest moment
    from now on: Booked and Lost windows over their window, and the claims Active windows
    made (``window_claims``, each with its window's end) from now to that end."""
    rows: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    held = [(obj, (state.read_at, end)) for obj, end in window_claims]
    for reservation in state.reservations:
        status = reservation.get("status") or {}
        window = _window(reservation)
        if status.get("phase") not in WINDOW_COUNTING or not window or window[1] <= state.read_at:
            continue
        held.append((reservation, window))
    for obj, window in held:
        class_name = str((obj.get("spec") or {}).get("class"))
        charged = [keys.QUOTA_KEY_TOTAL, keys.quota_key(class_name)]
        resource = resource_of.get(class_name, "")
        if _resource_name(resource):
            charged += keys.raw_quota_keys(resource)
        namespace = _namespace(obj)
        for tenant in ancestors.get(namespace, frozenset({namespace})):
            for key in charged:
                rows.setdefault((tenant, key), []).append((*window, _count(obj)))
    return {key: _peak(windows, state.read_at) for key, windows in rows.items()}
