"""The start path of a ``dra`` class (SPEC §13): the VMI webhook gives each held claim of such
a class a ``spec.resourceClaims`` entry naming its ResourceClaim and one ``gpus`` entry per
unit with ``claimName`` and ``requestName``; units are numbered over the whole set whatever
their source; a template of such a class is refused with what to do; the gate keeps a
launcher pod that does not use its claims' ResourceClaims."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from cozystack_gpu.admission import vmi_dra
from cozystack_gpu.objects import launcher
from cozystack_gpu_testkit.dra_objects import dra_class, gpu_claim

PLUGIN_CLASS = {
    "metadata": {"name": "l40s"},
    "spec": {
        "mode": "passthrough",
        "source": {"devicePlugin": {"resourceName": "nvidia.com/L40S"}},
    },
}
CLASSES = {"h100": dra_class("h100"), "l40s": PLUGIN_CLASS}


def test_a_dra_claims_units_name_its_resource_claim_and_each_request() -> None:
    held = [("train", gpu_claim("train", 2, gpu_class="h100"))]
    made = vmi_dra.entries(held, [], CLASSES)
    assert made.resource_claims == ({"name": "gpu-cozystack-train", "resourceClaimName": "train"},)
    assert made.gpus == (
        {"name": "gpu-cozystack-0", "claimName": "gpu-cozystack-train", "requestName": "gpu-0"},
        {"name": "gpu-cozystack-1", "claimName": "gpu-cozystack-train", "requestName": "gpu-1"},
    )


def test_units_are_numbered_over_the_whole_set_whatever_their_source() -> None:
    held = [
        ("a", gpu_claim("a", 1, gpu_class="l40s")),
        ("b", gpu_claim("b", 2, gpu_class="h100")),
    ]
    made = vmi_dra.entries(held, [("l40s", 1)], CLASSES)
    assert [g["name"] for g in made.gpus] == [f"gpu-cozystack-{i}" for i in range(4)]
    assert made.gpus[0] == {"name": "gpu-cozystack-0", "deviceName": "nvidia.com/L40S"}
    assert [g.get("requestName") for g in made.gpus[1:3]] == ["gpu-0", "gpu-1"]
    assert made.gpus[3]["deviceName"] == "nvidia.com/L40S"


def test_a_claim_template_of_a_dra_class_is_refused_with_what_to_do() -> None:
    template = SimpleNamespace(gpu_class="h100", count=1)
    words = vmi_dra.template_refusal([template], CLASSES)
    assert words is not None and "order a GPUClaim of the class" in words
    assert vmi_dra.template_refusal([SimpleNamespace(gpu_class="l40s", count=1)], CLASSES) is None


def test_the_resource_claims_entries_are_written_after_the_vmis_own_and_once() -> None:
    body: dict[str, Any] = {
        "spec": {"resourceClaims": [{"name": "mine", "resourceClaimName": "x"}]}
    }
    ours = [{"name": "gpu-cozystack-train", "resourceClaimName": "train"}]
    vmi_dra.set_resource_claims(body, ours)
    vmi_dra.set_resource_claims(body, ours)
    assert body["spec"]["resourceClaims"] == [{"name": "mine", "resourceClaimName": "x"}, *ours]
    plain: dict[str, Any] = {"spec": {}}
    vmi_dra.set_resource_claims(plain, [])
    assert "resourceClaims" not in plain["spec"], "a VMI of devicePlugin classes is unchanged"


def test_a_launcher_pod_without_its_claims_resource_claims_stays_at_the_gate() -> None:
    pod = {
        "metadata": {"name": "virt-launcher-vm-x"},
        "spec": {"resourceClaims": [{"name": "gpu-cozystack-a", "resourceClaimName": "a"}]},
    }
    assert launcher.resource_claims_missing(pod, ["a"]) is None
    words = launcher.resource_claims_missing(pod, ["a", "b"])
    assert words is not None and "ResourceClaim(s) b" in words
