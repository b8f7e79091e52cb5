"""Status conditions as every writer here builds and merges them (the binder on claims,
classes and GPUNodes, the licence copier on licensed classes). Pure: the time comes in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from cozystack_gpu.objects.translate import rfc3339


def condition(type_: str, status: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    return {
        "type": type_,
        "status": "True" if status else "False",
        # Plain text on the wire: str() of a (str, Enum) member is "Class.MEMBER".
        "reason": reason.value if isinstance(reason, Enum) else reason,
        "message": message[:32768],
        "lastTransitionTime": rfc3339(now),
    }


def merge_conditions(
    current: Iterable[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Replace the condition of ``new``'s type, keeping its transition time when the status
    did not change, and every other writer's conditions as they are."""
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in current:
        if cond.get("type") == new["type"]:
            merged = dict(new)
            if cond.get("status") == new["status"]:
                merged["lastTransitionTime"] = cond.get(
                    "lastTransitionTime", new["lastTransitionTime"]
                )
            out.append(merged)
            replaced = True
        else:
            out.append(dict(cond))
    if not replaced:
        out.append(dict(new))
    return out


def same_condition(current: Iterable[Mapping[str, Any]], new: Mapping[str, Any]) -> bool:
    """True when writing ``new`` would change nothing a reader sees."""
    for cond in current:
        if cond.get("type") == new["type"]:
            return all(cond.get(k) == new[k] for k in ("status", "reason", "message"))
    return False
