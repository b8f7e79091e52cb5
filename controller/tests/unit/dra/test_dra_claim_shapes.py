"""What the controller writes for a claim of a ``dra`` class: its ResourceClaim (one
request per unit, owned by the claim), the claim kept in its ``reservedFor``, and the VMI's
``resourceClaims`` and ``gpus`` entries in KubeVirt's DRA form."""

from __future__ import annotations

import re
import string

from hypothesis import given
from hypothesis import strategies as st

from cozystack_gpu import keys
from cozystack_gpu.admission.vmi_rules import gpu_entry_name
from cozystack_gpu.objects.dra import (
    DraSource,
    dra_source,
    is_reserved_for,
    made_for,
    request_name,
    reserved_for_entry,
    resource_claim_for,
    vmi_claim_entries,
    vmi_claim_entry_name,
)
from cozystack_gpu_testkit.dra_objects import VFIO_CLASS, dra_class, gpu_claim

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
SOURCE = DraSource(VFIO_CLASS, ("device.attributes['gpu.nvidia.com'].numa == 0",))


def test_the_resource_claim_has_the_claims_name_and_is_owned_by_it() -> None:
    claim = gpu_claim("train", count=2)
    made = resource_claim_for(claim, SOURCE)
    assert made["apiVersion"] == "resource.k8s.io/v1"
    assert made["kind"] == "ResourceClaim"
    meta = made["metadata"]
    assert (meta["namespace"], meta["name"]) == ("tenant", "train")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "gpu.cozystack.io/v1alpha1",
            "kind": "GPUClaim",
            "name": "train",
            "uid": "uid-tenant-train",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"] == {
        keys.LABEL_MANAGED_BY: keys.MANAGED_BY_CONTROLLER,
        keys.LABEL_DRA_CLASS: "h100",
    }
    assert made_for(made, claim)


def test_each_request_asks_for_one_device_of_the_device_class_and_the_class_selectors() -> None:
    (request,) = resource_claim_for(gpu_claim("one"), SOURCE)["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpu-0",
        "exactly": {
            "deviceClassName": VFIO_CLASS,
            "allocationMode": "ExactCount",
            "count": 1,
            "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].numa == 0"}}],
        },
    }
    plain = resource_claim_for(gpu_claim("one"), DraSource(VFIO_CLASS))
    assert "selectors" not in plain["spec"]["devices"]["requests"][0]["exactly"]


@given(count=st.integers(1, 16), first_unit=st.integers(0, 16))
def test_every_unit_gets_exactly_one_request_and_one_gpus_entry(
    count: int, first_unit: int
) -> None:
    made = resource_claim_for(gpu_claim("vm-gpus", count=count), SOURCE)
    requests = [r["name"] for r in made["spec"]["devices"]["requests"]]
    entries = vmi_claim_entries("vm-gpus", count, first_unit)
    assert requests == [request_name(i) for i in range(count)]
    assert [g["requestName"] for g in entries.gpus] == requests
    assert all(g["claimName"] == entries.resource_claim["name"] for g in entries.gpus)
    assert entries.resource_claim["resourceClaimName"] == "vm-gpus"
    names = [g["name"] for g in entries.gpus]
    assert names == [gpu_entry_name(first_unit + i) for i in range(count)]
    assert all(DNS_LABEL.fullmatch(n) for n in requests)


def test_two_claims_of_one_vm_never_share_a_gpus_entry_or_a_claim_entry() -> None:
    first = vmi_claim_entries("a", 2, first_unit=0)
    second = vmi_claim_entries("b", 3, first_unit=2)
    names = [g["name"] for g in first.gpus + second.gpus]
    assert len(set(names)) == 5
    assert first.resource_claim["name"] != second.resource_claim["name"]
    pairs = {(g["claimName"], g["requestName"]) for g in first.gpus + second.gpus}
    assert len(pairs) == 5  # KubeVirt refuses a (claimName, requestName) pair named twice


SUBDOMAIN_LABEL = st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=63)


@given(st.lists(SUBDOMAIN_LABEL, min_size=1, max_size=4))
def test_a_claims_vmi_entry_name_is_a_dns_label_for_any_claim_name(labels: list[str]) -> None:
    name = ".".join(label.strip("-") or "a" for label in labels)[:253].strip(".-") or "a"
    entry = vmi_claim_entry_name(name)
    assert len(entry) <= 63 and DNS_LABEL.fullmatch(entry), entry
    assert entry.startswith(keys.VMI_RESOURCE_CLAIM_PREFIX)
    assert vmi_claim_entry_name(name) == entry


def test_long_claim_names_get_distinct_entry_names() -> None:
    base = "x" * 60
    assert vmi_claim_entry_name(base + "a") != vmi_claim_entry_name(base + "b")
    assert vmi_claim_entry_name("short") == "gpu-cozystack-short"


def test_the_claim_is_kept_in_its_resource_claims_reserved_for() -> None:
    claim = gpu_claim("train")
    entry = reserved_for_entry(claim)
    assert entry == {
        "apiGroup": "gpu.cozystack.io",
        "resource": "gpuclaims",
        "name": "train",
        "uid": "uid-tenant-train",
    }
    made = resource_claim_for(claim, SOURCE)
    assert not is_reserved_for(made, claim)
    pod = {"resource": "pods", "name": "virt-launcher-x", "uid": "p1"}
    made["status"] = {"reservedFor": [pod, entry]}
    assert is_reserved_for(made, claim)
    assert not is_reserved_for(made, gpu_claim("train", namespace="other"))


def test_a_resource_claim_is_ours_only_by_the_claims_uid() -> None:
    claim = gpu_claim("train")
    forged = resource_claim_for(gpu_claim("train", namespace="tenant"), SOURCE)
    forged["metadata"]["ownerReferences"][0]["uid"] = "a-uid-the-tenant-chose"
    assert not made_for(forged, claim)
    uncontrolled = resource_claim_for(claim, SOURCE)
    uncontrolled["metadata"]["ownerReferences"][0]["controller"] = False
    assert not made_for(uncontrolled, claim)
    assert not made_for(resource_claim_for(claim, SOURCE), gpu_claim("other"))


def test_the_dra_source_reads_cel_strings_and_device_class_shaped_selectors() -> None:
    assert dra_source(dra_class()) == DraSource(VFIO_CLASS, ())
    shaped = [{"cel": {"expression": "a"}}, "b"]
    assert dra_source(dra_class(selectors=shaped)) == DraSource(VFIO_CLASS, ("a", "b"))
    plugin = {"spec": {"source": {"devicePlugin": {"resourceName": "nvidia.com/GH100"}}}}
    assert dra_source(plugin) is None
