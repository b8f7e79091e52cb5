"""`make help` is how a new user finds the targets: every phony target is listed there with
what it does, so a target added without its `##` text fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_make_help_lists_every_target_with_what_it_does() -> None:
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.MULTILINE)
    assert phony is not None, "the Makefile declares no .PHONY targets"
    result = subprocess.run(
        ["make", "-s", "--no-print-directory", "help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    listed = dict(re.findall(r"^  make (\S+)\s+(.+)$", result.stdout, re.MULTILINE))
    missing = [t for t in phony.group(1).split() if not listed.get(t, "").strip()]
    assert not missing, f"targets `make help` does not explain: {missing}\n{result.stdout}"
