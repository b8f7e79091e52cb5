"""The claims annotation of a VMI (``keys.ANNOTATION_CLAIMS``): its one reader.

Read strictly, everywhere: the webhooks refuse a malformed annotation with ``parse``'s
message (a typo such as ``"claim"`` must stop the start, never start the VM without its
GPUs), and the binder, the view and the tools read a stored one with ``request_of`` (a
malformed one names nothing: it was refused at admission, or it was stored without the
webhook and must not start) and ``problem_of`` (why, for the gate to say). One value is
parsed once: the gate reads each gated pod's VMI several times a turn. Pure: no kopf, no
client.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cozystack_gpu import keys

# What a refusal shows, so the fix is in the message.
EXPECTED_FORMAT = (
    '{"claims": ["<GPUClaim name>", ...], '
    '"claimTemplates": [{"name": "<entry>", "class": "<GPUClass>", "count": <units>}, ...]}'
)

# What a tenant may put in the annotation, refused at admission beyond: a VM's set is a few
# claims, and every replica reads each value (24 VMs with 494 KiB values held 11.6 MiB in
# the parse cache after they were gone).
MAX_BYTES = 16 * 1024
MAX_ENTRIES = 64  # claims and templates together
# Values up to this size are parsed once and remembered (the gate reads each gated pod's
# VMI several times a turn); at most CACHED values, so the cache holds about 1 MiB at most
# whatever tenants write, and forgets objects that are gone as new values come.
CACHED_MAX_BYTES = 1024
CACHED = 1024

_MEMBERS = frozenset({keys.ANNOTATION_MEMBER_CLAIMS, keys.ANNOTATION_MEMBER_TEMPLATES})
_TEMPLATE_MEMBERS = frozenset({"name", "class", "count"})
# Object names (DNS subdomains) for claims; DNS labels for classes and template entries,
# since a template entry becomes part of a claim name and a class part of a quota key.
# Matched against the whole name (``fullmatch``), as the API server judges it: a ``$``
# anchor also matches before a trailing newline.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class AnnotationError(ValueError):
    """The annotation cannot be read; the message names the problem and the format."""


@dataclass(frozen=True)
class TemplateEntry:
    """One claim template: the claim the controller creates for the VMI at start."""

    name: str
    gpu_class: str
    count: int


@dataclass(frozen=True)
class ClaimsRequest:
    """What a VMI asks for: claims it holds (in the annotation's order) and templates."""

    claims: tuple[str, ...] = ()
    templates: tuple[TemplateEntry, ...] = ()


def _refuse(problem: str) -> AnnotationError:
    return AnnotationError(
        f"annotation {keys.ANNOTATION_CLAIMS} is malformed: {problem}; "
        f"expected JSON like {EXPECTED_FORMAT}"
    )


def _is_subdomain(name: str) -> bool:
    return len(name) <= 253 and _SUBDOMAIN.fullmatch(name) is not None


def _is_label(name: str) -> bool:
    return len(name) <= 63 and _LABEL.fullmatch(name) is not None


def parse(raw: str) -> ClaimsRequest:
    """The request an annotation value makes; ``AnnotationError`` when it is malformed.

    Both members are optional, but together they must name at least one unit: a VMI that
    asks for nothing should not carry the annotation (its launcher pod would be held at the
    scheduling gate for nothing).
    """
    size = len(raw.encode())
    if size > MAX_BYTES:
        raise _refuse(
            f"it is {size} bytes long, more than the {MAX_BYTES} allowed (name at most "
            f"{MAX_ENTRIES} claims and templates together)"
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _refuse(f"not JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(value, dict):
        kind = "null" if value is None else type(value).__name__
        raise _refuse(f"it is a JSON {kind}, not an object")
    unknown = sorted(set(value) - _MEMBERS)
    if unknown:
        raise _refuse(f"unknown member(s) {', '.join(map(repr, unknown))}")
    claims = _claims(value.get(keys.ANNOTATION_MEMBER_CLAIMS, []))
    templates = _templates(value.get(keys.ANNOTATION_MEMBER_TEMPLATES, []))
    if not claims and not templates:
        raise _refuse("it names no claim and no claim template")
    if len(claims) + len(templates) > MAX_ENTRIES:
        raise _refuse(
            f"it names {len(claims) + len(templates)} claims and templates, more than the "
            f"{MAX_ENTRIES} allowed"
        )
    return ClaimsRequest(claims, templates)


def _claims(value: object) -> tuple[str, ...]:
    member = keys.ANNOTATION_MEMBER_CLAIMS
    if not isinstance(value, list):
        raise _refuse(f"{member!r} must be a list of GPUClaim names")
    seen: set[str] = set()
    for index, name in enumerate(value):
        if not isinstance(name, str) or not _is_subdomain(name):
            raise _refuse(f"{member}[{index}] = {json.dumps(name)} is not a GPUClaim name")
        if name in seen:
            raise _refuse(f"{member}[{index}] names GPUClaim {name} twice")
        seen.add(name)
    return tuple(value)


def _templates(value: object) -> tuple[TemplateEntry, ...]:
    member = keys.ANNOTATION_MEMBER_TEMPLATES
    if not isinstance(value, list):
        raise _refuse(f"{member!r} must be a list of objects")
    entries: list[TemplateEntry] = []
    seen: set[str] = set()
    for index, item in enumerate(value):
        where = f"{member}[{index}]"
        if not isinstance(item, dict):
            raise _refuse(f"{where} must be an object with name, class and count")
        unknown = sorted(set(item) - _TEMPLATE_MEMBERS)
        if unknown:
            raise _refuse(f"{where} has unknown member(s) {', '.join(map(repr, unknown))}")
        missing = sorted({"name", "class"} - set(item))
        if missing:
            raise _refuse(f"{where} lacks {', '.join(missing)}")
        # count may be left out for one unit, as the gate controller reads it too.
        name, gpu_class, count = item["name"], item["class"], item.get("count", 1)
        if not isinstance(name, str) or not _is_label(name):
            raise _refuse(f"{where}.name = {json.dumps(name)} is not a DNS label")
        if name in seen:
            raise _refuse(f"{where}.name {name} is used twice")
        if not isinstance(gpu_class, str) or not keys.is_dns_label(gpu_class):
            raise _refuse(f"{where}.class = {json.dumps(gpu_class)} is not a GPUClass name")
        # bool is an int in Python; true is not a count.
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise _refuse(f"{where}.count = {json.dumps(count)} is not a whole number >= 1")
        seen.add(name)
        entries.append(TemplateEntry(name, gpu_class, count))
    return tuple(entries)


def _read(raw: str) -> ClaimsRequest | AnnotationError:
    if len(raw) > CACHED_MAX_BYTES:
        return _parsed(raw)  # rare and bounded (MAX_BYTES): parsed each time, never kept
    return _cached(raw)


def _parsed(raw: str) -> ClaimsRequest | AnnotationError:
    try:
        return parse(raw)
    except AnnotationError as exc:
        return exc


_cached = functools.lru_cache(maxsize=CACHED)(_parsed)


def request_of(annotations: Mapping[str, Any] | None) -> ClaimsRequest | None:
    """The request a stored object's annotations make, or None when they carry none or a
    malformed one (see ``problem_of``)."""
    raw = (annotations or {}).get(keys.ANNOTATION_CLAIMS)
    if not raw:
        return None
    read = _read(str(raw))
    return read if isinstance(read, ClaimsRequest) else None


def problem_of(annotations: Mapping[str, Any] | None) -> str | None:
    """Why the claims annotation cannot be read, or None (it can, or there is none)."""
    raw = (annotations or {}).get(keys.ANNOTATION_CLAIMS)
    if not raw:
        return None
    read = _read(str(raw))
    return str(read) if isinstance(read, AnnotationError) else None


def encode(request: ClaimsRequest) -> str:
    """The annotation value of a request (the inverse of ``parse``), for tests and tools."""
    value: dict[str, object] = {}
    if request.claims:
        value[keys.ANNOTATION_MEMBER_CLAIMS] = list(request.claims)
    if request.templates:
        value[keys.ANNOTATION_MEMBER_TEMPLATES] = [
            {"name": t.name, "class": t.gpu_class, "count": t.count} for t in request.templates
        ]
    return json.dumps(value, separators=(",", ":"))


def claims_ref_of(obj: Mapping[str, Any]) -> ClaimsRequest | None:
    """An object's (a VMI's) claims annotation, or None when it has none or it cannot be
    read (the VMI webhook refuses a malformed one, so a stored VMI has a valid one)."""
    return request_of((obj.get("metadata") or {}).get("annotations"))


def claims_ref_problem(obj: Mapping[str, Any]) -> str | None:
    """Why an object's claims annotation cannot be read, or None (it can, or there is none).
    The VMI webhook refuses such a VMI; one stored without it must not start unchecked."""
    return problem_of((obj.get("metadata") or {}).get("annotations"))


def template_claim_names(vmi_name: str, ref: ClaimsRequest) -> tuple[str, ...]:
    """The names of the claims made from the claim templates ``ref`` names for a VMI."""
    return tuple(keys.template_claim_name(vmi_name, t.name) for t in ref.templates)
