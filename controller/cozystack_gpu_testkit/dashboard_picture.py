"""A picture of a Grafana dashboard drawn from its queries' results, as SVG.

Grafana does not run in the tests (it builds from source only with its Node.js frontend), so
the picture in docs/operations.md is drawn here: the dashboard's grid (each panel at its
``gridPos`` on Grafana's 24 columns), each panel's title, and what its queries returned, as
Grafana's legend table with the last value shows it (one row per series, named by the
target's ``legendFormat``, with a bar for its value), a stat panel's value in large type, a
table panel's label sets and values. The integration test that runs every query of the
chart's dashboard against a real Prometheus hands its results here and compares the
picture with the committed one, so the picture cannot drift from the dashboard.

The same inputs always give the same bytes: series are sorted, numbers formatted to fixed
rules, nothing of the clock or the machine is drawn. A value that differs from run to run
is the caller's to replace by a string that does not (``"> 0"``); a string is drawn as
given, with no bar. Pure: the standard library only, no Kubernetes client.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A series' label set, sorted by name, as ``tuple(sorted(metric.items()))``.
Labels = tuple[tuple[str, str], ...]
# One target's result: each series' value, or a run-independent stand-in for it.
Result = Mapping[Labels, float | str]

COLUMNS = 24  # Grafana's grid
COLUMN_PX = 40
ROW_PX = 30  # Grafana's grid row height
GAP_PX = 8
MARGIN_PX = 16
HEADER_PX = 52
LINE_PX = 18  # a legend row
MIN_LINE_PX = 14  # rows closer together before any is left out
TITLE_PX = 34  # a panel's title band
FONT = "Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
MONO_CHAR_PX = 7.3  # at 12 px: what a name may take before it is cut short
SANS_CHAR_PX = 7.5  # at 13 px, bold titles
NOTE_CHAR_PX = 5.6  # at 10.5 px, italic
CAPTION_CHAR_PX = 6.2  # at 11.5 px
VALUE_PX = 96  # the value column of a legend row
# Grafana's classic palette, in its order: the n-th series of a panel gets the n-th colour.
PALETTE = (
    "#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1",
    "#ba43a9", "#705da0", "#508642", "#cca300",
)  # fmt: skip
BACKGROUND = "#111217"
PANEL = "#181b1f"
BORDER = "#2c3235"
TEXT = "#ccccdc"
MUTED = "#8e8e9a"


@dataclass(frozen=True)
class Row:
    """One series as a panel shows it."""

    name: str
    labels: Labels
    value: float | str


def number(value: float) -> str:
    """A value in fixed notation: integers whole, others to three significant figures below
    1 and two decimals above, trailing zeros dropped."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def formatted(value: float | str, unit: str) -> str:
    """A value in the panel's unit (``fieldConfig.defaults.unit``) as Grafana names it; a
    string stand-in as given."""
    if isinstance(value, str):
        return value
    if unit == "percentunit" and math.isfinite(value):
        return f"{number(value * 100)}%"
    if unit == "percent":
        return f"{number(value)}%"
    suffix = {"s": " s", "ms": " ms", "ops": " ops/s", "reqps": " req/s", "bytes": " B"}
    return number(value) + suffix.get(unit, "")


def legend(fmt: str, labels: Labels) -> str:
    """A series' name: the target's ``legendFormat`` with each ``{{label}}`` replaced (an
    absent label by nothing, as Grafana does), or the label set when there is none."""
    if fmt and fmt != "__auto":
        name = fmt
        for key, val in labels:
            name = name.replace("{{" + key + "}}", val).replace("{{ " + key + " }}", val)
        while "{{" in name and "}}" in name[name.index("{{") :]:
            start = name.index("{{")
            name = name[:start] + name[name.index("}}", start) + 2 :]
        return name.strip() or "value"
    if not labels:
        return "value"
    return "{" + ", ".join(f'{k}="{v}"' for k, v in labels) + "}"


