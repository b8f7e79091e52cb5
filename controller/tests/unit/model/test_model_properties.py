"""Properties over random clusters and random operation sequences.

Each operation is checked against an oracle that recomputes from the raw objects (see
``model_world``). CI runs a modest number of examples; set MODEL_HYPOTHESIS_EXAMPLES for a
longer run, and see BENCHMARKS.md for the million-operation stress command.
"""

from __future__ import annotations

import os
import random

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from model_digest import digest
from model_world import N_OPS, Checker, Op, oracle_best_fit, random_world

from cozystack_gpu.model import Placement, Reason, Refusal, plan

EXAMPLES = int(os.environ.get("MODEL_HYPOTHESIS_EXAMPLES", "40"))

ops_strategy = st.lists(
    st.tuples(
        st.integers(0, N_OPS - 1),
        st.integers(0, 999),
        st.integers(0, 999),
        st.integers(0, 999),
    ),
    min_size=1,
    max_size=50,
)
model_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def run(seed: int, ops: list[Op]) -> Checker:
    checker = Checker.of(random_world(random.Random(seed)), orders=seed % 16, seed=seed)
    for op in ops:
        checker.apply(op)
    return checker


@model_settings
@given(seed=st.integers(0, 2**32), ops=ops_strategy)
def test_no_decision_overcommits_a_node_exceeds_a_budget_or_splits_a_set(
    seed: int, ops: list[Op]
) -> None:
    # Checker asserts after every placement: the node serves every class of the set, holds
    # no more than its capacity, every budget key on every ancestor is within its limit,
    # and after every pass no unattached claim is left on an over-committed node.
    checker = run(seed, ops)
    checker.plan_and_commit()
    assert checker.plans >= 1


@model_settings
@given(seed=st.integers(0, 2**32), ops=ops_strategy)
def test_incremental_snapshot_equals_a_full_rebuild(seed: int, ops: list[Op]) -> None:
    checker = run(seed, ops)
    assert digest(checker.snap) == digest(checker.world.snapshot())


@model_settings
@given(seed=st.integers(0, 2**32), ops=ops_strategy)
def test_plan_is_idempotent_and_deterministic(seed: int, ops: list[Op]) -> None:
    checker = run(seed, ops)
    now = checker.world.now
    first = plan(checker.snap, now)
    assert plan(checker.world.snapshot(), now) == first
    checker.plan_and_commit()  # asserts that planning the result changes nothing
    assert plan(checker.snap, now).changes == ()


@model_settings
@given(seed=st.integers(0, 2**32), ops=ops_strategy, a=st.integers(0, 999), b=st.integers(0, 999))
def test_check_order_is_the_brute_force_best_fit(seed: int, ops: list[Op], a: int, b: int) -> None:
    checker = run(seed, ops)
    order = checker.new_claim(a, b)
    decision = checker.snap.check_order(order, checker.world.now)
    expected = (
        oracle_best_fit(checker.snapshot_view(), order)
        if order.class_name in checker.world.classes
        else None
    )
    if isinstance(decision, Placement):
        assert decision.node == expected
    elif isinstance(decision, Refusal) and decision.reason in (
        Reason.INSUFFICIENT_CAPACITY,
        Reason.NO_NODE_SERVES,
    ):
        assert expected is None


# Operations that cordon, uncordon and flip Ready (node op with b % 4 in 1, 2), order, attach
# and plan: the mix that exercises onCordon and the Stay pin.
cordon_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just(0), st.integers(0, 999), st.sampled_from([1, 2, 5, 6]), st.integers(0, 999)
        ),
        st.tuples(
            st.sampled_from([2, 3, 5, 6]),
            st.integers(0, 999),
            st.integers(0, 999),
            st.integers(0, 999),
        ),
    ),
    min_size=1,
    max_size=60,
)


@model_settings
@given(seed=st.integers(0, 2**32), ops=cordon_ops)
# A pass bound an order on the one node a later order (which skips another node) could use,
# and the next pass moved it away to bind the later one: the pass now binds it elsewhere.
@example(seed=803796621, ops=[(0, 0, 1, 0)])
def test_cordon_never_loses_a_hold_and_a_stay_pin_gives_way_only_to_lost_capacity(
    seed: int, ops: list[Op]
) -> None:
    # Checker asserts, for every set that leaves a node: cordon alone only moves it (never
    # Lost), a Stay pin holds through NotReady, and only lost capacity or a node that no
    # longer serves the set breaks a pin; after every pass no unattached claim is left on
    # a node over its capacity (which is how a Stay pin gives way).
    checker = run(seed, ops)
    checker.plan_and_commit()


def test_the_cordon_rules_are_exercised_by_the_random_worlds() -> None:
    # Guards the property above from testing nothing: over fixed seeds, sets do leave
    # cordoned or NotReady nodes, and each such departure was judged.
    rng = random.Random(20261130)
    judged = 0
    for seed in range(60):
        ops = [
            (
                rng.choice((0, 0, 2, 3, 5, 6)),
                rng.randrange(1000),
                rng.choice((1, 2, 5, 6)),
                rng.randrange(1000),
            )
            for _op in range(60)
        ]
        judged += run(seed, ops).cordon_rules_judged
    assert judged >= 10, judged
