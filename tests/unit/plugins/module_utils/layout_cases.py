"""Addresses and type IDs the layout tests share (the fixture's L40S catalogue)."""

from __future__ import annotations

import os

L40S_PF = "0000:41:00.0"
L40S_24C = 1151  # type IDs of the fixture's L40S catalogue
L40S_12C = 1153
UUID = "GPU-5e8b1c0a-1f2e-4d3c-9b8a-7f6e5d4c3b2a"
L40S_BARE = {"address": L40S_PF, "mode": "vgpu", "profile": "NVIDIA L40S-24C", "count": 2}


def vgpu_type(root, address):
    """The type ID a VF's nvidia/current_vgpu_type reads in a fixture tree."""
    with open(
        os.path.join(str(root), "sys/bus/pci/devices", address, "nvidia/current_vgpu_type")
    ) as f:
        return int(f.read())
