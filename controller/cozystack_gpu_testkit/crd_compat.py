"""What a CRD change does to objects stored by an earlier release: the changes that break them.

An upgrade keeps every object in etcd as the earlier release wrote it. A change to the CRD is
safe when each of those objects still reads, validates and updates as before; it breaks them
when it

- removes or renames a field (the API server prunes it from the stored object on the next
  write: the data is gone), or a version, or the status subresource, or a selectable field;
- changes the storage version (objects stay in etcd in the old one until migrated);
- changes a field's type, drops an enum value, or drops x-kubernetes-preserve-unknown-fields;
- tightens validation of an existing field: a new required field, a lower maximum/maxLength/
  maxItems/maxProperties, a higher minimum/minLength/minItems/minProperties, a new or changed
  pattern or format, a new enum, nullable taken away, a list made a set or a map;
- adds a CEL rule (x-kubernetes-validations) on an existing field, unless the rule is a
  transition rule (it names oldSelf: the server checks it only against the object's own
  earlier value);
- changes a default (a default fills absent fields when stored objects are read).

Validation ratcheting (GA in Kubernetes 1.33) lets an update keep an unchanged invalid value;
a tightening it covers can be accepted by the caller with a reason (see
controller/tests/unit/test_api_compatibility.py), never silently here.

Pure: CRDs in, findings out (no API server, no git).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Schema = Mapping[str, Any]

# Bounds where the new value must not be smaller / larger than the old one.
_UPPER = ("maximum", "maxLength", "maxItems", "maxProperties")
_LOWER = ("minimum", "minLength", "minItems", "minProperties")
_MUST_STAY = ("type", "format", "pattern", "x-kubernetes-list-type", "x-kubernetes-list-map-keys")


@dataclass(frozen=True, order=True)
class Finding:
    """One change that breaks objects an earlier release stored.

    ``where`` is ``<CRD name>/<version>:<field path>`` (``.`` for the schema root), ``what``
    says what changed, in words a reviewer can act on."""

    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _versions(crd: Schema) -> dict[str, Schema]:
    return {str(v["name"]): v for v in crd.get("spec", {}).get("versions") or []}


def _storage(crd: Schema) -> str | None:
    return next((n for n, v in _versions(crd).items() if v.get("storage")), None)


def breaking_changes(old: Schema, new: Schema) -> list[Finding]:
    """Every change from ``old`` to ``new`` (one CRD, two releases) that breaks stored
    objects, sorted."""
    name = str(old.get("metadata", {}).get("name", "?"))
    found: list[Finding] = []

    def top(what: str) -> None:
        found.append(Finding(name, what))

    old_spec, new_spec = old.get("spec", {}), new.get("spec", {})
    for key in ("group", "scope"):
        if old_spec.get(key) != new_spec.get(key):
            top(f"spec.{key} changed from {old_spec.get(key)!r} to {new_spec.get(key)!r}")
    for key in ("kind", "plural", "listKind", "singular"):
        was, now = old_spec.get("names", {}).get(key), new_spec.get("names", {}).get(key)
        if was != now:
            top(f"names.{key} changed from {was!r} to {now!r}")
    if _storage(old) != _storage(new):
        top(
            f"storage version changed from {_storage(old)} to {_storage(new)}: stored objects"
            " stay in the old one until migrated (docs/api-evolution.md)"
        )
    old_versions, new_versions = _versions(old), _versions(new)
    for version, was in old_versions.items():
        now = new_versions.get(version)
        if now is None:
            top(f"version {version} removed: objects stored in it can no longer be read")
            continue
        if was.get("served") and not now.get("served"):
            top(f"version {version} no longer served")
        where = f"{name}/{version}"
        if "status" in (was.get("subresources") or {}) and "status" not in (
            now.get("subresources") or {}
        ):
            found.append(Finding(where, "the status subresource removed"))
        kept = {f["jsonPath"] for f in now.get("selectableFields") or []}
        for field in was.get("selectableFields") or []:
            if field["jsonPath"] not in kept:
                found.append(Finding(where, f"selectable field {field['jsonPath']} removed"))
        found += (
            Finding(where, what)
            for what in _schema_changes(
                was.get("schema", {}).get("openAPIV3Schema") or {},
                now.get("schema", {}).get("openAPIV3Schema") or {},
                ".",
            )
        )
    return sorted(found)


def _join(path: str, child: str) -> str:
    return f".{child}" if path == "." else f"{path}.{child}"


def _is_transition_rule(rule: Mapping[str, Any]) -> bool:
    return "oldSelf" in str(rule.get("rule", ""))


def _schema_changes(old: Schema, new: Schema, path: str) -> Iterator[str]:
    """The breaking changes of one schema node and, for the fields it keeps, of their own."""

    def at(what: str) -> str:
        return f"{path}: {what}"

    for key in _MUST_STAY:
        if key in old and old.get(key) != new.get(key):
            yield at(f"{key} changed from {old[key]!r} to {new.get(key)!r}")
        elif key not in old and key in new and key != "type":
            yield at(f"{key} {new[key]!r} added on an existing field")
    for key in _UPPER:
        if key in new and (key not in old or new[key] < old[key]):
            yield at(f"{key} lowered from {old.get(key, 'none')} to {new[key]}")
    for key in _LOWER:
        if key in new and (key not in old or new[key] > old[key]):
            yield at(f"{key} raised from {old.get(key, 'none')} to {new[key]}")
    for key in ("exclusiveMinimum", "exclusiveMaximum"):
        if new.get(key) and not old.get(key):
            yield at(f"{key} turned on")
    if "enum" in new:
        if "enum" not in old:
            yield at(f"enum {new['enum']} added on an existing field")
        else:
            dropped = [v for v in old["enum"] if v not in new["enum"]]
            if dropped:
                yield at(f"enum values {dropped} dropped")
    if old.get("nullable") and not new.get("nullable"):
        yield at("nullable taken away")
    if old.get("x-kubernetes-preserve-unknown-fields") and not new.get(
        "x-kubernetes-preserve-unknown-fields"
    ):
        yield at("x-kubernetes-preserve-unknown-fields dropped: unknown fields would be pruned")
    if "default" in old and old.get("default") != new.get("default"):
        yield at(f"default changed from {old['default']!r} to {new.get('default')!r}")
    newly_required = sorted(set(new.get("required") or []) - set(old.get("required") or []))
    if newly_required:
        yield at(f"required {newly_required} added: stored objects without them are invalid")
    old_rules = {str(r.get("rule")) for r in old.get("x-kubernetes-validations") or []}
    for rule in new.get("x-kubernetes-validations") or []:
        if str(rule.get("rule")) not in old_rules and not _is_transition_rule(rule):
            yield at(f"CEL rule {rule.get('rule')!r} added on an existing field")
    old_props, new_props = old.get("properties") or {}, new.get("properties") or {}
    for prop, schema in old_props.items():
        if prop not in new_props:
            if not new.get("x-kubernetes-preserve-unknown-fields"):
                yield at(f"field {prop} removed or renamed: the server prunes it from objects")
            continue
        yield from _schema_changes(schema, new_props[prop], _join(path, prop))
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        was, now = old.get(key), new.get(key)
        if isinstance(was, Mapping):
            if not isinstance(now, Mapping):
                yield at(f"{key} schema removed")
            else:
                yield from _schema_changes(was, now, path + suffix)
