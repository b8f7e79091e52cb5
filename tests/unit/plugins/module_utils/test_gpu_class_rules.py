"""The cross-class rule CEL cannot check: a shared resourceName needs disjoint nodeSelectors."""

from __future__ import annotations

import pytest
from ansible_collections.cozystack.gpu.plugins.module_utils import gpu_class_rules as rules


def spec(resource_name="nvidia.com/NVIDIA_L40S-24C", **selector):
    return {
        "mode": "vgpu",
        "source": {"devicePlugin": {"resourceName": resource_name}},
        "nodeSelector": selector,
    }


@pytest.mark.parametrize(
    "a,b,overlap",
    [
        ({}, {}, True),
        ({}, {"pool": "a"}, True),
        ({"pool": "a"}, {"pool": "a"}, True),
        ({"pool": "a"}, {"pool": "b"}, False),
        ({"pool": "a"}, {"zone": "x"}, True),
        ({"pool": "a", "zone": "x"}, {"zone": "y", "pool": "a"}, False),
        (None, {"pool": "a"}, True),
    ],
)
def test_selectors_overlap_unless_one_key_demands_different_values(a, b, overlap):
    first, second = a, b
    assert rules.selectors_overlap(first, second) is overlap
    assert rules.selectors_overlap(second, first) is overlap  # symmetric


def test_a_shared_resource_name_on_overlapping_nodes_conflicts():
    others = [("b-other", spec(pool="l40s")), ("a-other", spec()), ("c-free", spec(pool="h100"))]
    conflicts = rules.resource_name_conflicts("mine", spec(pool="l40s"), others)
    assert [c.other for c in conflicts] == ["a-other", "b-other"]
    assert conflicts[0].message("mine") == (
        "GPUClass mine: resourceName nvidia.com/NVIDIA_L40S-24C is already served by GPUClass"
        " a-other on overlapping nodes; two classes may share a resourceName only when their"
        " nodeSelectors do not overlap"
    )


def test_disjoint_selectors_other_names_and_the_class_itself_do_not_conflict():
    others = [
        ("mine", spec(pool="l40s")),  # the stored version of the class being updated
        ("other-pool", spec(pool="l40s-b")),
        ("other-name", spec("nvidia.com/NVIDIA_L40S-12C", pool="l40s")),
        ("no-source", {"mode": "vgpu"}),
    ]
    assert rules.resource_name_conflicts("mine", spec(pool="l40s"), others) == []


def test_a_class_without_a_resource_name_never_conflicts():
    assert rules.resource_name_conflicts("x", {"mode": "vgpu"}, [("y", {"mode": "vgpu"})]) == []
    assert rules.resource_name_of(None) is None
    assert rules.resource_name_of({"source": {"devicePlugin": {"resourceName": ""}}}) is None
