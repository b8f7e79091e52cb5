"""Writes docs/api.md from the CRDs, so the API reference cannot drift from the schema.

    python tools/gen_api_docs.py          # rewrite docs/api.md
    python tools/gen_api_docs.py --check  # exit 1 when docs/api.md is out of date

Every field of every kind, with its type, whether it is required, its description, and the
rules the API server enforces on it (validation messages, enums, limits, defaults); the
printer columns `kubectl get` shows; the status subresource and selectable fields.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = ROOT / "controller" / "cozystack_gpu" / "crds"
DOC = ROOT / "docs" / "api.md"
# The order a reader meets them: the offer, the order, the inventory.
ORDER = ("gpuclasses.yaml", "gpuclaims.yaml", "gpureservations.yaml", "gpunodes.yaml")

HEADER = """# API reference: group `{group}`

Generated from the CRDs in `controller/cozystack_gpu/crds/` by `tools/gen_api_docs.py`;
do not edit by hand (`make docs` rewrites it, and a test fails when it is out of date).
What each reason in a condition means is in [troubleshooting.md](troubleshooting.md).
How the API may change between releases, and how the stored version moves when a new version
(v1alpha2, v1beta1) is needed: [api-evolution.md](api-evolution.md).
"""


def _one_line(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _type(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "")
    if schema.get("x-kubernetes-int-or-string"):
        return "int or string"
    if kind == "array":
        return f"[]{_type(schema.get('items') or {})}"
    if kind == "object" and "additionalProperties" in schema:
        return f"map[string]{_type(schema['additionalProperties'] or {})}"
    if schema.get("format"):
        return f"{kind} ({schema['format']})"
    return kind or "any"


def _rules(schema: dict[str, Any]) -> list[str]:
    rules: list[str] = []
    if "enum" in schema:
        rules.append("one of " + ", ".join(f"`{v}`" for v in schema["enum"]))
    for key, word in (
        ("minimum", "≥"),
        ("maximum", "≤"),
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("maxProperties", "entries ≤"),
    ):
        if key in schema:
            rules.append(f"{word} {schema[key]}")
    if "pattern" in schema:
        rules.append(f"pattern `{schema['pattern']}`")
    if "default" in schema:
        rules.append(f"default `{schema['default']}`")
    if schema.get("x-kubernetes-list-type") == "map":
        keys = ", ".join(schema.get("x-kubernetes-list-map-keys") or [])
        rules.append(f"list keyed by {keys}")
    for validation in schema.get("x-kubernetes-validations") or []:
        message = validation.get("message") or validation.get("messageExpression") or ""
        rules.append(f'"{_one_line(message)}"')
    items = schema.get("items") or {}
    if schema.get("type") == "array" and items.get("x-kubernetes-validations"):
        rules += [f"each item: {rule}" for rule in _rules(items) if rule.startswith('"')]
    return rules


def _fields(schema: dict[str, Any], prefix: str) -> Iterator[tuple[str, dict[str, Any], bool]]:
    required = set(schema.get("required") or [])
    for name, child in (schema.get("properties") or {}).items():
        path = f"{prefix}.{name}" if prefix else name
        yield path, child, name in required
        if child.get("type") == "object":
            yield from _fields(child, path)
        elif child.get("type") == "array":
            items = child.get("items") or {}
            if items.get("type") == "object":
                yield from _fields(items, f"{path}[]")


def _section(crd: dict[str, Any]) -> list[str]:
    spec = crd["spec"]
    names = spec["names"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    root = version["schema"]["openAPIV3Schema"]
    out = [
        f"## {names['kind']}",
        "",
        _one_line(root.get("description", "")),
        "",
        f"- API version: `{spec['group']}/{version['name']}`, {spec['scope'].lower()}",
        f"- plural `{names['plural']}`"
        + (
            f", short names {', '.join(f'`{s}`' for s in names.get('shortNames', []))}"
            if names.get("shortNames")
            else ""
        ),
    ]
    if "status" in (version.get("subresources") or {}):
        out.append("- `status` is a subresource (no tenant role grants it)")
    for field in version.get("selectableFields") or []:
        out.append(f"- selectable field `{field['jsonPath']}` (`kubectl get --field-selector`)")
    for rule in _rules(root):
        out.append(f"- object rule: {rule}")
    columns = version.get("additionalPrinterColumns") or []
    if columns:
        shown = ", ".join(f"{c['name']} (`{c['jsonPath']}`)" for c in columns)
        out.append(f"- `kubectl get` columns: {shown}")
    out += ["", "| field | type | required | description | rules |", "|---|---|---|---|---|"]
    for part in ("spec", "status"):
        schema = (root.get("properties") or {}).get(part)
        if not schema:
            continue
        out.append(
            f"| `{part}` | object | {'yes' if part in (root.get('required') or []) else ''} "
            f"| {_one_line(schema.get('description', ''))} | {'; '.join(_rules(schema))} |"
        )
        for path, child, required in _fields(schema, part):
            out.append(
                f"| `{path}` | {_type(child)} | {'yes' if required else ''} "
                f"| {_one_line(child.get('description', ''))} | {'; '.join(_rules(child))} |"
            )
    out.append("")
    return out


def render() -> str:
    unlisted = sorted({p.name for p in CRD_DIR.glob("*.yaml")} - set(ORDER))
    if unlisted:  # a CRD missing from the reference would pass every check unseen
        raise SystemExit(f"gen_api_docs: add {', '.join(unlisted)} to ORDER")
    crds = [yaml.safe_load((CRD_DIR / name).read_text()) for name in ORDER]
    lines = [HEADER.format(group=crds[0]["spec"]["group"])]
    for crd in crds:
        lines += _section(crd)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when docs/api.md is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not DOC.exists() or DOC.read_text() != text:
            print(f"{DOC} is out of date: run python tools/gen_api_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
