"""docs/api.md is generated from the CRDs; it must be what the generator writes today."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_api_reference_is_generated_from_the_current_crds() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_api_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def _validation_messages(node: object) -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for rule in node.get("x-kubernetes-validations") or []:
            found.append(str(rule.get("message") or rule.get("messageExpression")))
        for value in node.values():
            found += _validation_messages(value)
    elif isinstance(node, list):
        for value in node:
            found += _validation_messages(value)
    return found


def test_the_api_reference_shows_every_validation_message() -> None:
    import yaml

    doc = (ROOT / "docs" / "api.md").read_text()
    messages = []
    for crd in sorted((ROOT / "controller" / "cozystack_gpu" / "crds").glob("*.yaml")):
        messages += _validation_messages(yaml.safe_load(crd.read_text()))
    assert messages, "the CRDs carry validation rules"
    missing = [m for m in messages if " ".join(m.split()) not in doc]
    assert not missing, missing
