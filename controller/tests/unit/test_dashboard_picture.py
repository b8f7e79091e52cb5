"""The dashboard's picture (docs/images/dashboard.svg) is drawn from its queries' results by
``cozystack_gpu_testkit.dashboard_picture``: the same results give the same bytes, whatever
text a title or a label holds stays text, each panel lies where its ``gridPos`` puts it,
and the committed picture has every panel of the chart's dashboard where the dashboard has
it (a panel added, moved or renamed without a new picture fails here, without the
Prometheus the integration test needs to draw one)."""

from __future__ import annotations

import json
import random
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from cozystack_gpu_testkit import dashboard_picture as picture
from cozystack_gpu_testkit.dashboard_picture import Labels, Result

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "controller" / "chart" / "files" / "dashboards" / "cozystack-gpu.json"
PICTURE = ROOT / "docs" / "images" / "dashboard.svg"
SVG = "{http://www.w3.org/2000/svg}"


def board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def scenario() -> dict[str, list[Result]]:
    """Results shaped as the integration test's scenario gives them."""
    h100 = "nvidia.com/GH100_H100_SXM5_80GB"
    steps = ("Bind", "Move", "Lose", "Rebind", "Reattach", "Attach", "Detach")
    return {
        "Capacity per class": [{(("class", "h100"),): 8.0}],
        "Free per class": [{(("class", "h100"),): 5.0}],
        "Bound, attached and lost per class": [
            {
                (("class", "h100"), ("phase", "Attached")): 2.0,
                (("class", "h100"), ("phase", "Bound")): 1.0,
                (("class", "h100"), ("phase", "Lost")): 1.0,
            }
        ],
        "Pending claims": [{(): "≥ 2"}],
        "Bind latency": [{(): "> 0 s"}, {(): "> 0 s"}, {(): "> 0 s"}],
        "Binder decisions by step": [
            {(("step", s),): "> 0" if s in ("Bind", "Attach", "Lose") else "0" for s in steps}
        ],
        "Per-node occupancy (units held / capacity)": [
            {(("node", "agent"),): 0.375, (("node", "failing"),): 1.0}
        ],
        "Per-node allocatable devices (node agent)": [
            {(("node", "agent"), ("resource_name", h100)): 8.0}
        ],
        "Binder leader": [{(("pod", "dash-0"),): 1.0}],
    }


def panel(title: str, x: int, y: int, w: int, h: int, **extra: Any) -> dict[str, Any]:
    return {
        "title": title,
        "type": "timeseries",
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        **extra,
    }


def groups(svg: str) -> dict[str, ET.Element]:
    return {
        g.get("data-title", ""): g
        for g in ET.fromstring(svg).iter(f"{SVG}g")
        if g.get("class") == "panel"
    }


def frame(group: ET.Element) -> dict[str, float]:
    """A panel's frame: its first rectangle's place and size."""
    rect = group.find(f"{SVG}rect")
    assert rect is not None
    return {k: float(rect.get(k, "nan")) for k in ("x", "y", "width", "height")}


def texts(element: ET.Element) -> list[str]:
    return [t.text or "" for t in element.iter(f"{SVG}text")]


def test_the_same_results_give_the_same_bytes_in_any_order() -> None:
    results = scenario()
    first = picture.render(board(), results, {"Bind latency": "varies"}, "caption")
    # Prometheus answers series in no set order, and the caller's dicts may come in any.
    shuffled: dict[str, list[Result]] = {}
    rng = random.Random(7)
    for title in rng.sample(list(results), len(results)):
        shuffled[title] = []
        for result in results[title]:
            items = list(result.items())
            rng.shuffle(items)
            shuffled[title].append(dict(items))
    again = picture.render(board(), shuffled, {"Bind latency": "varies"}, "caption")
    assert again == first
    assert first.endswith("</svg>\n")


def test_series_are_listed_by_name_and_targets_in_order() -> None:
    board_ = {
        "panels": [
            panel(
                "p",
                0,
                0,
                24,
                8,
                targets=[{"legendFormat": "{{b}}"}, {"legendFormat": "second {{b}}"}],
            )
        ]
    }
    results: dict[str, list[Result]] = {
        "p": [{(("b", "z"),): 1.0, (("b", "a"),): 2.0}, {(("b", "m"),): 3.0}]
    }
    shown = texts(groups(picture.render(board_, results))["p"])
    assert shown == ["p", "Last *", "a", "2", "z", "1", "second m", "3"]


