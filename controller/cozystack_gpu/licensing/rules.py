"""Where the hoster's licence token is copied, decided without I/O (SPEC.md §10).

The copier gathers the classes, the namespaces' labels, the token Secrets of the
controller's namespace and the copies it finds (every Secret carrying the managed label),
and these functions say what the copies should be and which writes get them there. No
kubernetes import: the property tests drive them with generated clusters.

A copy is wanted in a namespace entitled to vGPU for every vGPU class with ``license``
whose Secret is a licence token (``token_problem``: the hoster's label, type Opaque, the
token under ``client_configuration_token.tok``). A class being deleted keeps its copies: it
still serves the claims that hold its units, and their VMs must start licensed; they go with
the class. A Secret that is missing or stops being a licence token takes the copies away
too: what the hoster withdrew (or never meant to hand out, such as a TLS key) is not left
behind in tenant namespaces, and the class's LicenseReady condition says why.

The VMI webhook judges a namespace's copy with the same functions (``wanted_copy``,
``copy_problem``): a Secret of the copy's name is the controller's only when its data is
what the hoster's Secret gives now, whatever labels and annotations it carries.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.keys import LicenseReason
from cozystack_gpu.objects import Obj
from cozystack_gpu.objects.conditions import condition, merge_conditions, same_condition

CopyKey = tuple[str, str]  # (namespace, name)
SECRET_TYPE = keys.LICENSE_SECRET_TYPE


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
class TokenProblem:
    """Why a class's token Secret is not copied: said on the class, and to a VM's start."""

    reason: LicenseReason
    message: str


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


def _mark() -> str:
    return f'{keys.LABEL_LICENSE_TOKEN}: "{keys.LICENSE_TOKEN_MARK}"'


def token_problem(lic: License, secret: Obj | None) -> TokenProblem | None:
    """Why the Secret a class's ``secretRef`` names may not be copied to tenants, or None
    when it is a licence token the hoster marked (SPEC.md §10). The class names any Secret
    of the controller's namespace, and that namespace also holds the webhook's TLS key and
    ServiceAccount tokens: only a Secret the hoster labelled for this leaves it."""
    where = f"Secret {lic.secret_name} in the controller's namespace"
    fix = (
        f"kubectl create secret generic {lic.secret_name} "
        f"--from-file={keys.LICENSE_TOKEN_KEY}=<the .tok file>, then label it {_mark()}"
    )
    if secret is None:
        return TokenProblem(
            LicenseReason.SECRET_MISSING,
            f"{where}, named by spec.license.secretRef, does not exist, so no guest of the "
            f"class gets a licence; the hoster creates it: {fix}",
        )
    labels = _meta(secret).get("labels") or {}
    if labels.get(keys.LABEL_LICENSE_TOKEN) != keys.LICENSE_TOKEN_MARK:
        return TokenProblem(
            LicenseReason.SECRET_NOT_MARKED,
            f"{where} is not marked as a licence token (label {_mark()}), so it is not copied "
            "into tenant namespaces: the controller's namespace holds other Secrets too (the "
            "webhook's TLS key, ServiceAccount tokens); if it is the hoster's NVIDIA client "
            f"configuration token, label it {_mark()}; otherwise name the token's Secret",
        )
    kind = str(secret.get("type") or SECRET_TYPE)
    if kind != SECRET_TYPE:
        return TokenProblem(
            LicenseReason.SECRET_WRONG_TYPE,
            f"{where} is of type {kind}, and a licence token Secret is of type {SECRET_TYPE} "
            f"(kubectl create secret generic), so it is not copied; put the token in a "
            f"Secret of its own: {fix}",
        )
    if lic.secret_key != keys.LICENSE_TOKEN_KEY:
        return TokenProblem(
            LicenseReason.KEY_NOT_TOKEN,
            f"spec.license.secretRef.key is {lic.secret_key}, and a licence token Secret holds "
            f"its token under the key {keys.LICENSE_TOKEN_KEY}, so nothing is copied; set the "
            f"key to {keys.LICENSE_TOKEN_KEY} (the Secret made with {fix})",
        )
    if not (secret.get("data") or {}).get(keys.LICENSE_TOKEN_KEY):
        return TokenProblem(
            LicenseReason.TOKEN_MISSING,
            f"{where} holds no key {keys.LICENSE_TOKEN_KEY} (or it is empty), so no guest of "
            f"the class gets a licence; put the token there: {fix}",
        )
    return None


def copy_data(lic: License, secret: Obj) -> tuple[tuple[str, str], ...]:
    """The data of the class's copies, from a Secret ``token_problem`` accepted: only the
    token travels, beside the class's FeatureType."""
    token = str((secret.get("data") or {}).get(keys.LICENSE_TOKEN_KEY))
    return (
        (keys.LICENSE_FEATURE_TYPE_KEY, _b64(str(lic.feature_type))),
        (keys.LICENSE_TOKEN_KEY, token),
    )


