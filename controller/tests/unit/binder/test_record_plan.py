"""Every Bound or Attached order has exactly one usage record of its own, tied to the
claim's uid, and a record no such claim owns is removed (issue 41, item 2).

Before, a record was found by a name derived from its claim's name and cut to the API's
limit: two orders whose long names agreed up to the cut shared one record (one unbilled);
a name the cut left invalid was refused and the claim silently unbilled; and a record a
tenant cut loose from its claim (ownerReferences removed) was never repaired nor removed,
ready to bill a later claim of the same name with the wrong count."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.binder.rules import records

NS = "tenant-a"


def claim(name: str, uid: str, count: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NS, "uid": uid},
        "spec": {"class": "h100", "count": count},
        "status": {"phase": "Bound", "nodeName": "n1"},
    }


def stored(body: dict[str, Any]) -> dict[str, Any]:
    """A record as the API server holds it once created."""
    return {**body, "metadata": {**body["metadata"], "resourceVersion": "5"}}


def apply(plan: records.RecordPlan, workloads: dict[Any, Any]) -> dict[Any, Any]:
    after = dict(workloads)
    for key in plan.delete:
        after.pop(key, None)
    for body in plan.create:
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key not in after:
            after[key] = stored(body)
    return after


def settle(claims: list[dict[str, Any]], workloads: dict[Any, Any]) -> dict[Any, Any]:
    for _pass in range(4):  # a name freed by a delete is taken by the next pass
        workloads = apply(records.plan_records(claims, workloads), workloads)
    return workloads


def owners(workloads: dict[Any, Any]) -> list[str]:
    return sorted(str(records.owner_uid(w)) for w in workloads.values())


def test_two_orders_whose_long_names_agree_up_to_the_cut_get_a_record_each() -> None:
    long = "x" * 250
    a, b = claim(long + "aaa", "uid-a"), claim(long + "bbb", "uid-b")
    after = settle([a, b], {})
    assert owners(after) == ["uid-a", "uid-b"]
    for key in after:
        assert len(key[1]) <= 253, key


def test_a_record_cut_loose_by_the_tenant_is_replaced_by_one_of_the_claims_own() -> None:
    held = claim("vm-gpu", "uid-1")
    first = settle([held], {})
    [(key, record)] = list(first.items())
    orphan = {**record, "metadata": {**record["metadata"], "ownerReferences": []}}
    after = settle([held], {key: orphan})
    assert owners(after) == ["uid-1"], "the orphan went and the claim has its own again"


def test_a_record_no_held_claim_owns_is_removed_and_never_bills_a_later_claim() -> None:
    gone = claim("vm-gpu", "uid-old", count=4)
    left = settle([gone], {})
    later = claim("vm-gpu", "uid-new", count=1)
    after = settle([later], left)
    [record] = after.values()
    assert records.owner_uid(record) == "uid-new"
    assert record["status"]["resources"] == {keys.quota_key("h100"): "1"}


def test_records_of_others_are_left_alone() -> None:
    foreign = {("ns", "billing-x"): {"metadata": {"name": "billing-x", "namespace": "ns"}}}
    assert records.plan_records([], foreign) == records.RecordPlan()


NAMES = st.text(alphabet="ab-", min_size=1, max_size=6).map(lambda s: "c" + s)


@given(
    st.lists(st.tuples(NAMES, st.sampled_from(["u1", "u2", "u3", "u4"])), max_size=6),
    st.lists(st.tuples(NAMES, st.sampled_from(["u1", "u2", "u5", None])), max_size=6),
)
def test_after_a_few_passes_every_held_order_has_exactly_one_record_of_its_own(
    held: list[tuple[str, str]], before: list[tuple[str, str | None]]
) -> None:
    claims = {uid: claim(name, uid) for name, uid in held}
    workloads: dict[Any, Any] = {}
    for name, uid in before:  # records left from earlier claims, some cut loose
        body = records.usage_record(claim(name, uid or "x"))
        if uid is None:
            body["metadata"]["ownerReferences"] = []
        workloads[(NS, body["metadata"]["name"])] = stored(body)
    after = settle(list(claims.values()), workloads)
    assert owners(after) == sorted(claims), after
    assert records.plan_records(list(claims.values()), after) == records.RecordPlan()
