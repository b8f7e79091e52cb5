"""Where the hoster's licence token is copied, decided without I/O (SPEC.md §10).

The copier gathers the classes, the namespaces' labels, the token Secrets of the
controller's namespace and the copies it finds (every Secret carrying the managed label),
and these functions say what the copies should be and which writes get them there. No
kubernetes import: the property tests drive them with generated clusters.

A copy is wanted in a namespace entitled to vGPU for every vGPU class with ``license``
whose Secret holds the named key. A class being deleted keeps its copies: it still serves
the claims that hold its units, and their VMs must start licensed; they go with the class.
A Secret or key that is missing takes the copies away too: what the hoster withdrew is not
left behind in tenant namespaces.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys

Obj = Mapping[str, Any]
CopyKey = tuple[str, str]  # (namespace, name)
SECRET_TYPE = "Opaque"


@dataclass(frozen=True)
class License:
    """A class's ``spec.license``: where its token is and the guests' FeatureType."""

    class_name: str
    secret_name: str
    secret_key: str
    feature_type: int


@dataclass(frozen=True)
class Copy:
    """One wanted copy; ``data`` as the API carries it (base64 values)."""

    namespace: str
    name: str
    class_name: str
    data: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class CopyPlan:
    creates: tuple[Copy, ...]
    updates: tuple[Copy, ...]
    deletes: tuple[CopyKey, ...]

    def __bool__(self) -> bool:
        return bool(self.creates or self.updates or self.deletes)


def _meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def class_license(klass: Obj) -> License | None:
    """The licence of a vGPU class; None for a class without one and for passthrough (the
    CRD refuses it there; a class stored before the rule is not honoured either)."""
    spec = klass.get("spec") or {}
    lic = spec.get("license")
    if spec.get("mode") != keys.Mode.VGPU.value or not isinstance(lic, Mapping):
        return None
    ref = lic.get("secretRef") or {}
    name, key = ref.get("name"), ref.get("key")
    if not name or not key:
        return None
    feature = lic.get("featureType", keys.LICENSE_DEFAULT_FEATURE_TYPE)
    return License(str(_meta(klass).get("name", "")), str(name), str(key), int(feature))


def entitled(labels: Mapping[str, str] | None) -> bool:
    """The effective vGPU entitlement of a namespace (the same test as the model's)."""
    return (labels or {}).get(keys.LABEL_VGPU_ENTITLEMENT) == keys.VGPU_ENTITLEMENT_VALUE


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def desired_copies(
    classes: Iterable[Obj],
    namespaces: Mapping[str, Mapping[str, str]],
    sources: Mapping[str, Mapping[str, str]],
) -> dict[CopyKey, Copy]:
    """Every copy that should exist. ``namespaces`` maps a name to its labels, ``sources``
    a token Secret of the controller's namespace to its data (base64 values)."""
    wanted: dict[CopyKey, Copy] = {}
    targets = sorted(name for name, labels in namespaces.items() if entitled(labels))
    for klass in classes:
        lic = class_license(klass)
        if lic is None:
            continue
        token = (sources.get(lic.secret_name) or {}).get(lic.secret_key)
        if token is None:
            continue
        data = (
            (keys.LICENSE_FEATURE_TYPE_KEY, _b64(str(lic.feature_type))),
            (keys.LICENSE_TOKEN_KEY, str(token)),
        )
        name = keys.license_copy_name(lic.class_name)
        for namespace in targets:
            wanted[(namespace, name)] = Copy(namespace, name, lic.class_name, data)
    return wanted


def copy_labels(class_name: str) -> dict[str, str]:
    return {
        keys.LABEL_MANAGED_BY: keys.MANAGED_BY_CONTROLLER,
        keys.LABEL_LICENSE_CLASS: class_name,
    }


def copy_body(copy: Copy) -> dict[str, Any]:
    """The Secret a copy is written as."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": copy.name,
            "namespace": copy.namespace,
            "labels": copy_labels(copy.class_name),
        },
        "type": SECRET_TYPE,
        "data": dict(copy.data),
    }


def matches(copy: Copy, found: Obj) -> bool:
    """A copy found as it should be: its data, type and our labels (other labels or
    annotations someone adds are left alone)."""
    labels = _meta(found).get("labels") or {}
    ours = copy_labels(copy.class_name)
    return (
        dict(found.get("data") or {}) == dict(copy.data)
        and (found.get("type") or SECRET_TYPE) == SECRET_TYPE
        and all(labels.get(k) == v for k, v in ours.items())
    )


def plan_copies(desired: Mapping[CopyKey, Copy], existing: Mapping[CopyKey, Obj]) -> CopyPlan:
    """The writes that turn the copies found (``existing``: every Secret with the managed
    label) into the copies wanted, in a stable order."""
    creates = tuple(desired[k] for k in sorted(desired) if k not in existing)
    updates = tuple(
        desired[k]
        for k in sorted(desired)
        if k in existing and not matches(desired[k], existing[k])
    )
    deletes = tuple(k for k in sorted(existing) if k not in desired)
    return CopyPlan(creates, updates, deletes)
