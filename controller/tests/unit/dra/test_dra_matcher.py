"""The device matcher of the ``dra`` source: a DeviceClass's selectors and a GPUClass's own,
judged as kube-scheduler judges them, and conservative (no match, with the reason) where
this controller's CEL evaluator cannot judge."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import cel
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu.objects import dra_cel
from cozystack_gpu.objects.dra import DeviceId, SliceDevice, compile_matcher, selector_errors
from cozystack_gpu_testkit.dra_objects import (
    DRIVER,
    H100,
    L40S,
    VFIO_DEVICE_CLASS,
    gpu_device,
    vfio_device,
)


def device(raw: dict[str, Any], driver: str = DRIVER, node: str = "n1") -> SliceDevice:
    return SliceDevice(
        id=DeviceId(driver, node, raw["name"]),
        node=node,
        attributes=raw.get("attributes") or {},
        capacity=raw.get("capacity") or {},
    )


def test_the_vfio_device_class_matches_the_vfio_form_of_a_gpu_only() -> None:
    matcher = compile_matcher(VFIO_DEVICE_CLASS)
    assert matcher.errors == ()
    assert matcher.matches(device(vfio_device(0)))
    assert not matcher.matches(device(gpu_device(0)))
    # Another driver's device with the same attributes: the driver guard ends it.
    assert not matcher.matches(device(vfio_device(0), driver="gpu.example.com"))


def test_a_class_selector_narrows_the_device_class() -> None:
    matcher = compile_matcher(
        VFIO_DEVICE_CLASS,
        ["device.attributes['gpu.nvidia.com'].productName.startsWith('GH100')"],
        class_name="h100",
    )
    assert matcher.matches(device(vfio_device(0, H100)))
    assert not matcher.matches(device(vfio_device(0, L40S)))


def test_a_selector_written_as_a_device_class_writes_one_is_read_too() -> None:
    shaped = {"cel": {"expression": "device.attributes['gpu.nvidia.com'].numa == 1"}}
    matcher = compile_matcher(VFIO_DEVICE_CLASS, [shaped])
    assert [matcher.matches(device(vfio_device(i))) for i in (0, 4)] == [False, True]


def test_bare_names_belong_to_the_drivers_domain_and_qualified_ones_to_theirs() -> None:
    matcher = compile_matcher(
        VFIO_DEVICE_CLASS,
        [
            "device.attributes['resource.kubernetes.io'].pciBusID == '0000:17:00.0'",
            "!('pciBusID' in device.attributes['gpu.nvidia.com'])",
            "device.attributes['gpu.nvidia.com'].vendorID == '0x10de'",
        ],
    )
    assert matcher.errors == ()
    assert [matcher.matches(device(vfio_device(i))) for i in (0, 1)] == [True, False]


def test_a_domain_the_device_lacks_reads_as_an_empty_map_as_in_kubernetes() -> None:
    absent = "device.attributes['other.example.com']"
    for expression in (
        f"!has({absent}.model)",
        f"{absent}.size() == 0",
        f"!('model' in {absent})",
        "device.capacity['other.example.com'].size() == 0",
    ):
        matcher = compile_matcher(VFIO_DEVICE_CLASS, [expression])
        assert matcher.matches(device(vfio_device(0))), expression
    # The empty map is what a lookup by name gives; the device's own domains stay as they are.
    assert not compile_matcher(
        VFIO_DEVICE_CLASS, ["'other.example.com' in device.attributes"]
    ).matches(device(vfio_device(0)))


def test_an_evaluation_error_matches_nothing_and_says_which_selector_and_device() -> None:
    # An unknown field of an existing domain: Kubernetes fails the evaluation too.
    matcher = compile_matcher(
        VFIO_DEVICE_CLASS, ["device.attributes['gpu.nvidia.com'].model == 'x'"], "h100"
    )
    judgement = matcher.judge(device(vfio_device(0)))
    assert not judgement.matches
    assert "selector #0 of GPUClass h100" in judgement.error
    assert "gpu.nvidia.com/n1/gpu-vfio-0" in judgement.error


def test_a_result_that_is_not_a_bool_matches_nothing() -> None:
    matcher = compile_matcher(VFIO_DEVICE_CLASS, ["device.attributes['gpu.nvidia.com'].numa"])
    judgement = matcher.judge(device(vfio_device(0)))
    assert not judgement.matches
    assert "not a bool" in judgement.error


def test_the_first_false_selector_ends_the_judgement_as_in_kubernetes() -> None:
    # The device class refuses the gpu form before the class selector, which would fail on
    # it (a gpu device has no iommuFDEnabled), is evaluated.
    matcher = compile_matcher(
        VFIO_DEVICE_CLASS, ["!device.attributes['gpu.nvidia.com'].iommuFDEnabled"]
    )
    assert matcher.judge(device(gpu_device(0))).error == ""
    assert matcher.matches(device(vfio_device(0)))


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("device.driver ==", "does not compile"),
        ("", "is empty"),
        ("device.attributes['gpu.nvidia.com'].?type.orValue('') == 'vfio'", "does not compile"),
        ("cel.bind(g, device.attributes['gpu.nvidia.com'], g.numa == 0)", "uses bind"),
        ("device.attributes['gpu.nvidia.com'].productName.lowerAscii() == 'x'", "lowerAscii"),
    ],
)
def test_a_selector_that_cannot_be_compiled_is_named_with_its_expression(
    expression: str, words: str
) -> None:
    errors = selector_errors(VFIO_DEVICE_CLASS, [expression], class_name="h100")
    assert len(errors) == 1
    assert "selector #0 of GPUClass h100" in errors[0]
    assert repr(expression) in errors[0]
    assert words in errors[0]
    assert not compile_matcher(VFIO_DEVICE_CLASS, [expression]).matches(device(vfio_device(0)))


def test_a_broken_device_class_is_named_and_its_class_matches_nothing() -> None:
    broken = {"metadata": {"name": "bad"}, "spec": {"selectors": [{"cel": {"expression": "("}}]}}
    (error,) = selector_errors(broken)
    assert error.startswith("selector #0 of DeviceClass bad")
    unknown_kind = {"metadata": {"name": "future"}, "spec": {"selectors": [{"match": {}}]}}
    assert "not a CEL selector" in selector_errors(unknown_kind)[0]


def test_a_missing_device_class_matches_nothing() -> None:
    matcher = compile_matcher(None)
    assert matcher.errors == ("the DeviceClass does not exist",)
    assert not matcher.matches(device(vfio_device(0)))


def test_an_attribute_of_no_known_kind_matches_nothing() -> None:
    raw = vfio_device(0)
    raw["attributes"]["future"] = {"list": ["a"]}
    judgement = compile_matcher(VFIO_DEVICE_CLASS).judge(device(raw))
    assert not judgement.matches
    assert "no known kind" in judgement.error


def test_capacity_compares_as_a_quantity() -> None:
    memory = "device.capacity['gpu.nvidia.com'].addressableMemory"
    for expression, expected in (
        (f"{memory}.compareTo(quantity('100Gi')) > 0", True),
        (f"{memory} == quantity('131072Mi')", True),
        (f"{memory}.isLessThan(quantity('128Gi'))", False),
        (f"{memory}.isGreaterThan(quantity('137438953472'))", False),
        (f"{memory}.asInteger() == 137438953472", True),
    ):
        matcher = compile_matcher(VFIO_DEVICE_CLASS, [expression])
        assert matcher.errors == ()
        assert matcher.matches(device(vfio_device(0))) is expected, expression


def test_version_attributes_compare_by_semantic_version_precedence() -> None:
    version = "device.attributes['gpu.nvidia.com'].driverVersion"
    any_gpu = {"metadata": {"name": "gpu"}, "spec": {}}
    for expression, expected in (
        (f"{version}.isGreaterThan(semver('550.54.15'))", True),
        (f"{version} == semver('580.65.6+build.1')", True),
        (f"{version}.major() == 580 && {version}.minor() == 65", True),
        (f"{version}.compareTo(semver('v580.65', true)) > 0", True),
        (f"{version}.isLessThan(semver('580.65.6-rc.1'))", False),
        (f"{version} == semver('580.65.7')", False),
    ):
        matcher = compile_matcher(any_gpu, [expression])
        assert matcher.matches(device(gpu_device(0))) is expected, expression


# The precedence order of semver.org's own example, lowest first.
SEMVER_ORDER = [
    "1.0.0-alpha",
    "1.0.0-alpha.1",
    "1.0.0-alpha.beta",
    "1.0.0-beta",
    "1.0.0-beta.2",
    "1.0.0-beta.11",
    "1.0.0-rc.1",
    "1.0.0",
    "1.0.1",
    "1.10.0",
    "2.0.0",
]


@given(st.integers(0, len(SEMVER_ORDER) - 1), st.integers(0, len(SEMVER_ORDER) - 1))
def test_semver_compare_to_follows_semver_precedence(i: int, j: int) -> None:
    expression = f"semver('{SEMVER_ORDER[i]}').compareTo(semver('{SEMVER_ORDER[j]}'))"
    assert cel.compile(expression).execute(cel.Context(functions=dra_cel.KUBERNETES_FUNCTIONS)) == (
        i > j
    ) - (i < j)


SUFFIXES = ["", "n", "u", "m", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "E-2"]


@given(st.integers(-(10**6), 10**6), st.sampled_from(SUFFIXES), st.sampled_from(SUFFIXES))
def test_quantities_are_equal_exactly_when_their_values_are(
    number: int, left: str, right: str
) -> None:
    """``quantity(a) == quantity(b)`` compares values, however each is written."""
    a, b = dra_cel.parse_quantity(f"{number}{left}"), dra_cel.parse_quantity(f"{number}{right}")
    assert a is not None and b is not None
    expression = f"quantity('{number}{left}') == quantity('{number}{right}')"
    result = cel.compile(expression).execute(cel.Context(functions=dra_cel.KUBERNETES_FUNCTIONS))
    assert result is (a == b)


def test_quantity_parsing_is_exact() -> None:
    parse = dra_cel.parse_quantity
    assert parse("80Gi") == 80 * 2**30
    assert parse("500m") == Fraction(1, 2)
    assert parse("1.5k") == 1500
    assert parse("-.5Ki") == -512
    assert parse("12e-1") == Fraction(6, 5)
    assert parse("1Gb") is None
    assert parse("") is None


def test_the_standard_functions_named_as_supported_are_evaluated() -> None:
    """Guards an upgrade of the library: each function the compile check lets through."""
    samples = {
        "size": "size('ab') == 2",
        "startsWith": "'ab'.startsWith('a')",
        "endsWith": "'ab'.endsWith('b')",
        "contains": "'abc'.contains('b')",
        "matches": "'abc'.matches('^a.c$')",
        "int": "int('5') == 5",
        "uint": "uint(5) == 5u",
        "double": "double(5) == 5.0",
        "string": "string(5) == '5'",
        "bytes": "bytes('a') == b'a'",
        "type": "type(1) == int",
        "dyn": "dyn(1) == 1",
        "duration": "duration('2s') > duration('1s')",
        "timestamp": "timestamp('2026-01-02T00:00:00Z') > timestamp('2026-01-01T00:00:00Z')",
    }
    assert set(samples) == dra_cel.STANDARD_FUNCTIONS
    for name, expression in samples.items():
        assert cel.compile(expression).execute({}) is True, name
