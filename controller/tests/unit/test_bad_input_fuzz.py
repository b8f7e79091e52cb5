"""Bad input, fuzzed (hypothesis), on the pure readers: the claims annotation as the
webhook and the gate read it, kubelet's pod-resources answers as the agent reads them, and
the settings value. Nothing raises but a refusal, and a refusal says what would fix it.
(The sysfs reader has its own fuzz test; the API-side fuzzing is in
tests/integration/test_faults_bad_input.py.)"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import DeviceSet, PodDevices
from cozystack_gpu.agent.report import Shape, build_report, id_shape
from cozystack_gpu.objects import annotation, translate
from cozystack_gpu_testkit import sysfs_scenarios

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
)
names = st.one_of(st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True), st.text())
raw_annotations = st.one_of(
    st.text(),
    json_values.map(json.dumps),
    st.builds(
        lambda claims, templates: json.dumps(
            {keys.ANNOTATION_MEMBER_CLAIMS: claims, keys.ANNOTATION_MEMBER_TEMPLATES: templates}
        ),
        st.lists(st.one_of(names, json_values), max_size=3),
        st.lists(
            st.dictionaries(st.sampled_from(["name", "class", "count", "other"]), json_values)
            | st.fixed_dictionaries(
                {"name": names, "class": names}, optional={"count": st.integers(-3, 10**12)}
            ),
            max_size=3,
        ),
    ),
)


@FUZZ
@given(raw=raw_annotations)
def test_any_claims_annotation_is_read_or_refused_with_the_format(raw: str) -> None:
    vmi = {"metadata": {"name": "vm", "annotations": {keys.ANNOTATION_CLAIMS: raw}}}
    try:
        request = annotation.parse(raw)
    except annotation.AnnotationError as exc:
        message = str(exc)
        assert keys.ANNOTATION_CLAIMS in message and annotation.EXPECTED_FORMAT in message
        # The gate tells the same, unless the value is empty: that is no annotation (as
        # for the claims-label policy).
        assert annotation.claims_ref_problem(vmi) == (message if raw else None)
        assert annotation.claims_ref_of(vmi) is None
    else:
        assert request.claims or request.templates, "an annotation that asks for nothing"
        assert all(t.count >= 1 for t in request.templates)
        assert annotation.parse(annotation.encode(request)) == request
        assert annotation.claims_ref_problem(vmi) is None
        names_ = annotation.template_claim_names("vm", request)
        assert all(keys.is_dns_label(n) or len(n) <= 63 for n in names_)
    # The binder's lenient reader names claims or nothing, whatever the text.
    held = translate.claims_annotation({keys.ANNOTATION_CLAIMS: raw})
    assert all(isinstance(name, str) for name in held)


_TREE = tempfile.mkdtemp(prefix="pod-resources-fuzz-")
atexit.register(shutil.rmtree, _TREE, True)
sysfs_scenarios.mixed(_TREE)
INVENTORY = sysfs.read_inventory(_TREE)
KNOWN = sorted(f.address for f in INVENTORY.functions)
RESOURCE = "nvidia.com/FUZZ"


def _unknown_pci(bus: int) -> str:
    return f"0000:{bus:02x}:1f.7"


MDEVS = {m.uuid.lower() for m in INVENTORY.mdevs}
GROUPS = {str(f.iommu_group) for f in INVENTORY.functions if f.iommu_group is not None}


def _matches_nothing(device_id: str) -> bool:
    return (
        sysfs.canonical_pci_address(device_id) not in KNOWN
        and device_id.lower() not in MDEVS
        and device_id.lstrip("0") not in {g.lstrip("0") for g in GROUPS}
    )


unknown_ids = st.one_of(
    st.integers(0, 255).map(_unknown_pci),
    st.uuids().map(str),  # an mdev UUID no parent in the tree has
    st.integers(900, 10**30).map(str),  # an IOMMU group no vfio function is in
    st.text(max_size=40),
).filter(_matches_nothing)
resource_names = st.one_of(st.just(RESOURCE), st.text(max_size=30))


def _placeable(device_id: str) -> bool:
    return id_shape(device_id) != Shape.NVML


@FUZZ
@given(
    known=st.lists(st.sampled_from(KNOWN), max_size=6),
    unknown=st.lists(unknown_ids, min_size=1, max_size=6),
    resource=resource_names,
    pod_ids=st.lists(unknown_ids, max_size=3),
)
def test_pod_resources_answers_with_unknown_ids_count_nothing_and_are_reported(
    known: list[str], unknown: list[str], resource: str, pod_ids: list[str]
) -> None:
    """An ID kubelet reports that matches nothing in sysfs adds no unit anywhere and is
    reported under its resource name; the rest of the report is as without it."""

    def report(ids: list[str], pods: list[PodDevices]) -> dict[str, int]:
        built = build_report(INVENTORY, [DeviceSet(resource, tuple(ids))], pods, lambda *_: None)
        json.dumps(built.status())  # what the agent patches is JSON
        return {d["pciAddress"]: int(d["allocatable"]) for d in built.devices}

    pods = [PodDevices("tenant", "pod", (DeviceSet(resource, tuple(pod_ids)),))]
    assert report(known + unknown, pods) == report(known, [])
    built = build_report(INVENTORY, [DeviceSet(resource, tuple(known + unknown))], [], print)
    lost = set(built.unresolved.get(resource, []))
    assert {i for i in unknown if _placeable(i)} <= lost


@FUZZ
@given(value=st.text())
def test_a_settings_value_of_any_text_reads_as_names(value: str) -> None:
    """What a hand edit leaves in resourceNames still reads, and reads the same twice."""
    names_ = keys.parse_resource_names(value)
    assert all(n and n == n.strip() for n in names_)
    assert keys.parse_resource_names(keys.format_resource_names(names_)) == names_
