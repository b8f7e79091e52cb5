"""``kubectl gpu top classes``: the units reservations book over the next 24 hours, counted as
the metric counts them, and what a user who may not list reservations is shown instead."""

from __future__ import annotations

import http.server
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cozystack_gpu import keys, metrics
from cozystack_gpu.cli import main, top, whatif
from cozystack_gpu.config import parse
from cozystack_gpu.model import booked_by_class
from cozystack_gpu.objects.translate import rfc3339

CONFIG = parse([])
RES = "nvidia.com/GH100_H100_SXM5_80GB"
L40S = "nvidia.com/AD102GL_L40S"
NOW = 1_800_000_000 - 1_800_000_000 % 60  # a whole minute: windows are whole minutes
HOUR = 3600
DAY = 24 * HOUR


def _node(name: str, res: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": {res: "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _gpunode(name: str, res: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "status": {
            "devices": [{"resourceName": res, "allocatable": 8}],
            "updatedAt": rfc3339(NOW - 5),
        },
    }


def _class(name: str, res: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"mode": "passthrough", "source": {"devicePlugin": {"resourceName": res}}},
    }


def _reservation(
    name: str, count: int, start: float, end: float, phase: str, cls: str = "h100"
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if phase in ("Booked", "Active"):
        status["nodeName"] = "n1"
    return {
        "metadata": {"namespace": "tenant-a", "name": name, "uid": f"uid-{name}",
                     "creationTimestamp": rfc3339(NOW - DAY)},
        "spec": {"class": cls, "count": count, "start": rfc3339(start), "end": rfc3339(end)},
        "status": status,
    }  # fmt: skip


# Per window, whether the column counts it: the busiest moment of [NOW, NOW + 24 h) is
# NOW+1h to NOW+2h, where the Active window (3) and the Booked one (2) overlap: 5. Each
# window left out is larger than that, so counting it would show.
RESERVATIONS = [
    _reservation("active", 3, NOW - HOUR, NOW + 2 * HOUR, "Active"),
    _reservation("booked", 2, NOW + HOUR, NOW + 5 * HOUR, "Booked"),
    _reservation("last-hour", 1, NOW + 23 * HOUR, NOW + 26 * HOUR, "Booked"),  # inside: 1
    _reservation("tomorrow", 6, NOW + DAY, NOW + DAY + HOUR, "Booked"),  # starts at NOW+24h
    _reservation("later", 6, NOW + 30 * HOUR, NOW + 31 * HOUR, "Booked"),
    _reservation("over", 6, NOW - 3 * HOUR, NOW - HOUR, "Ended"),  # its window is past
    _reservation("ended", 6, NOW - HOUR, NOW + HOUR, "Ended"),  # the phase says it holds none
    _reservation("lost", 6, NOW + HOUR, NOW + 2 * HOUR, "Lost"),  # booked on no node
    _reservation("waiting", 6, NOW + HOUR, NOW + 2 * HOUR, "Pending"),  # not booked yet
    _reservation("other", 1, NOW + HOUR, NOW + 2 * HOUR, "Booked", cls="t4"),
]


def _listing(reservations: list[dict[str, Any]] | None) -> dict[str, Any]:
    listing: dict[str, Any] = {
        keys.NODE.kind: [_node("n1", RES), _node("n2", L40S)],
        keys.GPU_NODE.kind: [_gpunode("n1", RES), _gpunode("n2", L40S)],
        keys.GPU_CLASS.kind: [_class("h100", RES), _class("idle", L40S)],
    }
    if reservations is not None:
        listing[keys.GPU_RESERVATION.kind] = reservations
    return listing


def _booked(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {r["class"]: r["bookedNext24h"] for r in rows}


def test_booked_is_the_busiest_moment_of_the_next_day_of_booked_and_active_windows() -> None:
    rows = top.class_rows(_listing(RESERVATIONS), CONFIG, NOW)
    # t4 has no GPUClass here, so no row; a class without windows books 0.
    assert _booked(rows) == {"h100": 5, "idle": 0}
    # A window that starts at NOW + 24 h is past the day: the last hour's alone books 1.
    alone = [r for r in RESERVATIONS if r["metadata"]["name"] in ("last-hour", "tomorrow")]
    assert _booked(top.class_rows(_listing(alone), CONFIG, NOW)) == {"h100": 1, "idle": 0}
    # Two hours on, the Active window has ended and the day ahead reaches tomorrow's window
    # (6), which overlaps the last hour's (1).
    later = top.class_rows(_listing(RESERVATIONS), CONFIG, NOW + 2 * HOUR)
    assert _booked(later)["h100"] == 7
    lines = top.render_classes(rows)
    assert lines[0].split() == [
        "CLASS", "MODE", "NODES", "ALLOCATABLE", "HELD", "ATTACHED", "LOST", "FREE", "MAXFREE",
        "PENDING", "RAW", "BOOKED24H",
    ]  # fmt: skip
    assert [ln.split()[0] for ln in lines[1:]] == ["h100", "idle"]
    assert [ln.split()[-1] for ln in lines[1:]] == ["5", "0"]
    assert top.render_classes(rows, wide=True)[1].split()[-2:] == ["5", RES]


def test_the_column_and_the_metric_count_the_same_windows() -> None:
    """One rule (``model.booked_by_class``): the metric samples at whole hours what the
    column reads the busiest moment of. The busiest moment here starts at the next whole
    hour, NOW + 1h (NOW is a whole hour), where the metric's hour 0 reads the same 5."""
    assert NOW % HOUR == 0
    _view, snap = whatif.build(_listing(RESERVATIONS), CONFIG, NOW)
    hours = metrics.booked_by_hour(booked_by_class(snap.bookings), NOW)
    column = _booked(top.class_rows(_listing(RESERVATIONS), CONFIG, NOW))
    assert hours["h100"][0] == column["h100"] == 5
    assert "idle" not in hours and column["idle"] == 0  # the publisher writes its zeros


def test_without_reservations_listed_the_column_is_unknown_and_a_note_says_why() -> None:
    rows = top.class_rows(_listing(None), CONFIG, NOW, reservations_known=False)
    assert _booked(rows) == {"h100": None, "idle": None}
    # As the note says: free then counts what booked windows hold back (7 of 8 here).
    known = top.class_rows(_listing(RESERVATIONS), CONFIG, NOW)
    assert [r["free"] for r in known] == [1, 8] and [r["free"] for r in rows] == [8, 8]
    report = {"items": rows, "notes": top.class_notes(reservations_known=False)}
    lines = top.render_class_report(report)
    assert [ln.split()[-1] for ln in lines[1:3]] == ["<unknown>", "<unknown>"]
    assert lines[3:] == [f"Note: {top.UNLISTED_RESERVATIONS}"]
    assert top.class_notes(reservations_known=True) == []


# --- through the command line, against an API server that answers lists ----------------


class _Api(http.server.BaseHTTPRequestHandler):
    """Lists by plural; 403 for the plurals in ``forbidden``; every other list is empty."""

    objects: dict[str, list[dict[str, Any]]] = {}
    forbidden: frozenset[str] = frozenset()

    def do_GET(self) -> None:
        plural = self.path.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
        if plural in self.forbidden:
            status, body = 403, {"kind": "Status", "code": 403, "message": "forbidden"}
        else:
            status, body = 200, {"items": self.objects.get(plural, [])}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[type[_Api], Path]]:
    listing = _listing(RESERVATIONS)
    kinds = (keys.NODE, keys.GPU_NODE, keys.GPU_CLASS, keys.GPU_RESERVATION)
    handler = type("Api", (_Api,), {"objects": {k.plural: listing[k.kind] for k in kinds}})
    server = http.server.HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    try:
        yield handler, config
    finally:
        server.shutdown()
        server.server_close()


def _top_classes(config: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[int, str]:
    monkeypatch.setattr(main, "time", SimpleNamespace(time=lambda: float(NOW)))
    out = io.StringIO()
    code = main.main(["top", "classes", "--kubeconfig", str(config), *flags], out)
    return code, out.getvalue()


def test_top_classes_shows_the_booked_units_to_a_hoster(
    api: tuple[type[_Api], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _handler, config = api
    code, out = _top_classes(config, monkeypatch)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[-1] == "BOOKED24H"
    assert [(ln.split()[0], ln.split()[-1]) for ln in lines[1:]] == [("h100", "5"), ("idle", "0")]
    code, out = _top_classes(config, monkeypatch, "-o", "json")
    report = json.loads(out)
    assert [r["bookedNext24h"] for r in report["items"]] == [5, 0]
    assert report["notes"] == []


def test_a_user_who_may_not_list_reservations_gets_the_table_with_a_note(
    api: tuple[type[_Api], Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler, config = api
    handler.forbidden = frozenset({keys.GPU_RESERVATION.plural})
    code, out = _top_classes(config, monkeypatch)
    assert code == 0
    lines = out.splitlines()
    assert [(ln.split()[0], ln.split()[-1]) for ln in lines[1:3]] == [
        ("h100", "<unknown>"),
        ("idle", "<unknown>"),
    ]
    assert lines[3:] == [f"Note: {top.UNLISTED_RESERVATIONS}"]
    report = json.loads(_top_classes(config, monkeypatch, "-o", "json")[1])
    assert [r["bookedNext24h"] for r in report["items"]] == [None, None]
    assert report["notes"] == [top.UNLISTED_RESERVATIONS]
    # Any other kind forbidden: still a hoster's command, refused in one line.
    handler.forbidden = frozenset({keys.GPU_RESERVATION.plural, keys.POD.plural})
    assert _top_classes(config, monkeypatch) == (1, "")
    assert capsys.readouterr().err.startswith("error: top needs to list nodes")
