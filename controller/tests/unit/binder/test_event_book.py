"""The binder's Events are aggregated as client-go's recorder aggregates them: a repeat of
one event (same object, reason, message and type) is the same Event with a rising count
and a later lastTimestamp, and repeats that arrive while the Event's write still waits in
the queue ride on that write instead of adding one."""

from __future__ import annotations

from cozystack_gpu import keys
from cozystack_gpu.binder.rules.events import EventBook

NOW = 1_780_000_000.0
CLAIM = {"metadata": {"name": "c", "namespace": "t", "uid": "u1"}}


def test_an_event_carries_its_times_count_and_reporter() -> None:
    book = EventBook(instance="replica-a")
    told, new_write = book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "bound on n1", False, NOW)
    assert new_write
    body = book.create_body(told)
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-05-28T20:26:40Z"
    assert body["count"] == 1
    assert body["type"] == "Normal"
    assert body["reportingComponent"] == keys.FIELD_MANAGER_BINDER
    assert body["reportingInstance"] == "replica-a"
    assert body["source"] == {"component": keys.FIELD_MANAGER_BINDER}
    assert body["involvedObject"]["uid"] == "u1"
    assert body["metadata"]["name"].startswith("c.")


def test_a_repeat_is_the_same_event_with_a_rising_count() -> None:
    book = EventBook(instance="r")
    first = book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "bound on n1", False, NOW)[0]
    book.taken(first)  # its write went out
    again, new_write = book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "bound on n1", False, NOW + 5)
    assert again is first and new_write
    assert book.patch_body(again) == {"count": 2, "lastTimestamp": "2026-05-28T20:26:45Z"}
    assert book.create_body(again)["firstTimestamp"] == "2026-05-28T20:26:40Z"


def test_repeats_while_the_write_is_queued_add_no_write() -> None:
    book = EventBook(instance="r")
    told = book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "m", False, NOW)[0]
    writes = [book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "m", False, NOW + i)[1] for i in (1, 2)]
    assert writes == [False, False]
    book.taken(told)
    assert book.create_body(told)["count"] == 3


def test_another_reason_message_type_or_object_is_another_event() -> None:
    book = EventBook(instance="r")
    base = book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "m", False, NOW)[0]
    other = {"metadata": {"name": "d", "namespace": "t", "uid": "u2"}}
    for told, new_write in (
        book.tell(CLAIM, keys.GPU_CLAIM, "Moved", "m", False, NOW),
        book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "other words", False, NOW),
        book.tell(CLAIM, keys.GPU_CLAIM, "Bound", "m", True, NOW),
        book.tell(other, keys.GPU_CLAIM, "Bound", "m", False, NOW),
    ):
        assert new_write
        assert told is not base
        assert told.name != base.name


def test_the_book_forgets_the_oldest_events_beyond_its_size() -> None:
    book = EventBook(instance="r", size=2)
    first = book.tell(CLAIM, keys.GPU_CLAIM, "A", "m", False, NOW)[0]
    book.taken(first)
    for reason in ("B", "C"):
        book.taken(book.tell(CLAIM, keys.GPU_CLAIM, reason, "m", False, NOW)[0])
    again = book.tell(CLAIM, keys.GPU_CLAIM, "A", "m", False, NOW + 1)[0]
    assert again is not first and book.create_body(again)["count"] == 1
    assert len(book) == 2
