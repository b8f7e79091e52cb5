"""A GPUClaim's ``status.migration`` as the model reads it (``translate.claim_info``): the
target node, the migration's uid and since in epoch seconds; anything that cannot be read
whole is no migration, so a malformed status never holds units on a node."""

from __future__ import annotations

import datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozystack_gpu.model import MigrationTarget
from cozystack_gpu.objects import translate

SINCE = datetime.datetime(2026, 12, 14, 9, 0, tzinfo=datetime.UTC)


def claim(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "c",
            "namespace": "tenant-a",
            "creationTimestamp": "2026-12-06T12:00:00Z",
        },
        "spec": {"class": "h100", "count": 2},
        "status": {"phase": "Attached", "nodeName": "n1", "attachedTo": "vm", **status},
    }


def read(**status: Any) -> MigrationTarget | None:
    return translate.claim_info(claim(**status), vmi_live_now=True, set_id="vm/vm").migration


def test_a_recorded_migration_reads_as_its_target_node_uid_and_since() -> None:
    entry = {"node": "n2", "migrationUID": "m-1", "since": "2026-12-14T10:00:00+01:00"}
    assert read(migration=entry) == MigrationTarget("n2", "m-1", SINCE.timestamp())
    info = translate.claim_info(claim(migration=entry), vmi_live_now=True, set_id="vm/vm")
    assert info.migrating_to == "n2" and info.node == "n1"


def test_no_migration_or_one_that_cannot_be_read_whole_is_none() -> None:
    good = {"node": "n2", "migrationUID": "m-1", "since": "2026-12-14T09:00:00Z"}
    assert read() is None and read(migration=None) is None
    for broken in (
        "n2",
        [good],
        {**good, "node": ""},
        {**good, "node": 3},
        {k: v for k, v in good.items() if k != "migrationUID"},
        {**good, "migrationUID": None},
        {**good, "since": "yesterday"},
        {k: v for k, v in good.items() if k != "since"},
    ):
        assert read(migration=broken) is None, broken


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)
entries = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "node": st.one_of(st.text(max_size=8), json_values),
            "migrationUID": st.one_of(st.text(max_size=8), json_values),
            "since": st.one_of(
                st.datetimes(timezones=st.just(datetime.UTC)).map(lambda d: d.isoformat()),
                json_values,
            ),
        },
    ),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entry=entries)
def test_any_migration_status_reads_as_a_whole_target_or_none(entry: Any) -> None:
    target = read(migration=entry)
    if target is not None:
        assert target.node and target.uid and isinstance(target.since, float)
        assert (target.node, target.uid) == (entry["node"], entry["migrationUID"])