def test_titles_labels_and_notes_stay_text() -> None:
    nasty = "<b>\"cap\" & 'free'</b>"
    board_ = {
        "title": "a & b",
        "panels": [panel(nasty, 0, 0, 24, 8, targets=[{"legendFormat": "{{node}}"}])],
    }
    results: dict[str, list[Result]] = {nasty: [{(("node", "n<1>&"),): 1.0}]}
    svg = picture.render(board_, results, {nasty: "a <note> & more"}, "x < y")
    assert "<b>" not in svg and "<note>" not in svg
    root = ET.fromstring(svg)  # well-formed whatever the titles hold
    every = [t.text for t in root.iter(f"{SVG}text")]
    assert {"a & b", "x < y", nasty, "n<1>&", "a <note> & more"} <= set(every)
    assert picture.panels_in(svg) == {nasty: (0, 0, 24, 8)}


def test_panels_lie_at_their_grid_positions() -> None:
    board_ = {
        "panels": [
            panel("left", 0, 0, 6, 4),
            panel("right", 6, 0, 18, 4),
            panel("below", 3, 4, 12, 10),
        ]
    }
    svg = picture.render(board_, {})
    frames = {title: frame(g) for title, g in groups(svg).items()}
    column, row, gap, left, top = (
        picture.COLUMN_PX,
        picture.ROW_PX,
        picture.GAP_PX,
        picture.MARGIN_PX,
        picture.HEADER_PX,
    )
    assert frames["left"] == {
        "x": left + gap / 2,
        "y": top + gap / 2,
        "width": 6 * column - gap,
        "height": 4 * row - gap,
    }
    assert frames["right"]["x"] == left + 6 * column + gap / 2
    assert frames["right"]["x"] + frames["right"]["width"] + gap / 2 == left + 24 * column
    assert frames["below"]["x"] == left + 3 * column + gap / 2
    assert frames["below"]["y"] == top + 4 * row + gap / 2
    root = ET.fromstring(svg)
    # The picture is as wide as the 24 columns and as high as the lowest panel.
    assert float(root.get("width", "")) == 2 * left + 24 * column
    assert float(root.get("height", "")) == top + 14 * row + left


def test_every_panel_of_the_charts_dashboard_is_drawn() -> None:
    svg = picture.render(board(), scenario())
    assert picture.panels_in(svg) == {p["title"]: picture.grid_pos(p) for p in board()["panels"]}
    for title, group in groups(svg).items():
        assert title in texts(group)


def test_the_committed_picture_has_every_panel_where_the_dashboard_has_it() -> None:
    assert PICTURE.exists(), f"{PICTURE.relative_to(ROOT)} is missing"
    drawn = picture.panels_in(PICTURE.read_text(encoding="utf-8"))
    wanted = {p["title"]: picture.grid_pos(p) for p in board()["panels"]}
    assert drawn == wanted, (
        f"{PICTURE.relative_to(ROOT)} is not the chart's dashboard: draw it again with "
        "COZYSTACK_GPU_UPDATE_PICTURES=1 pytest tests/integration/test_dashboard_prometheus.py"
    )


def test_a_panel_without_results_reads_no_data() -> None:
    svg = picture.render({"panels": [panel("empty", 0, 0, 12, 8)]}, {})
    assert "No data" in texts(groups(svg)["empty"])


