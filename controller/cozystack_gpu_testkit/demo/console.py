"""What the demo prints, and how a step that does not turn out as expected stops it.

Every act has a heading; every step prints one progress line when it is done (with its time
and what it found) or stops the demo with :class:`DemoFailure`: the step, what it expected,
what it saw, and where the logs are.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")

RULE = "─" * 78
CLEAR_LINE = "\x1b[K"


class Mismatch(Exception):
    """Raised inside a step: the outcome is not what the step expects."""

    def __init__(self, expected: str, saw: str) -> None:
        super().__init__(f"expected {expected}; saw {saw}")
        self.expected = expected
        self.saw = saw


class DemoFailure(Exception):
    """A step failed: the demo stops here."""

    def __init__(self, step: str, expected: str, saw: str, logs: Path) -> None:
        super().__init__(f"{step}: expected {expected}; saw {saw} (logs: {logs})")
        self.step = step
        self.expected = expected
        self.saw = saw
        self.logs = logs

    def explain(self) -> str:
        return "\n".join(
            [
                "",
                f"✗ the demo stopped at: {self.step}",
                f"  expected: {self.expected}",
                f"  saw:      {self.saw}",
                f"  logs:     {self.logs}/ (controller, agents, kubelets, ansible, control plane)",
            ]
        )


def check(ok: bool, expected: str, saw: str | Callable[[], str]) -> None:
    """Raises :class:`Mismatch` unless ``ok``; ``saw`` may be computed only then."""
    if not ok:
        raise Mismatch(expected, saw() if callable(saw) else saw)


def wait_until(
    probe: Callable[[], T | None],
    *,
    expected: str,
    saw: Callable[[], str],
    timeout: float = 60.0,
    interval: float = 0.2,
) -> T:
    """Polls ``probe`` until it returns something truthy (returned); after ``timeout``
    seconds raises :class:`Mismatch` with what ``saw`` describes then."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise Mismatch(f"{expected} (within {timeout:.0f} s)", saw())
        time.sleep(interval)


@dataclass
class Console:
    """The demo's output: act headings, progress lines, shown command output."""

    logs: Path
    out: TextIO = field(default_factory=lambda: sys.stdout)
    show_output: bool = True
    started: float = field(default_factory=time.monotonic)
    act_name: str = ""

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def act(self, number: int, title: str, what: str) -> None:
        self.act_name = f"act {number} ({title})"
        self.say()
        self.say(RULE)
        self.say(f" Act {number}. {title}")
        self.say(f" {what}")
        self.say(RULE)

    def heading(self, title: str) -> None:
        self.act_name = title
        self.say()
        self.say(f"== {title} ==")

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[list[str]]:
        """Runs a step: the body appends what it found to the yielded list; the line
        printed at the end carries it. A :class:`Mismatch` or any error becomes a
        :class:`DemoFailure` naming this step."""
        begun = time.monotonic()
        found: list[str] = []
        live = self.out.isatty()
        if live:  # a person watching sees what runs; the done line replaces it
            print(f"  … {text}", end="\r", file=self.out, flush=True)
        try:
            yield found
        except DemoFailure:
            raise
        except Mismatch as exc:
            if live:
                self.say()
            raise DemoFailure(f"{self.act_name}: {text}", exc.expected, exc.saw, self.logs) from exc
        except Exception as exc:
            if live:
                self.say()
            raise DemoFailure(
                f"{self.act_name}: {text}",
                "the step to succeed",
                f"{type(exc).__name__}: {_first_lines(str(exc))}",
                self.logs,
            ) from exc
        took = time.monotonic() - begun
        self.say(f"{CLEAR_LINE if live else ''}  ✓ {text} ({took:.1f} s)")
        for line in found:
            self.say(f"      {line}")

    def show(self, command: str, output: str) -> None:
        """A command and its output, as a user would see them in a terminal."""
        if not self.show_output:
            return
        self.say(f"    $ {command}")
        for line in output.rstrip("\n").splitlines():
            self.say(f"      {line}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def _first_lines(text: str, lines: int = 12) -> str:
    kept = text.strip().splitlines()
    more = f"\n  … ({len(kept) - lines} more lines)" if len(kept) > lines else ""
    return "\n  ".join(kept[:lines]) + more
