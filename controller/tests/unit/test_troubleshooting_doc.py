"""docs/troubleshooting.md explains every reason the controller can write: the model's
refusal reasons, the condition and Event reasons in keys.py, and the admission webhooks'
refusal reasons."""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path

import pytest

from cozystack_gpu import keys
from cozystack_gpu.model import Reason

DOC = Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md"
REASON_ENUMS: tuple[type[Enum], ...] = (
    Reason,
    keys.ClaimReason,
    keys.NodeReason,
    keys.ClassReason,
    keys.LicenseReason,
    keys.EventReason,
    keys.AdmissionReason,
)


def documented() -> set[str]:
    """Reasons that open a table row: | `Reason` | ..."""
    return set(re.findall(r"^\| `([A-Za-z]+)` \|", DOC.read_text(), re.MULTILINE))


@pytest.mark.parametrize("enum", REASON_ENUMS, ids=lambda e: e.__name__)
def test_every_reason_the_code_can_write_has_a_row(enum: type[Enum]) -> None:
    missing = sorted(str(member.value) for member in enum if member.value not in documented())
    assert not missing, f"docs/troubleshooting.md lacks a row for {missing}"


def test_the_page_explains_no_reason_the_code_cannot_write() -> None:
    known = {str(m.value) for enum in REASON_ENUMS for m in enum}
    stale = sorted(documented() - known)
    assert not stale, f"docs/troubleshooting.md explains reasons the code no longer has: {stale}"
