"""The fixture trees' models are real devices: their IDs and names are those of the pci.ids
excerpt the tests ship (real lines of one release), so a name the agent or gpu_facts predicts
in a test is the name a device plugin with that pci.ids would advertise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_tree as st

# Model key -> (pci.ids device name, the passthrough resource name it predicts).
EXPECTED = {
    "h100-sxm": ("GH100 [H100 SXM5 80GB]", "nvidia.com/GH100_H100_SXM5_80GB"),
    "a100-sxm": ("GA100 [A100 SXM4 40GB]", "nvidia.com/GA100_A100_SXM4_40GB"),
    "rtx-a6000": ("GA102GL [RTX A6000]", "nvidia.com/GA102GL_RTX_A6000"),
    "l40s": ("AD102GL [L40S]", "nvidia.com/AD102GL_L40S"),
    "t4": ("TU104GL [Tesla T4]", "nvidia.com/TU104GL_TESLA_T4"),
    "h100-pcie-other-display": ("GH100 [H100 PCIe]", "nvidia.com/GH100_H100_PCIE"),
    "nvidia-audio": ("AD102 High Definition Audio Controller", None),  # not a GPU
    "unlisted": (None, "nvidia.com/2bff"),  # unknown to pci.ids: the raw ID
    "intel-nic": ("Ethernet Controller X710 for 10GbE SFP+", None),
}


def _sections(text: str) -> dict[str, dict[str, str]]:
    """Vendor ID -> {device ID -> name}, every vendor of the excerpt."""
    vendors: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if not line.startswith("\t"):
            vendor, _name = line.split(None, 1)
            current = vendors.setdefault(vendor, {})
        elif not line.startswith("\t\t") and current is not None:
            device, name = line[1:].split(None, 1)
            current[device] = name
    return vendors


def test_the_excerpt_names_its_source_and_release() -> None:
    header = [line for line in st.PCI_IDS_FIXTURE.splitlines() if line.startswith("#")]
    assert any(re.search(r"Debian package pci\.ids 0\.0~2025\.06\.09", h) for h in header)
    assert sysfs.parse_pci_ids(st.PCI_IDS_FIXTURE).version == "2025.06.09"


def test_every_fixture_model_is_known_to_the_test_table() -> None:
    assert set(st.MODELS) == set(EXPECTED)


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_a_fixture_models_ids_and_predicted_name_match_the_pci_ids(key: str) -> None:
    model = st.MODELS[key]
    listed_name, resource_name = EXPECTED[key]
    vendor = model.vendor_id.removeprefix("0x")
    devices = _sections(st.PCI_IDS_FIXTURE).get(vendor, {})
    assert devices.get(model.device_id) == listed_name, (vendor, model.device_id)
    if resource_name is None:
        return
    ids = sysfs.parse_pci_ids(st.PCI_IDS_FIXTURE)
    named = ids.name(model.device_id)
    predicted = sysfs.resource_name(
        sysfs.passthrough_name(named) if named is not None else model.device_id
    )
    assert predicted == resource_name


def test_l40s_is_26b9_and_26b5_is_the_l40() -> None:
    """The two AD102GL boards pci.ids tells apart (2023.11 on); the fixture had them swapped."""
    nvidia = _sections(st.PCI_IDS_FIXTURE)["10de"]
    assert (nvidia["26b9"], nvidia["26b5"]) == ("AD102GL [L40S]", "AD102GL [L40]")
    assert st.L40S.device_id == "26b9"


def test_a_passthrough_l40s_is_read_under_the_predicted_name(tmp_path: Path) -> None:
    st.build(tmp_path, [st.Gpu("0000:41:00.0", st.L40S)])
    (function,) = sysfs.read_inventory(str(tmp_path)).functions
    assert (function.device_id, function.model) == ("26b9", "AD102GL [L40S]")
    assert function.resource_name == "nvidia.com/AD102GL_L40S"