def wanted_copy(klass: Obj, namespace: str, secret: Obj | None) -> Copy | TokenProblem | None:
    """The copy of a class's licence a namespace should hold (entitlement aside), why there
    is none, or None for a class without a licence."""
    lic = class_license(klass)
    if lic is None:
        return None
    problem = token_problem(lic, secret)
    if problem is not None:
        return problem
    assert secret is not None
    name = keys.license_copy_name(lic.class_name)
    return Copy(namespace, name, lic.class_name, copy_data(lic, secret))


def desired_copies(
    classes: Iterable[Obj],
    namespaces: Mapping[str, Mapping[str, str]],
    sources: Mapping[str, Obj],
) -> dict[CopyKey, Copy]:
    """Every copy that should exist. ``namespaces`` maps a name to its labels, ``sources``
    a Secret of the controller's namespace by name to the Secret (its labels, type and
    data, base64 values)."""
    wanted: dict[CopyKey, Copy] = {}
    targets = sorted(name for name, labels in namespaces.items() if entitled(labels))
    for klass in classes:
        lic = class_license(klass)
        if lic is None:
            continue
        secret = sources.get(lic.secret_name)
        if token_problem(lic, secret) is not None:
            continue
        assert secret is not None
        data = copy_data(lic, secret)
        name = keys.license_copy_name(lic.class_name)
        for namespace in targets:
            wanted[(namespace, name)] = Copy(namespace, name, lic.class_name, data)
    return wanted


def content_hash(data: Iterable[tuple[str, str]]) -> str:
    """The sha256 of a copy's data (keys and base64 values), as its annotation carries it."""
    digest = hashlib.sha256()
    for key, value in sorted(data):
        digest.update(f"{key}={value}\n".encode())
    return digest.hexdigest()


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
            "annotations": {keys.ANNOTATION_LICENSE_CONTENT_HASH: content_hash(copy.data)},
        },
        "type": SECRET_TYPE,
        "data": dict(copy.data),
    }


def copy_problem(copy: Copy, found: Obj) -> str | None:
    """What makes a Secret of the copy's name other than the controller's copy, or None.
    The data decides (it must be what the hoster's Secret gives now); the type, the labels
    and the hash annotation must also be the copier's, so a copy it wrote before a rotation
    or an upgrade is written again. Other labels or annotations someone adds are left
    alone."""
    labels = _meta(found).get("labels") or {}
    annotations = _meta(found).get("annotations") or {}
    if dict(found.get("data") or {}) != dict(copy.data):
        return "its data is not the hoster's current token"
    if (found.get("type") or SECRET_TYPE) != SECRET_TYPE:
        return f"it is of type {found.get('type')}, not {SECRET_TYPE}"
    missing = [f"{k}={v}" for k, v in copy_labels(copy.class_name).items() if labels.get(k) != v]
    if missing:
        return f"it lacks the label(s) {', '.join(missing)}"
    if annotations.get(keys.ANNOTATION_LICENSE_CONTENT_HASH) != content_hash(copy.data):
        return f"its annotation {keys.ANNOTATION_LICENSE_CONTENT_HASH} is not its data's hash"
    return None


def matches(copy: Copy, found: Obj) -> bool:
    """A copy found as the copier writes it (``copy_problem`` finds nothing)."""
    return copy_problem(copy, found) is None


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


# --- what the class says ---------------------------------------------------------------


def license_condition(klass: Obj, sources: Mapping[str, Obj], now: float) -> dict[str, Any] | None:
    """The class's LicenseReady condition: True while its token is copied, False with the
    reason it is not; None for a class without a licence. Names only the Secret and key
    the class's spec already shows: every authenticated user reads GPUClass."""
    lic = class_license(klass)
    if lic is None:
        return None
    problem = token_problem(lic, sources.get(lic.secret_name))
    if problem is None:
        return condition(
            keys.CONDITION_LICENSE_READY,
            True,
            LicenseReason.COPIED,
            f"Secret {lic.secret_name} is a licence token: key {keys.LICENSE_TOKEN_KEY} is "
            f"copied as Secret {keys.license_copy_name(lic.class_name)} into every namespace "
            "entitled to vGPU",
            now,
        )
    return condition(keys.CONDITION_LICENSE_READY, False, problem.reason, problem.message, now)


def class_condition_patch(
    klass: Obj, sources: Mapping[str, Obj], now: float
) -> dict[str, Any] | None:
    """The status merge patch that makes the class's LicenseReady condition what it should
    be (taken away from a class that lost its licence), or None when it already is. It
    carries the resourceVersion read: the conditions list is written whole, and another
    writer's condition written meanwhile must not be dropped."""
    current = list((klass.get("status") or {}).get("conditions") or [])
    cond = license_condition(klass, sources, now)
    if cond is None:
        if not any(c.get("type") == keys.CONDITION_LICENSE_READY for c in current):
            return None
        conditions = [c for c in current if c.get("type") != keys.CONDITION_LICENSE_READY]
    elif same_condition(current, cond):
        return None
    else:
        conditions = merge_conditions(current, cond)
    return {
        "metadata": {"resourceVersion": _meta(klass).get("resourceVersion")},
        "status": {"conditions": conditions},
    }
