"""Events the binder writes read as client-go's recorder writes them: with times (so
``kubectl get events`` shows their age and sorts them), the reporting controller and
instance, and repeats of one event aggregated into one object whose count rises."""

from __future__ import annotations

import json
import queue
import re
import time
from typing import Any

from binder_env import Env

from cozystack_gpu import keys
from cozystack_gpu.binder.calls.base import Answer
from cozystack_gpu.binder.calls.reports import EventWrite
from cozystack_gpu.binder.rules.events import EventBook
from cozystack_gpu.binder.writer import Writer
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, wait_for

# kubectl's LAST SEEN and FIRST SEEN columns: an age such as 3s or 2m5s.
AGE = re.compile(r"^\d+[smhd](\d+[smh])?$")


def events_of(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}", _preload_content=False
    )
    return list(json.loads(listed.data)["items"])


def get_events_rows(plane: ControlPlane, namespace: str) -> list[dict[str, str]]:
    """``kubectl get events -o wide`` as a user runs it, one dict per row keyed by column
    (LAST SEEN, TYPE, REASON, OBJECT, …, FIRST SEEN, COUNT, NAME): cut at the header's
    column starts, since an empty column leaves only spaces."""
    out = plane.kubectl("get", "events", "-n", namespace, "-o", "wide").stdout
    lines = [line for line in out.splitlines() if line.strip()]
    if not lines:
        return []
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)?", header)]
    names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
    return [
        {
            name: line[a:b].strip()
            for name, a, b in zip(names, starts, [*starts[1:], None], strict=True)
        }
        for line in lines[1:]
    ]


def send(
    writer: Writer, results: queue.Queue[Any], book: EventBook, obj: dict[str, Any], reason: str
) -> None:
    told, needs_write = book.tell(
        obj, keys.GPU_CLAIM, reason, f"{reason} happened", False, time.time()
    )
    assert needs_write, "each repeat is sent once the one before is written"
    writer.send(EventWrite(told, book))

    def written() -> bool:
        try:
            done = results.get(timeout=0.1)
        except queue.Empty:
            return False
        assert isinstance(done, Answer) and done.ok, done
        return True

    wait_for(written, 15, f"the {reason} event written")


def test_binder_events_show_their_age_and_repeats_aggregate(
    control_plane: ControlPlane, api_client: Any, namespace: str
) -> None:
    kube = Kube(api_client)
    claim = {"metadata": {"name": "c", "namespace": namespace, "uid": "uid-c"}}
    results: queue.Queue[Any] = queue.Queue()
    writer, book = Writer(api_client, results, workers=2), EventBook("replica-a")
    writer.start()
    try:
        for _time in range(3):
            send(writer, results, book, claim, "Bound")
        send(writer, results, book, claim, "Moved")
    finally:
        writer.stop()

    events = {e["reason"]: e for e in events_of(kube, namespace, "c")}
    assert sorted(events) == ["Bound", "Moved"], "three Bound events are one Event"
    bound = events["Bound"]
    assert bound["count"] == 3
    assert bound["firstTimestamp"] and bound["lastTimestamp"] >= bound["firstTimestamp"]
    assert bound["reportingComponent"] == keys.FIELD_MANAGER_BINDER
    assert bound["reportingInstance"] == "replica-a"
    assert bound["source"]["component"] == keys.FIELD_MANAGER_BINDER
    assert events["Moved"]["count"] == 1

    rows = {row["REASON"]: row for row in get_events_rows(control_plane, namespace)}
    assert set(rows) == {"Bound", "Moved"}, rows
    for reason, row in rows.items():
        assert AGE.match(row["LAST SEEN"]), f"kubectl shows no age for {reason}: {row}"
        assert AGE.match(row["FIRST SEEN"]), f"kubectl shows no age for {reason}: {row}"
    assert rows["Bound"]["COUNT"] == "3" and rows["Moved"]["COUNT"] == "1", rows
    assert rows["Bound"]["SOURCE"] == f"{keys.FIELD_MANAGER_BINDER}, replica-a", rows


def test_an_event_of_the_running_binder_shows_its_age(
    env: Env, control_plane: ControlPlane
) -> None:
    env.node("n1", 1)
    gpu_class = env.gpu_class()
    env.kube.claim(env.tenant, "c", gpu_class, 1)
    env.wait_phase("c", "Bound")

    def bound_row() -> dict[str, str] | None:
        rows = get_events_rows(control_plane, env.tenant)
        return next((row for row in rows if row["REASON"] == "Bound"), None)

    row = wait_for(bound_row, 15, "the binder's Bound event")
    assert AGE.match(row["LAST SEEN"]), f"kubectl get events shows no age: {row}"
