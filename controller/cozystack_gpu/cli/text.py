"""Plain-text helpers of the plugin: tables as kubectl prints them, ages, ordinals."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[object]], indent: str = "") -> list[str]:
    """Columns left-aligned and three spaces apart, as ``kubectl get`` prints them; no
    trailing blanks."""
    cells = [list(header), *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        (indent + "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True))).rstrip()
        for row in cells
    ]


def age(seconds: float | None) -> str:
    """A duration the way kubectl shows ages: 45s, 3m12s, 2h, 5d; ``<unknown>`` for none."""
    if seconds is None:
        return "<unknown>"
    s = max(int(seconds), 0)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 48:
        return f"{hours}h"
    return f"{hours // 24}d"


def ordinal(n: int) -> str:
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


def units(n: int) -> str:
    return f"{n} unit" if n == 1 else f"{n} units"


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else (many or one + 's')}"
