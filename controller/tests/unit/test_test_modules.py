"""The test folders are not packages, so pytest imports each test module by its basename: two
modules of one name in different folders stop the whole run at collection on a clean clone
(a warm checkout can hide it behind cached bytecode)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_modules_share_a_basename() -> None:
    seen: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        seen[path.name].append(str(path.relative_to(TESTS)))
    shared = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not shared, f"test modules sharing a basename: {shared}"
