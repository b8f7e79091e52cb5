"""The set-shape rule, one home for the VMI webhook and the snapshot (model/set_shape)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu.keys import Mode
from cozystack_gpu.model.set_shape import ClassShape, SetMember, judge_set_shape
from cozystack_gpu.model.types import Reason

CLASSES = ("a", "b", "c", "gone")
shapes = st.fixed_dictionaries(
    {
        name: st.builds(
            ClassShape,
            mode=st.sampled_from(list(Mode)),
            deleting=st.booleans(),
            max_count=st.one_of(st.none(), st.integers(0, 4)),
        )
        for name in CLASSES[:3]
    }
)
members = st.lists(
    st.builds(
        SetMember,
        class_name=st.sampled_from(CLASSES),
        count=st.integers(1, 4),
        order=st.booleans(),
        label=st.sampled_from(["", "GPUClaim x"]),
    ),
    min_size=1,
    max_size=5,
)


@given(members, shapes, st.booleans())
def test_a_set_is_refused_for_its_shape_exactly_when_a_rule_says_so(
    set_: list[SetMember], classes: dict[str, ClassShape], max_count: bool
) -> None:
    demand, refusal = judge_set_shape(set_, classes, max_count=max_count)
    missing = [m for m in set_ if m.class_name not in classes]
    deleting = [m for m in set_ if m.class_name in classes and classes[m.class_name].deleting]
    if refusal is None:
        assert not missing
        assert not any(m.order for m in deleting), "a new order of a class being deleted"
        assert sum(demand.values()) == sum(m.count for m in set_)
        assert len([n for n in demand if classes[n].mode is Mode.VGPU]) <= 1
        if max_count:
            for name, units in demand.items():
                limit = classes[name].max_count
                assert limit is None or limit == 0 or units <= limit
        return
    assert refusal.message, "a refusal says why"
    if refusal.reason is Reason.MAX_COUNT_EXCEEDED:
        assert max_count, "units already held are never refused for maxCount"
    if refusal.reason is Reason.CLASS_DELETING:
        assert any(m.order for m in deleting)


def test_the_refusal_names_the_member_it_is_about() -> None:
    classes = {"a": ClassShape(Mode.PASSTHROUGH, deleting=True, max_count=None)}
    _demand, missing = judge_set_shape(
        [SetMember("b", 1, order=False, label="GPUClaim x")], classes, max_count=True
    )
    assert missing is not None and missing.message == "class b of GPUClaim x does not exist"
    _demand, deleting = judge_set_shape(
        [SetMember("a", 1, order=True, label="claim template gpu")], classes, max_count=True
    )
    assert deleting is not None and deleting.message == (
        "class a is being deleted and takes no new orders (claim template gpu)"
    )
    _demand, held = judge_set_shape([SetMember("a", 1, order=False)], classes, max_count=True)
    assert held is None, "units already held of a class being deleted stay"
