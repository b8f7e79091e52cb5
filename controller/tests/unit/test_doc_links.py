"""The docs a clone carries link only to what the clone has: every relative link of README.md
and docs/*.md names a file of the repository, and every #anchor a heading of that file (as
GitHub makes anchors), and no page sends the reader to a document outside the repository."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE = re.compile(r"`[^`\n]*`")


def prose(page: Path) -> str:
    """A page without its code blocks and code spans, where brackets are not links."""
    return CODE.sub("", FENCE.sub("", page.read_text()))


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but - and _ dropped, spaces
    to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    body = FENCE.sub("", page.read_text())
    return frozenset(anchor(h) for h in re.findall(r"^#+ (.+)$", body, re.MULTILINE))


def test_every_relative_link_of_the_docs_resolves_inside_the_repository() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(prose(page)):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:: outside the repository by intent
            path, _hash, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that lead nowhere:\n" + "\n".join(broken)


def test_no_page_cites_the_design_folder_outside_the_repository() -> None:
    citing = [
        str(page.relative_to(ROOT))
        for page in PAGES
        if re.search(r"\bSPEC\.md\b", page.read_text())
    ]
    assert not citing, (
        f"pages citing SPEC.md, which a clone does not have (use docs/design.md): {citing}"
    )
