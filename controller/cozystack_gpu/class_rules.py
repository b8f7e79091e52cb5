# Copyright: Cozystack GPU authors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""GPUClass rules that the CRD's CEL cannot express, because they look at other objects.

CEL validates one object at a time. The rule that two classes may share a device-plugin
resource name only when their node selectors do not overlap needs every other class, so it
lives here, once, as pure functions: the controller's GPUClass admission webhook enforces it
for every write (``kubectl apply`` included), and the ``cozystack.gpu.gpu_class`` module
checks it before it writes, to report a conflict with its own diff. The controller package
owns this file (its image is built from ``controller/`` alone); the collection reaches it
through the file link ``plugins/module_utils/gpu_class_rules.py``. Standard library only,
no I/O, so it runs on the Pythons Ansible targets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RECENT_ADMISSION_S",
    "ResourceNameConflict",
    "recent_admissions",
    "resource_name_conflicts",
    "resource_name_of",
    "selectors_overlap",
    "with_admission",
]

# How long an admitted class is judged against before its create is sure to be stored (or
# refused by a later step): a webhook answers within its 10 s timeout, and the store follows.
RECENT_ADMISSION_S = 60.0


def selectors_overlap(a: Mapping[str, str] | None, b: Mapping[str, str] | None) -> bool:
    """True when some node could match both node selectors.

    A ``nodeSelector`` is a set of exact label matches, so two of them describe disjoint sets
    of nodes only when they require different values for one label key; an empty selector
    matches every node and therefore overlaps any other.
    """
    a = a or {}
    b = b or {}
    return all(b[key] == value for key, value in a.items() if key in b)


def resource_name_of(spec: Mapping[str, Any] | None) -> str | None:
    """The device-plugin resource name a GPUClass spec serves, or None when it has none."""
    if not spec:
        return None
    source = spec.get("source") or {}
    device_plugin = source.get("devicePlugin") or {}
    name = device_plugin.get("resourceName")
    return name if isinstance(name, str) and name else None


def dra_device_class_of(spec: Mapping[str, Any] | None) -> str | None:
    """The DeviceClass a ``dra`` class's devices come from, or None for another source."""
    dra = ((spec or {}).get("source") or {}).get("dra") or {}
    name = dra.get("deviceClassName") if isinstance(dra, Mapping) else None
    return name if isinstance(name, str) and name else None


@dataclass(frozen=True)
class ResourceNameConflict:
    """One other class that serves the same resource name on nodes this class also selects."""

    other: str
    resource_name: str

    def message(self, name: str) -> str:
        return (
            f"GPUClass {name}: resourceName {self.resource_name} is already served by "
            f"GPUClass {self.other} on overlapping nodes; two classes may share a "
            "resourceName only when their nodeSelectors do not overlap"
        )


def resource_name_conflicts(
    name: str,
    spec: Mapping[str, Any],
    others: Iterable[tuple[str, Mapping[str, Any]]],
) -> list[ResourceNameConflict]:
    """Classes among ``others`` whose resource name and node selector collide with ``spec``.

    ``others`` are ``(name, spec)`` pairs of the existing classes; an entry named ``name`` is
    the class itself (its previous version) and is skipped. The result is sorted by class
    name so callers report conflicts deterministically.
    """
    resource_name = resource_name_of(spec)
    if resource_name is None:
        return []
    selector = spec.get("nodeSelector") or {}
    conflicts = [
        ResourceNameConflict(other=other_name, resource_name=resource_name)
        for other_name, other_spec in others
        if other_name != name
        and resource_name_of(other_spec) == resource_name
        and selectors_overlap(selector, (other_spec or {}).get("nodeSelector") or {})
    ]
    return sorted(conflicts, key=lambda c: c.other)


def recent_admissions(
    record: Mapping[str, str], now: float, live: Iterable[str] = ()
) -> list[tuple[str, Mapping[str, Any]]]:
    """``(name, spec)`` of the classes admitted within ``RECENT_ADMISSION_S`` that a listing
    may not show yet (``record`` is the admissions ConfigMap's data; classes in ``live`` are
    judged by what is stored instead). Entries that cannot be read are ignored."""
    stored = set(live)
    found: list[tuple[str, Mapping[str, Any]]] = []
    for name, raw in sorted(record.items()):
        try:
            entry = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(entry, dict) or name in stored:
            continue
        at, spec = entry.get("at"), entry.get("spec")
        fresh = isinstance(at, (int, float)) and now - at < RECENT_ADMISSION_S
        if fresh and isinstance(spec, dict):
            found.append((name, spec))
    return found


def with_admission(
    record: Mapping[str, str], name: str, spec: Mapping[str, Any], now: float
) -> dict[str, str]:
    """The admissions data with ``name`` recorded at ``now``, entries too old to matter
    dropped."""
    kept = {}
    for other, raw in record.items():
        try:
            at = json.loads(raw).get("at")
        except (ValueError, AttributeError):
            continue
        if other != name and isinstance(at, (int, float)) and now - at < RECENT_ADMISSION_S:
            kept[other] = raw
    kept[name] = json.dumps({"at": now, "spec": dict(spec)}, sort_keys=True)
    return kept