def test_numbers_bars_and_stand_ins() -> None:
    board_ = {
        "panels": [
            panel(
                "occupancy",
                0,
                0,
                12,
                8,
                targets=[{"legendFormat": "{{node}}"}],
                fieldConfig={"defaults": {"unit": "percentunit"}},
            ),
            panel("rates", 12, 0, 12, 8, targets=[{}], fieldConfig={"defaults": {"unit": "ops"}}),
        ]
    }
    results: dict[str, list[Result]] = {
        "occupancy": [{(("node", "a"),): 0.375, (("node", "b"),): 0.75}],
        "rates": [{(("step", "Bind"),): "> 0", (("step", "Move"),): "0"}],
    }
    drawn = groups(picture.render(board_, results))
    occupancy = drawn["occupancy"]
    assert texts(occupancy) == ["occupancy", "Last *", "a", "37.5%", "b", "75%"]
    # A bar per series, as long as its value against the panel's largest.
    bars = [r for r in occupancy.iter(f"{SVG}rect") if r.get("opacity")]
    assert len(bars) == 2
    assert float(bars[0].get("width", "")) * 2 == pytest.approx(
        float(bars[1].get("width", "")), abs=0.1
    )
    # A stand-in is drawn as given, with no bar; no legendFormat names a series by its labels.
    rates = drawn["rates"]
    assert texts(rates) == ["rates", "Last *", '{step="Bind"}', "> 0", '{step="Move"}', "0"]
    assert not [r for r in rates.iter(f"{SVG}rect") if r.get("opacity")]


@pytest.mark.parametrize(
    ("value", "unit", "shown"),
    [
        (8.0, "short", "8"),
        (0.375, "percentunit", "37.5%"),
        (1.0, "percentunit", "100%"),
        (0.0038961, "ops", "0.0039 ops/s"),
        (1.8523, "s", "1.85 s"),
        (1234.56, "", "1235"),
        (float("nan"), "s", "NaN s"),
        (float("inf"), "", "+Inf"),
        ("≥ 2", "short", "≥ 2"),
    ],
)
def test_values_are_formatted_by_fixed_rules(value: float | str, unit: str, shown: str) -> None:
    assert picture.formatted(value, unit) == shown


@pytest.mark.parametrize(
    ("fmt", "labels", "name"),
    [
        ("{{class}} {{phase}}", (("class", "h100"), ("phase", "Bound")), "h100 Bound"),
        ("{{ node }}", (("node", "n1"),), "n1"),
        ("{{node}} {{gone}}", (("node", "n1"),), "n1"),
        ("p50", (), "p50"),
        ("", (("a", "1"), ("b", "2")), '{a="1", b="2"}'),
        ("__auto", (), "value"),
    ],
)
def test_series_are_named_by_the_legend_format(fmt: str, labels: Labels, name: str) -> None:
    assert picture.legend(fmt, labels) == name


def test_many_series_come_closer_together_before_any_is_left_out() -> None:
    # The refusal reasons: eleven, each a series from the start (counters start at 0).
    eleven: Result = {(("reason", f"Reason{i:02d}"),): "0" for i in range(11)}
    board_ = {"panels": [panel("reasons", 0, 0, 12, 8, targets=[{"legendFormat": "{{reason}}"}])]}
    svg = picture.render(board_, {"reasons": [eleven]}, {"reasons": "a note"})
    shown = texts(groups(svg)["reasons"])
    assert [t for t in shown if t.startswith("Reason")] == [f"Reason{i:02d}" for i in range(11)]
    assert not [t for t in shown if "more series" in t]


def test_what_does_not_fit_is_counted_and_long_names_cut() -> None:
    many: Result = {(("n", f"node-{i:02d}-" + "x" * 60),): float(i) for i in range(30)}
    board_ = {"panels": [panel("many", 0, 0, 12, 8, targets=[{"legendFormat": "{{n}}"}])]}
    shown = texts(groups(picture.render(board_, {"many": [many]}))["many"])
    assert any(t.startswith("+ ") and t.endswith(" more series") for t in shown)
    names = [t for t in shown if t.startswith("node-")]
    assert names and all(t.endswith("…") for t in names)
    assert f"+ {30 - len(names)} more series" in shown


def test_stat_and_table_panels() -> None:
    board_ = {
        "panels": [
            panel("one", 0, 0, 6, 4, type="stat", targets=[{}]),
            panel("tab", 6, 0, 18, 8, type="table", targets=[{}]),
        ]
    }
    results: dict[str, list[Result]] = {
        "one": [{(): 3.0}],
        "tab": [{(("class", "b"), ("node", "n2")): 2.0, (("class", "a"),): 1.0}],
    }
    drawn = groups(picture.render(board_, results))
    assert texts(drawn["one"]) == ["one", "3"]
    assert texts(drawn["tab"]) == ["tab", "class", "node", "Value", "a", "", "1", "b", "n2", "2"]
