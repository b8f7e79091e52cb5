"""The guest_license role and the controller agree on the licence disk: its serial, the
token's key and the FeatureType's key (the VMI webhook writes the disk, the role reads it
inside the guest; a mismatch would leave every licensed VM unlicensed, silently)."""

from __future__ import annotations

from pathlib import Path

import yaml

from cozystack_gpu import keys

ROLE = Path(__file__).resolve().parents[3] / "roles" / "guest_license"


def test_the_role_looks_for_the_disk_and_keys_the_controller_writes() -> None:
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert defaults["guest_license_disk_serial"] == keys.LICENSE_DISK_SERIAL
    assert defaults["guest_license_token_key"] == keys.LICENSE_TOKEN_KEY
    script = (ROLE / "files" / "cozystack-gpu-guest-license.sh").read_text()
    assert f"COZYSTACK_GPU_LICENSE_SERIAL:-{keys.LICENSE_DISK_SERIAL}}}" in script
    assert f"COZYSTACK_GPU_LICENSE_TOKEN_KEY:-{keys.LICENSE_TOKEN_KEY}}}" in script
    assert f"COZYSTACK_GPU_LICENSE_FEATURE_KEY:-{keys.LICENSE_FEATURE_TYPE_KEY}}}" in script


def test_the_serial_fits_what_a_virtio_disk_shows_the_guest() -> None:
    assert len(keys.LICENSE_DISK_SERIAL) <= 20, "virtio-blk shows at most 20 bytes of a serial"
