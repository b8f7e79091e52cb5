"""docs/security.md names, for every boundary, the test that attacks it. A row that names a
test nobody wrote (or one renamed since) would promise a proof that does not exist, so
every named test must be a test function of the named file, and every row must name one."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "security.md"
TESTS = ROOT / "controller" / "tests"
# A reference in the test column: `integration/test_x.py::test_name`.
REFERENCE = re.compile(r"`([\w/]+\.py)::(test_\w+)`")
ROW_ID = re.compile(r"^[A-Z]\d+$")


def boundary_rows() -> list[list[str]]:
    """The rows of the boundary tables: those whose first cell is an id such as T7."""
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells and ROW_ID.match(cells[0]):
            rows.append(cells)
    return rows


@cache
def defined_tests(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


def test_every_boundary_row_names_a_mechanism_and_at_least_one_test() -> None:
    rows = boundary_rows()
    assert len(rows) >= 20, f"the boundary tables of {DOC} were not found: {len(rows)} rows"
    ids = [row[0] for row in rows]
    assert len(ids) == len(set(ids)), f"row ids repeat: {ids}"
    for row in rows:
        assert len(row) == 5, f"row {row[0]} has {len(row)} cells, not 5: {row}"
        assert row[3], f"row {row[0]} names no mechanism"
        assert REFERENCE.search(row[4]), f"row {row[0]} names no test: {row[4]!r}"


def test_every_attack_the_threat_model_names_is_a_test_that_exists() -> None:
    missing = []
    for row in boundary_rows():
        for file, function in REFERENCE.findall(row[4]):
            path = TESTS / file
            if not path.is_file() or function not in defined_tests(path):
                missing.append(f"{row[0]}: {file}::{function}")
    assert not missing, "docs/security.md names tests that do not exist:\n" + "\n".join(missing)