def rows(panel: Mapping[str, Any], results: Sequence[Result]) -> list[Row]:
    """The panel's series in Grafana's legend order: target by target, each target's by
    name then labels (a stable order, whatever order Prometheus answered in)."""
    out: list[Row] = []
    for target, result in zip(panel.get("targets", []), results, strict=False):
        fmt = str(target.get("legendFormat", ""))
        named = [Row(legend(fmt, labels), labels, value) for labels, value in result.items()]
        out += sorted(named, key=lambda r: (r.name, r.labels))
    return out


def cut(text: str, room_px: float, char_px: float) -> str:
    """``text`` cut short with an ellipsis to fit ``room_px`` at ``char_px`` a character."""
    most = max(1, int(room_px // char_px))
    return text if len(text) <= most else text[: most - 1] + "…"


def wrapped(text: str, room_px: float, char_px: float, lines: int) -> list[str]:
    """``text`` in at most ``lines`` lines of ``room_px``, word by word, the last cut short."""
    most = max(1, int(room_px // char_px))
    out: list[str] = []
    line = ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > most:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        out.append(line)
    if len(out) > lines:
        out = [*out[: lines - 1], cut(" ".join(out[lines - 1 :]), room_px, char_px)]
        if not out[-1].endswith("…"):
            out[-1] = cut(out[-1] + " …", room_px, char_px)
    return out


def px(value: float) -> str:
    """A coordinate with one decimal at most: the same on every machine."""
    return f"{value:.1f}".rstrip("0").rstrip(".")


class Canvas:
    """SVG elements with coordinates written by :func:`px`."""

    def __init__(self, width: float, height: float) -> None:
        self.root = ET.Element(
            "svg",
            {
                "xmlns": "http://www.w3.org/2000/svg",
                "width": px(width),
                "height": px(height),
                "viewBox": f"0 0 {px(width)} {px(height)}",
                "font-family": FONT,
            },
        )

    def rect(
        self, parent: ET.Element, x: float, y: float, w: float, h: float, **attrs: str
    ) -> ET.Element:
        return ET.SubElement(
            parent,
            "rect",
            {"x": px(x), "y": px(y), "width": px(max(w, 0)), "height": px(max(h, 0)), **attrs},
        )

    def text(
        self,
        parent: ET.Element,
        x: float,
        y: float,
        body: str,
        size: float = 12,
        fill: str = TEXT,
        *,
        bold: bool = False,
        italic: bool = False,
        mono: bool = False,
        end: bool = False,
        middle: bool = False,
    ) -> ET.Element:
        """``body`` at (x, y), its baseline; ``end``/``middle``: x is where it ends or its
        middle."""
        attrs = {"x": px(x), "y": px(y), "font-size": px(size), "fill": fill}
        if bold:
            attrs["font-weight"] = "bold"
        if italic:
            attrs["font-style"] = "italic"
        if mono:
            attrs["font-family"] = MONO
        if end or middle:
            attrs["text-anchor"] = "end" if end else "middle"
        element = ET.SubElement(parent, "text", attrs)
        element.text = body
        return element


@dataclass(frozen=True)
class Box:
    """A panel's frame in pixels."""

    x: float
    y: float
    w: float
    h: float


def frame(grid: Mapping[str, Any]) -> Box:
    """Where a panel of ``gridPos`` lies in the picture: column ``x`` of 24 and row ``y`` of
    Grafana's grid, ``w`` columns wide and ``h`` rows high, a gap between panels."""
    return Box(
        MARGIN_PX + int(grid["x"]) * COLUMN_PX + GAP_PX / 2,
        HEADER_PX + int(grid["y"]) * ROW_PX + GAP_PX / 2,
        int(grid["w"]) * COLUMN_PX - GAP_PX,
        int(grid["h"]) * ROW_PX - GAP_PX,
    )


def grid_pos(panel: Mapping[str, Any]) -> tuple[int, int, int, int]:
    grid = panel["gridPos"]
    return int(grid["x"]), int(grid["y"]), int(grid["w"]), int(grid["h"])


def render(
    board: Mapping[str, Any],
    results: Mapping[str, Sequence[Result]],
    notes: Mapping[str, str] | None = None,
    caption: str = "",
) -> str:
    """The dashboard ``board`` (Grafana's JSON model) as SVG text.

    ``results`` holds, per panel title, one :data:`Result` per target in the panel's order
    (a panel without one reads "No data", as in Grafana); ``notes`` a line per panel title
    drawn at its foot (what a stand-in value means); ``caption`` a line under the
    dashboard's title."""
    notes = notes or {}
    panels = list(board.get("panels", []))
    bottom = max((y + h for _x, y, _w, h in map(grid_pos, panels)), default=0)
    width = 2 * MARGIN_PX + COLUMNS * COLUMN_PX
    height = HEADER_PX + bottom * ROW_PX + MARGIN_PX
    canvas = Canvas(width, height)
    root = canvas.root
    canvas.rect(root, 0, 0, width, height, fill=BACKGROUND)
    canvas.text(root, MARGIN_PX, 26, str(board.get("title", "")), 18, bold=True)
    if caption:
        room = width - 2 * MARGIN_PX
        canvas.text(root, MARGIN_PX, 44, cut(caption, room, CAPTION_CHAR_PX), 11.5, MUTED)
    for panel in panels:
        draw_panel(canvas, panel, results.get(str(panel.get("title", ""))), notes)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode") + "\n"


def draw_panel(
    canvas: Canvas,
    panel: Mapping[str, Any],
    results: Sequence[Result] | None,
    notes: Mapping[str, str],
) -> None:
    title = str(panel.get("title", ""))
    x, y, w, h = grid_pos(panel)
    box = frame(panel["gridPos"])
    group = ET.SubElement(
        canvas.root,
        "g",
        {"class": "panel", "data-title": title, "data-grid": f"{x} {y} {w} {h}"},
    )
    tooltip = ET.SubElement(group, "title")
    tooltip.text = ": ".join(p for p in (title, str(panel.get("description") or "")) if p)
    kind = str(panel.get("type", "timeseries"))
    if kind == "row":
        canvas.text(group, box.x, box.y + box.h - 6, title, 14, bold=True)
        return
    canvas.rect(group, box.x, box.y, box.w, box.h, fill=PANEL, stroke=BORDER, rx="3")
    canvas.text(group, box.x + 10, box.y + 21, cut(title, box.w - 20, SANS_CHAR_PX), 13, bold=True)
    note = notes.get(title, "")
    note_lines = wrapped(note, box.w - 20, NOTE_CHAR_PX, 2) if note else []
    for i, line in enumerate(reversed(note_lines)):
        canvas.text(group, box.x + 10, box.y + box.h - 8 - i * 13, line, 10.5, MUTED, italic=True)
    foot = 8 + 13 * len(note_lines)
    body = Box(box.x + 10, box.y + TITLE_PX, box.w - 20, box.h - TITLE_PX - foot)
    unit = str(((panel.get("fieldConfig") or {}).get("defaults") or {}).get("unit", ""))
    shown = rows(panel, results or [])
    if not shown:
        canvas.text(
            group, box.x + box.w / 2, body.y + body.h / 2, "No data", 14, MUTED, middle=True
        )
    elif kind in ("stat", "gauge"):
        draw_stat(canvas, group, body, shown, unit)
    elif kind == "table":
        draw_table(canvas, group, body, shown, unit)
    else:
        draw_legend(canvas, group, body, shown, unit)


def fitting(
    canvas: Canvas, group: ET.Element, body: Box, shown: list[Row]
) -> tuple[list[Row], float]:
    """The rows that fit the body and the height of a row: closer together when many, down
    to MIN_LINE_PX; past that, the last line says how many were left out."""
    line = min(LINE_PX, max(MIN_LINE_PX, body.h // max(1, len(shown))))
    room = max(1, int(body.h // line))
    if len(shown) <= room:
        return shown, line
    more = f"+ {len(shown) - room + 1} more series"
    canvas.text(group, body.x, body.y + (room - 1) * line + 13, more, 11, MUTED)
    return shown[: room - 1], line


def draw_legend(canvas: Canvas, group: ET.Element, body: Box, shown: list[Row], unit: str) -> None:
    """A time series panel as its legend table with the last value: a name, a bar of the
    value against the panel's largest, the value."""
    numbers = [abs(r.value) for r in shown if not isinstance(r.value, str)]
    largest = max((v for v in numbers if math.isfinite(v)), default=0.0)
    name_px = min(body.w * 0.65, max(len(r.name) for r in shown) * MONO_CHAR_PX + 16)
    bar_x = body.x + name_px + 8
    bar_room = body.w - name_px - 8 - VALUE_PX
    # The legend table's column head, on the title's line.
    canvas.text(group, body.x + body.w, body.y - TITLE_PX + 21, "Last *", 11, MUTED, end=True)
    kept, line = fitting(canvas, group, body, shown)
    for i, row in enumerate(kept):
        top = body.y + i * line
        colour = PALETTE[i % len(PALETTE)]
        canvas.rect(group, body.x, top + 4, 3, 10, fill=colour)
        name = cut(row.name, name_px - 8, MONO_CHAR_PX)
        canvas.text(group, body.x + 8, top + 13, name, mono=True)
        if not isinstance(row.value, str) and math.isfinite(row.value) and largest > 0:
            length = bar_room * abs(row.value) / largest
            canvas.rect(group, bar_x, top + 4, length, 10, fill=colour, opacity="0.8")
        value = formatted(row.value, unit)
        canvas.text(group, body.x + body.w, top + 13, value, mono=True, end=True)


def draw_stat(canvas: Canvas, group: ET.Element, body: Box, shown: list[Row], unit: str) -> None:
    """A stat panel: its one value large; several series, each a line with its name."""
    if len(shown) == 1:
        value = formatted(shown[0].value, unit)
        middle = (body.x + body.w / 2, body.y + body.h / 2 + 14)
        canvas.text(group, *middle, value, 40, PALETTE[0], bold=True, middle=True)
        return
    kept, line = fitting(canvas, group, body, shown)
    for i, row in enumerate(kept):
        top = body.y + i * line
        name = cut(row.name, body.w - VALUE_PX, MONO_CHAR_PX)
        canvas.text(group, body.x, top + 13, name, mono=True)
        value = formatted(row.value, unit)
        canvas.text(group, body.x + body.w, top + 14, value, 14, PALETTE[0], bold=True, end=True)


def draw_table(canvas: Canvas, group: ET.Element, body: Box, shown: list[Row], unit: str) -> None:
    """A table panel: a column per label name (sorted), then the value."""
    names = sorted({key for row in shown for key, _value in row.labels})
    col_px = (body.w - VALUE_PX) / max(1, len(names))
    for c, name in enumerate(names):
        head = cut(name, col_px - 6, MONO_CHAR_PX)
        canvas.text(group, body.x + c * col_px, body.y + 13, head, 12, MUTED, bold=True)
    canvas.text(group, body.x + body.w, body.y + 13, "Value", 12, MUTED, bold=True, end=True)
    below = Box(body.x, body.y + LINE_PX, body.w, body.h - LINE_PX)
    kept, line = fitting(canvas, group, below, shown)
    for i, row in enumerate(kept):
        top = below.y + i * line
        labels = dict(row.labels)
        for c, name in enumerate(names):
            cell = cut(labels.get(name, ""), col_px - 6, MONO_CHAR_PX)
            canvas.text(group, body.x + c * col_px, top + 13, cell, mono=True)
        value = formatted(row.value, unit)
        canvas.text(group, body.x + body.w, top + 13, value, mono=True, end=True)


def panels_in(svg: str) -> dict[str, tuple[int, int, int, int]]:
    """Each panel a picture drew: its title and ``gridPos`` (x, y, w, h), read back from the
    SVG text (what a test compares with the dashboard's panels)."""
    root = ET.fromstring(svg)
    found: dict[str, tuple[int, int, int, int]] = {}
    for group in root.iter("{http://www.w3.org/2000/svg}g"):
        if group.get("class") == "panel":
            x, y, w, h = (int(part) for part in group.get("data-grid", "").split())
            found[group.get("data-title", "")] = (x, y, w, h)
    return found
