"""No file grows past what a new engineer reads in one sitting: a product file at most 600
lines, a test-kit file at most 800 (the kit holds long scenarios, rule books and fixtures),
and no function in either over 80 lines unless it says why it is one piece: a comment on the
line right above its ``def`` (or its first docstring line) with ``one piece:`` and the reason.

A file that must hold more says why and is named here:

- ``agent/sysfs.py`` is one file on purpose, because it runs under three import systems (the
  controller package, the collection's module_utils through a file link, and a copy beside
  the boot restore unit), so it imports nothing but the standard library and cannot be split
  into modules that import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2]
PACKAGE = CONTROLLER / "cozystack_gpu"
KIT = CONTROLLER / "cozystack_gpu_testkit"
LIMIT = 600
KIT_LIMIT = 800
FUNCTION_LIMIT = 80
MARKER = "one piece:"
ONE_PIECE = {"agent/sysfs.py"}  # see the module docstring
KIT_ONE_PIECE: set[str] = set()  # none: the kit splits by role
GENERATED = ("_pb2.py", "_pb2_grpc.py")  # protoc's output


def _sources(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        name = str(path.relative_to(root))
        if name.endswith(GENERATED):
            continue
        yield name, path


def _too_long(root: Path, limit: int, one_piece: set[str]) -> dict[str, int]:
    too_long = {}
    for name, path in _sources(root):
        lines = len(path.read_text().splitlines())
        if name not in one_piece and lines > limit:
            too_long[name] = lines
    return too_long


def _functions(root: Path) -> Iterator[tuple[str, int, bool]]:
    """Every function and method under ``root``: where, how many lines, and whether it
    carries the marker."""
    for name, path in _sources(root):
        source = path.read_text()
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            length = node.end_lineno - node.lineno + 1
            starts = {node.lineno, *(d.lineno for d in node.decorator_list)}
            above = [lines[n - 2].strip() for n in starts if n >= 2]
            docstring = (ast.get_docstring(node, clean=False) or "").lstrip().split("\n")[0]
            marked = any(a.startswith("#") and MARKER in a for a in above) or MARKER in docstring
            yield f"{root.name}/{name}:{node.lineno} {node.name}", length, marked


def test_every_product_file_is_at_most_600_lines() -> None:
    too_long = _too_long(PACKAGE, LIMIT, ONE_PIECE)
    assert not too_long, f"over {LIMIT} lines (split them by role): {too_long}"


def test_every_test_kit_file_is_at_most_800_lines() -> None:
    too_long = _too_long(KIT, KIT_LIMIT, KIT_ONE_PIECE)
    assert not too_long, f"over {KIT_LIMIT} lines (split them by role): {too_long}"


def test_the_one_piece_exceptions_still_need_to_be_one() -> None:
    """An exception that shrank below the limit is no longer one: drop it from the list."""
    for root, names, limit in ((PACKAGE, ONE_PIECE, LIMIT), (KIT, KIT_ONE_PIECE, KIT_LIMIT)):
        for name in names:
            assert len((root / name).read_text().splitlines()) > limit, name


def test_no_function_is_over_80_lines_unless_it_says_why() -> None:
    too_long = {
        where: length
        for root in (PACKAGE, KIT)
        for where, length, marked in _functions(root)
        if length > FUNCTION_LIMIT and not marked
    }
    assert not too_long, (
        f"functions over {FUNCTION_LIMIT} lines: split them, or say why one is one piece "
        f"(a '# {MARKER} <why>' line right above its def): {too_long}"
    )


def test_a_one_piece_marker_is_on_a_function_that_needs_it() -> None:
    """A marked function that shrank to the limit no longer needs its marker: drop it."""
    needless = [
        where
        for root in (PACKAGE, KIT)
        for where, length, marked in _functions(root)
        if marked and length <= FUNCTION_LIMIT
    ]
    assert not needless, needless
