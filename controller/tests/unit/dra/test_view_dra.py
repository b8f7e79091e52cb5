"""The cluster view gives the model a ``dra`` class's units from the nodes' ResourceSlices
(SPEC §13): built when first read, and again for the nodes a slice, a ResourceClaim's
allocation, a claim of the class or a DeviceClass touches; a node where two classes match
one device serves neither."""

from __future__ import annotations

import copy
from typing import Any

from cozystack_gpu import keys
from cozystack_gpu.cluster.view import ClusterView
from cozystack_gpu.model import ClaimKey
from cozystack_gpu.objects import dra, translate
from cozystack_gpu_testkit.dra_objects import (
    L40S,
    VFIO_DEVICE_CLASS,
    allocated,
    dra_class,
    gpu_claim,
    passthrough_node,
    resource_slice,
    vfio_device,
)
from cozystack_gpu_testkit.objects import binder_config

NOW = 1_800_000_000.0
H100_KEY = translate.dra_units_key("h100")
WATCHES = (*keys.BINDER_WATCHES, keys.RESOURCE_SLICE, keys.DEVICE_CLASS, keys.RESOURCE_CLAIM)
PRODUCT = "device.attributes['gpu.nvidia.com'].productName == '{}'"


def _node(name: str, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def _view(*objects: tuple[keys.ApiKind, dict[str, Any]]) -> ClusterView:
    view = ClusterView(binder_config("ctl"), WATCHES)
    for n, (kind, obj) in enumerate(objects, start=1):
        obj = copy.deepcopy(obj)
        obj.setdefault("metadata", {}).setdefault("resourceVersion", str(n))
        view.apply(kind.kind, obj, deleted=False)
    return view


def _put(
    view: ClusterView, kind: keys.ApiKind, obj: dict[str, Any], version: int, deleted: bool = False
) -> None:
    """``obj`` at resource version ``version`` (created, changed or ``deleted``)."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["resourceVersion"] = str(version)
    view.apply(kind.kind, obj, deleted=deleted)


def _plane(gpus: int = 4) -> ClusterView:
    return _view(
        (keys.NODE, _node("n1")),
        (keys.NODE, _node("n2")),
        (keys.DEVICE_CLASS, VFIO_DEVICE_CLASS),
        (keys.GPU_CLASS, dra_class("h100")),
        *((keys.RESOURCE_SLICE, s) for s in passthrough_node("n1", gpus)),
        *((keys.RESOURCE_SLICE, s) for s in passthrough_node("n2", 2)),
    )


def _bound(name: str, node: str, count: int = 1, version: int = 100) -> dict[str, Any]:
    claim = gpu_claim(name, count)
    claim["metadata"]["resourceVersion"] = str(version)
    claim["status"] = {"phase": "Bound", "nodeName": node}
    return claim


def _ours(name: str, node: str, devices: list[str], version: int = 200) -> dict[str, Any]:
    """The ResourceClaim the controller made for claim ``name``, allocated on ``node``."""
    made = dra.resource_claim_for(gpu_claim(name), dra.DraSource("vfio.gpu.nvidia.com"))
    made["status"] = allocated(name, node, devices)["status"]
    made["metadata"]["resourceVersion"] = str(version)
    return made


def test_a_dra_class_has_the_vfio_devices_of_each_nodes_slices_as_units() -> None:
    snap = _plane().build_snapshot(NOW)
    assert snap.capacity("n1", H100_KEY) == 4
    assert snap.capacity("n2", H100_KEY) == 2
    assert snap.serves("n1", "h100")
    assert snap.gpu_class("h100").resource_name == H100_KEY  # type: ignore[union-attr]


def test_a_device_another_resource_claim_holds_is_no_unit_until_it_lets_go() -> None:
    view = _plane()
    snap = view.build_snapshot(NOW)
    foreign = allocated("someone-elses", "n1", ["gpu-vfio-0", "gpu-vfio-1"])
    foreign["metadata"]["resourceVersion"] = "50"
    view.apply(keys.RESOURCE_CLAIM.kind, foreign, deleted=False)
    _changed, dirty = view.sync_into(snap, NOW)
    assert dirty.nodes == {"n1"}, "only the node of the allocated devices is built again"
    assert snap.capacity("n1", H100_KEY) == 2
    _put(view, keys.RESOURCE_CLAIM, foreign, 51, deleted=True)
    view.sync_into(snap, NOW)
    assert snap.capacity("n1", H100_KEY) == 4


def test_a_claims_own_allocation_stays_a_unit_where_it_is_held_and_not_elsewhere() -> None:
    """Claim c holds one unit on n1 and its ResourceClaim is allocated there: the model
    takes the unit off through the hold (free 3 of 4). Once the claim is held on n2, the
    device on n1 is someone's: n1 gives 3 units, of which none is c's."""
    view = _plane()
    view.apply(keys.GPU_CLAIM.kind, _bound("c", "n1"), deleted=False)
    view.apply(keys.RESOURCE_CLAIM.kind, _ours("c", "n1", ["gpu-vfio-0"]), deleted=False)
    snap = view.build_snapshot(NOW)
    assert snap.capacity("n1", H100_KEY) == 4
    assert snap.free("n1", H100_KEY) == 3
    view.apply(keys.GPU_CLAIM.kind, _bound("c", "n2", version=101), deleted=False)
    view.sync_into(snap, NOW)
    assert snap.capacity("n1", H100_KEY) == 3, (
        "its allocation on n1 holds a device no unit stands for"
    )
    assert snap.free("n1", H100_KEY) == 3
    assert snap.free("n2", H100_KEY) == 1


def test_a_resource_claim_naming_a_claim_it_was_not_made_for_holds_its_devices() -> None:
    """A ResourceClaim of the claim's name whose controller reference names another uid (a
    tenant's copy) is anyone's: its devices are taken, whatever claim holds units there."""
    view = _plane()
    view.apply(keys.GPU_CLAIM.kind, _bound("c", "n1"), deleted=False)
    forged = _ours("c", "n1", ["gpu-vfio-0", "gpu-vfio-1"])
    forged["metadata"]["ownerReferences"][0]["uid"] = "not-the-claims"
    view.apply(keys.RESOURCE_CLAIM.kind, forged, deleted=False)
    snap = view.build_snapshot(NOW)
    assert snap.capacity("n1", H100_KEY) == 2
    assert snap.free("n1", H100_KEY) == 1


def test_two_classes_matching_one_device_serve_neither_on_that_node() -> None:
    l40s_node = resource_slice("n3", [vfio_device(0, L40S), vfio_device(1, L40S)])
    view = _plane()
    _put(view, keys.NODE, _node("n3"), 300)
    _put(view, keys.RESOURCE_SLICE, l40s_node, 301)
    everything = dra_class("any-gpu")
    everything["metadata"]["resourceVersion"] = "302"
    view.apply(keys.GPU_CLASS.kind, everything, deleted=False)
    snap = view.build_snapshot(NOW)
    assert not snap.serves("n1", "h100") and not snap.serves("n1", "any-gpu")
    assert "another dra class also matches" in str(
        snap.why_not_placeable(snap.node("n1"), snap.gpu_class("h100"))  # type: ignore[arg-type]
    )
    # h100 as written matches every vfio device too; narrowed to H100s, n3 is any-gpu's.
    narrowed = dra_class("h100", selectors=[PRODUCT.format("GH100 [H100 SXM5 80GB]")])
    narrowed["metadata"]["resourceVersion"] = "303"
    view.apply(keys.GPU_CLASS.kind, narrowed, deleted=False)
    view.sync_into(snap, NOW)
    assert snap.serves("n3", "any-gpu")
    assert snap.capacity("n3", H100_KEY) == 0, "no device of n3 is an H100"
    assert not snap.serves("n1", "any-gpu"), "n1's H100s are matched by both still"


def test_a_missing_device_class_gives_its_classes_no_units_until_it_comes() -> None:
    view = _view(
        (keys.NODE, _node("n1")),
        (keys.GPU_CLASS, dra_class("h100")),
        *((keys.RESOURCE_SLICE, s) for s in passthrough_node("n1", 2)),
    )
    snap = view.build_snapshot(NOW)
    assert snap.capacity("n1", H100_KEY) == 0
    device_class = copy.deepcopy(VFIO_DEVICE_CLASS)
    device_class["metadata"]["resourceVersion"] = "9"
    view.apply(keys.DEVICE_CLASS.kind, device_class, deleted=False)
    view.sync_into(snap, NOW)
    assert snap.capacity("n1", H100_KEY) == 2


def test_a_node_whose_slice_is_withdrawn_has_no_units() -> None:
    view = _plane()
    snap = view.build_snapshot(NOW)
    [withdrawn] = passthrough_node("n2", 2)
    withdrawn["metadata"]["resourceVersion"] = "99"
    view.apply(keys.RESOURCE_SLICE.kind, withdrawn, deleted=True)
    _changed, dirty = view.sync_into(snap, NOW)
    assert "n2" in dirty.nodes and "n1" not in dirty.nodes
    assert snap.capacity("n2", H100_KEY) == 0
    assert ClaimKey("tenant", "x") not in set(dirty.claims)


def test_kubectl_gpu_counts_a_dra_classs_units_from_the_listed_slices() -> None:
    """The kubectl plugin judges from one listing: with the DRA objects in it, a dra class
    has its slices' devices; without them (not served, or not readable), none."""
    from cozystack_gpu.cli.top import class_rows

    listing: dict[str, list[dict[str, Any]]] = {
        keys.NODE.kind: [_node("n1")],
        keys.GPU_CLASS.kind: [dra_class("h100")],
        keys.RESOURCE_SLICE.kind: passthrough_node("n1", 3),
        keys.DEVICE_CLASS.kind: [VFIO_DEVICE_CLASS],
    }
    [row] = class_rows(listing, binder_config("ctl"), NOW)
    assert (row["class"], row["allocatable"], row["free"]) == ("h100", 3, 3)
    without = {k: v for k, v in listing.items() if k != keys.RESOURCE_SLICE.kind}
    [row] = class_rows(without, binder_config("ctl"), NOW)
    assert row["allocatable"] == 0
