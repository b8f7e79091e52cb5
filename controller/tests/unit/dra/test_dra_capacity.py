"""What a node's ResourceSlices give a ``dra`` class: the newest generation of each pool,
less what other ResourceClaims hold; and, with the model's holds, SPEC §13's capacity."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cozystack_gpu.objects.dra import (
    ClaimKey,
    DeviceId,
    compile_matcher,
    dra_capacity,
    node_devices,
)
from cozystack_gpu_testkit.dra_objects import (
    DRIVER,
    VFIO_DEVICE_CLASS,
    allocated,
    gpu_device,
    passthrough_node,
    resource_slice,
    vfio_device,
)

VFIO = compile_matcher(VFIO_DEVICE_CLASS)


def free(
    slices: list[Any], claims: list[Any] | None = None, ours: dict[ClaimKey, str] | None = None
) -> dict[str, int]:
    return dict(dra_capacity(slices, claims or [], VFIO, ours or {}).free)


def test_every_vfio_form_of_a_nodes_gpus_counts_and_no_container_form() -> None:
    assert free(passthrough_node("n1", 8) + passthrough_node("n2", 2)) == {"n1": 8, "n2": 2}


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = passthrough_node("n1", 8, generation=3)
    new = passthrough_node("n1", 6, generation=4)
    assert free(old + new) == {"n1": 6}
    assert free(new + old) == {"n1": 6}


def test_a_pool_being_rewritten_gives_nothing_until_all_its_slices_are_there() -> None:
    first = resource_slice("n1", [vfio_device(0)], generation=2, count=2, name="a")
    second = resource_slice("n1", [vfio_device(1)], generation=2, count=2, name="b")
    assert free([first]) == {}
    assert free([first, second]) == {"n1": 2}


def test_a_pool_naming_a_device_twice_gives_nothing() -> None:
    twice = resource_slice("n1", [vfio_device(0), vfio_device(0)])
    assert free([twice]) == {}


def test_pools_of_one_name_from_two_drivers_are_two_pools() -> None:
    other = resource_slice("n1", [vfio_device(5)], generation=9, driver="gpu.example.com")
    slices = [*passthrough_node("n1", 2, generation=1), other]
    assert [d.id.driver for d in node_devices(slices)["n1"]].count(DRIVER) == 4


def test_devices_offered_to_several_nodes_are_no_gpus_of_one_node() -> None:
    shared = resource_slice("n1", [vfio_device(0)])
    del shared["spec"]["nodeName"]
    shared["spec"]["allNodes"] = True
    per_device = resource_slice("n1", [vfio_device(1, nodeName="n2"), vfio_device(2)], pool="p")
    del per_device["spec"]["nodeName"]
    per_device["spec"]["perDeviceNodeSelection"] = True
    assert free([shared, per_device]) == {"n2": 1}


def test_a_device_tainted_against_scheduling_is_not_counted() -> None:
    def tainted(index: int, effect: str) -> dict[str, Any]:
        return vfio_device(index, taints=[{"key": "gpu.nvidia.com/xid", "effect": effect}])

    effects = ["NoSchedule", "NoExecute", "None", "SomeFutureEffect"]
    slices = [resource_slice("n1", [tainted(i, e) for i, e in enumerate(effects)])]
    assert free(slices) == {"n1": 2}


def test_another_resource_claims_allocation_takes_its_devices() -> None:
    claims = [allocated("other", "n1", ["gpu-vfio-0", "gpu-vfio-3"])]
    capacity = dra_capacity(passthrough_node("n1", 4), claims, VFIO, {})
    assert capacity.free == {"n1": 2}
    assert capacity.matching == {"n1": 4}


def test_admin_access_holds_no_device() -> None:
    claims = [allocated("monitor", "n1", ["gpu-vfio-0"], adminAccess=True)]
    assert free(passthrough_node("n1", 2), claims) == {"n1": 2}


def test_the_container_form_of_a_gpu_taken_leaves_its_vfio_form_unfree() -> None:
    """NVIDIA's driver withdraws the sibling only at prepare time: until then both forms of
    one GPU are published, and the vfio form of a GPU a container holds is no free GPU."""
    claims = [allocated("training-job", "n1", ["gpu-1"])]
    assert free(passthrough_node("n1", 4), claims) == {"n1": 3}


def test_our_allocation_where_its_claim_holds_leaves_the_devices_to_the_models_count() -> None:
    ours = allocated("vm-gpus", "n1", ["gpu-vfio-0", "gpu-vfio-1"])
    key = ClaimKey("tenant", "vm-gpus")
    assert free(passthrough_node("n1", 4), [ours], {key: "n1"}) == {"n1": 4}


def test_our_allocation_elsewhere_than_its_claim_counts_as_anyones() -> None:
    """A claim that moved (or waits, or was lost) leaves behind an allocation no held unit
    stands for: those devices are taken until the ResourceClaim goes."""
    ours = allocated("vm-gpus", "n1", ["gpu-vfio-0"])
    key = ClaimKey("tenant", "vm-gpus")
    assert free(passthrough_node("n1", 4), [ours], {key: "n2"}) == {"n1": 3}
    assert free(passthrough_node("n1", 4), [ours], {key: ""}) == {"n1": 3}


def test_a_selector_error_is_said_once_per_text() -> None:
    matcher = compile_matcher(
        VFIO_DEVICE_CLASS, ["device.attributes['gpu.nvidia.com'].model == 'x'"], "h100"
    )
    capacity = dra_capacity(passthrough_node("n1", 2), [], matcher, {})
    assert capacity.free == {"n1": 0}
    assert len(capacity.errors) == 2  # one per device: the text names the device
    assert all("selector #0 of GPUClass h100" in e for e in capacity.errors)


# --- properties -----------------------------------------------------------------------------


def _world(seed: int) -> tuple[list[Any], list[Any], dict[ClaimKey, str]]:
    """Nodes with both forms of their GPUs; ResourceClaims holding distinct devices, of
    either form, some ours (mapped to a node, the right one or not, or none)."""
    rng = random.Random(seed)
    slices: list[Any] = []
    claims: list[Any] = []
    ours: dict[ClaimKey, str] = {}
    for n in range(rng.randint(1, 3)):
        node = f"n{n}"
        gpus = rng.randint(0, 8)
        slices += passthrough_node(node, gpus, generation=rng.randint(1, 5))
        names = [f"gpu-{i}" for i in range(gpus)] + [f"gpu-vfio-{i}" for i in range(gpus)]
        rng.shuffle(names)
        while names and rng.random() < 0.7:
            size = rng.randint(1, min(3, len(names)))
            taken, names = names[:size], names[size:]
            name = f"rc-{node}-{len(claims)}"
            claims.append(allocated(name, node, taken))
            if rng.random() < 0.5:
                ours[ClaimKey("tenant", name)] = rng.choice([node, node, "elsewhere", ""])
    return slices, claims, ours


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_capacity_is_never_negative_nor_above_the_nodes_matching_devices(seed: int) -> None:
    slices, claims, ours = _world(seed)
    capacity = dra_capacity(slices, claims, VFIO, ours)
    for node, matching in capacity.matching.items():
        assert 0 <= capacity.free[node] <= matching
    assert set(capacity.free) == set(capacity.matching)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 8), st.integers(0, 8))
def test_an_older_generation_of_a_pool_never_counts(seed: int, older: int, gpus: int) -> None:
    """Slices of an older generation, whatever they list, change nothing, in any order."""
    slices, claims, ours = _world(seed)
    before = dra_capacity(slices, claims, VFIO, ours)
    stale: list[Any] = []
    for s in slices:
        generation = s["spec"]["pool"]["generation"]
        node = s["spec"]["nodeName"]
        devices = [vfio_device(i) for i in range(gpus)] + [gpu_device(i) for i in range(older)]
        stale.append(resource_slice(node, devices, generation=generation - 1, name=f"{node}-s"))
    mixed = slices + stale
    random.Random(seed).shuffle(mixed)
    assert dra_capacity(mixed, claims, VFIO, ours) == before


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32))
def test_our_resource_claims_never_reduce_capacity_where_their_claims_hold(seed: int) -> None:
    slices, claims, ours = _world(seed)
    here = {key: node for key, node in ours.items() if node.startswith("n")}
    without = [c for c in claims if ClaimKey("tenant", c["metadata"]["name"]) not in here]
    assert dra_capacity(slices, claims, VFIO, here).free == (
        dra_capacity(slices, without, VFIO, {}).free
    )


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.integers(0, 8),
    foreign=st.integers(0, 8),
    units=st.lists(st.tuples(st.integers(1, 4), st.booleans()), max_size=4),
    seed=st.integers(0, 2**32),
)
def test_with_the_models_holds_it_is_spec_13s_capacity(
    gpus: int, foreign: int, units: list[tuple[int, bool]], seed: int
) -> None:
    """free - every held claim's units == matching - devices allocated to any ResourceClaim
    - units of claims whose ResourceClaim is not allocated yet (SPEC §13)."""
    order = [f"gpu-vfio-{i}" for i in range(gpus)]
    random.Random(seed).shuffle(order)
    foreign = min(foreign, gpus)
    claims = [allocated("other", "n1", order[:foreign])] if foreign else []
    ours: dict[ClaimKey, str] = {}
    next_free, unallocated_units = foreign, 0
    for i, (count, is_allocated) in enumerate(units):
        ours[ClaimKey("tenant", f"vm-{i}")] = "n1"
        if is_allocated and next_free + count <= gpus:
            claims.append(allocated(f"vm-{i}", "n1", order[next_free : next_free + count]))
            next_free += count
        else:
            unallocated_units += count
    held = sum(count for count, _allocated in units)
    spec_capacity = gpus - next_free - unallocated_units
    capacity = dra_capacity(passthrough_node("n1", gpus), claims, VFIO, ours)
    assert capacity.of("n1") - held == spec_capacity


def test_a_device_is_known_by_driver_pool_and_name() -> None:
    (device,) = node_devices([resource_slice("n1", [vfio_device(0)], pool="pool-a")])["n1"]
    assert device.id == DeviceId(DRIVER, "pool-a", "gpu-vfio-0")
    assert device.pci_bus_id == "0000:17:00.0"
