"""The view's counted unions (GPU resource names by source, other devices' names by GPUNode):
after any sequence of changes the union is that of the sets held now, and a change says
whether it moved the union."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu.cluster.counted_union import CountedUnion

SOURCES = st.sampled_from(["class/a", "class/b", "node/n1", "gpunode/n1", "extra"])
MEMBERS = st.frozensets(st.sampled_from(["nvidia.com/A", "nvidia.com/B", "nvidia.com/C"]))


@given(st.lists(st.tuples(SOURCES, MEMBERS), max_size=40))
def test_the_union_is_that_of_the_sets_held_now_and_a_change_says_when_it_moved(
    changes: list[tuple[str, frozenset[str]]],
) -> None:
    union = CountedUnion()
    held: dict[str, frozenset[str]] = {}
    for source, members in changes:
        before = frozenset().union(*held.values())
        held[source] = members
        after = frozenset().union(*held.values())
        assert union.set(source, members) == (after != before)
        assert union.members() == after
        assert set(union) == after and all(m in union for m in after)
