"""One node's units of each ``dra`` class (``objects.dra.node_units``): a class counts the
devices it matches that no ResourceClaim holds but its own claims' held on this node, and
two classes that match one device (or one PCI function) are served by neither there."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cozystack_gpu.objects.dra import (
    ClaimKey,
    compile_matcher,
    holders_of,
    node_devices,
    node_units,
)
from cozystack_gpu_testkit.dra_objects import (
    H100,
    L40S,
    VFIO_DEVICE_CLASS,
    allocated,
    gpu_device,
    passthrough_node,
    resource_slice,
    vfio_device,
)

VFIO = compile_matcher(VFIO_DEVICE_CLASS)
PRODUCT = "device.attributes['gpu.nvidia.com'].productName == '{}'"
H100_ONLY = compile_matcher(VFIO_DEVICE_CLASS, [PRODUCT.format(H100)], "h100")
L40S_ONLY = compile_matcher(VFIO_DEVICE_CLASS, [PRODUCT.format(L40S)], "l40s")
CONTAINER_GPUS = compile_matcher(
    {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}
    ]}}
)  # fmt: skip


def _mixed_node() -> list[dict[str, object]]:
    """n1: two H100 and two L40S, each in its vfio form alone."""
    devices = [vfio_device(0), vfio_device(1), vfio_device(2, L40S), vfio_device(3, L40S)]
    return [resource_slice("n1", devices)]


def test_two_classes_of_disjoint_devices_each_count_their_own() -> None:
    [devices] = node_devices(_mixed_node()).values()
    units = node_units("n1", devices, {}, {"h100": H100_ONLY, "l40s": L40S_ONLY}, {})
    assert dict(units.free) == {"h100": 2, "l40s": 2}
    assert units.shared == frozenset()


def test_two_classes_that_match_one_device_are_both_shared_on_that_node() -> None:
    [devices] = node_devices(_mixed_node()).values()
    units = node_units("n1", devices, {}, {"all": VFIO, "h100": H100_ONLY, "l40s": L40S_ONLY}, {})
    assert units.shared == frozenset({"all", "h100", "l40s"})


def test_two_forms_of_one_gpu_in_two_classes_are_shared_by_its_pci_function() -> None:
    """The vfio class and a container class never match the same device, but they match
    the two forms of one GPU, of which only one can ever be prepared."""
    [devices] = node_devices(passthrough_node("n1", 2)).values()
    units = node_units("n1", devices, {}, {"vfio": VFIO, "containers": CONTAINER_GPUS}, {})
    assert dict(units.free) == {"vfio": 2, "containers": 2}
    assert units.shared == frozenset({"vfio", "containers"})


def test_a_classs_own_claim_held_here_leaves_its_devices_counted_and_no_other_classs() -> None:
    """h100's claim c1, held on n1, has its ResourceClaim allocated there: the model takes
    its unit off through the hold, so its device stays in h100's count. To l40s, and for a
    claim held elsewhere, the device is taken."""
    [devices] = node_devices(_mixed_node()).values()
    holders = holders_of([allocated("c1", "n1", ["gpu-vfio-0"])])
    c1 = ClaimKey("tenant", "c1")
    matchers = {"h100": H100_ONLY, "l40s": L40S_ONLY}
    assert node_units("n1", devices, holders, matchers, {c1: ("h100", "n1")}).free["h100"] == 2
    assert node_units("n1", devices, holders, matchers, {c1: ("h100", "n2")}).free["h100"] == 1
    assert node_units("n1", devices, holders, matchers, {c1: ("h100", "")}).free["h100"] == 1
    assert node_units("n1", devices, holders, matchers, {}).free["h100"] == 1
    assert node_units("n1", devices, holders, matchers, {c1: ("l40s", "n1")}).free["h100"] == 1


def test_a_held_container_form_takes_its_vfio_sibling_away() -> None:
    [devices] = node_devices(passthrough_node("n1", 2)).values()
    holders = holders_of([allocated("pod-claim", "n1", ["gpu-1"])])
    assert node_units("n1", devices, holders, {"vfio": VFIO}, {}).free["vfio"] == 1


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.integers(min_value=0, max_value=6),
    held=st.sets(st.integers(min_value=0, max_value=5)),
    containers=st.sets(st.integers(min_value=0, max_value=5)),
)
def test_a_class_never_counts_a_device_or_a_function_someone_else_holds(
    gpus: int, held: set[int], containers: set[int]
) -> None:
    """Free units are the matching devices less those held by others and less those whose
    sibling form another claim holds, never below zero and never above what it matches."""
    slices = [
        resource_slice("n1", [d for i in range(gpus) for d in (gpu_device(i), vfio_device(i))])
    ]
    devices = node_devices(slices).get("n1", ())
    claims = [allocated(f"v{i}", "n1", [f"gpu-vfio-{i}"]) for i in held if i < gpus]
    claims += [allocated(f"g{i}", "n1", [f"gpu-{i}"]) for i in containers if i < gpus]
    units = node_units("n1", devices, holders_of(claims), {"vfio": VFIO}, {})
    busy = {i for i in held | containers if i < gpus}
    assert units.free["vfio"] == gpus - len(busy)
    assert units.matching["vfio"] == gpus
