"""Fixtures shared by the unit tests of the modules and module_utils.

Sysfs fixture trees come from the controller's test kit (cozystack_gpu_testkit.sysfs_tree),
the same trees the node agent's tests and the molecule stand-ins use. A plain tree is just
files: writing ``drivers_probe`` binds nothing and writing ``current_vgpu_type`` does not
shrink the card's creatable lists. :class:`KernelWriter` plays the kernel's and the vGPU
driver's part by turning each write the applier makes into the matching SysfsTree change,
and :class:`SriovManage` stands in for NVIDIA's sriov-manage.
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

try:
    from cozystack_gpu_testkit import sysfs_scenarios, sysfs_tree
except ImportError:  # the controller package is not installed: use it from the checkout
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "controller"))
    from cozystack_gpu_testkit import sysfs_scenarios, sysfs_tree

from ansible_collections.cozystack.gpu.plugins.module_utils import (
    gpu_layout,
    gpu_layout_apply,
    gpu_layout_schema,
)

PCI = "sys/bus/pci/devices/"
MDEV = "sys/bus/mdev/devices/"


class KernelWriter(gpu_layout_apply.SysfsWriter):
    """Writes the applier makes, applied to a fixture tree the way the kernel reacts."""

    def __init__(self, tree):
        super().__init__(str(tree.root))
        self.tree = tree
        self.writes = []

    def write(self, path, value):
        rel = os.path.relpath(path, self.root)
        self.writes.append((rel, value))
        if rel == "sys/bus/pci/drivers_probe":
            address = value.strip()
            override = (self.tree.device_dir(address) / "driver_override").read_text().strip()
            if self.tree.driver_of(address) is None:
                self.tree.bind(address, override if override not in ("", "(null)") else "nvidia")
            return
        if rel.startswith(MDEV) and rel.endswith("/remove"):
            self.tree.remove_mdev(rel.split("/")[4])
            return
        if not rel.startswith(PCI):
            raise AssertionError(f"unexpected write to {rel}")
        address, attribute = rel[len(PCI) :].split("/", 1)
        if attribute == "driver_override":
            self.tree.write(
                address, "driver_override", value.strip() + "\n" if value.strip() else "(null)\n"
            )
        elif attribute == "driver/unbind":
            if value.strip() != address:
                raise AssertionError(f"unbind of {value} through {address}")
            self.tree.bind(address, None)
        elif attribute == "nvidia/current_vgpu_type":
            self.tree.set_vgpu_type(address, int(value.strip()))
        elif attribute.startswith("mdev_supported_types/") and attribute.endswith("/create"):
            self.tree.create_mdev(address, attribute.split("/")[1], value.strip())
        else:
            raise AssertionError(f"unexpected write to {rel}")


class SriovManage:
    """sriov-manage -e: enables the VFs, after ``silent`` calls that exit 0 and do nothing."""

    def __init__(self, tree, silent=0, code_when_silent=0):
        self.tree = tree
        self.silent = silent
        self.code_when_silent = code_when_silent
        self.calls = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        if argv[1:2] != ["-e"]:
            return 2, "usage"
        if len(self.calls) <= self.silent:
            return self.code_when_silent, "NVRM: timeout waiting for vgpu_mgr"
        self.tree.enable_vfs(argv[2])
        return 0, f"Enabling VFs on {argv[2]}"


class FakeNvidiaSmi:
    """nvidia-smi answers: UUID -> address, and per-card supported vGPU types."""

    def __init__(self, uuids=None, supported=None):
        self.uuids = dict(uuids or {})
        self.supported = dict(supported or {})
        self.asked = []
        self.looked_up = []

    def uuid_to_address(self, gpu_uuid):
        self.looked_up.append(gpu_uuid)
        return self.uuids.get(gpu_uuid)

    def supported_vgpu_types(self, address):
        self.asked.append(address)
        return dict(self.supported.get(address, {}))


def tree_digest(root):
    """One hash over every path, file content and link target below ``root``."""
    digest = hashlib.sha256()
    for base, dirs, files in sorted(os.walk(str(root))):
        dirs.sort()
        for name in sorted(dirs + files):
            path = os.path.join(base, name)
            digest.update(os.path.relpath(path, str(root)).encode())
            if os.path.islink(path):
                digest.update(b"->" + os.readlink(path).encode())
            elif os.path.isfile(path):
                with open(path, "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


@pytest.fixture
def build(tmp_path):
    """Build a fixture tree from Gpu descriptions (or a scenario name) below tmp_path."""

    def _build(*gpus, scenario=None):
        root = tmp_path / "root"
        if scenario is not None:
            return sysfs_scenarios.SCENARIOS[scenario](root)
        return sysfs_tree.build(root, list(gpus))

    return _build


@pytest.fixture
def testkit():
    return sysfs_tree


@pytest.fixture
def scenarios():
    """The named trees (cozystack_gpu_testkit.sysfs_scenarios)."""
    return sysfs_scenarios


@pytest.fixture
def kernel():
    return KernelWriter


@pytest.fixture
def sriov_manage():
    return SriovManage


@pytest.fixture
def apply(kernel):
    """apply_layout on a fixture tree, the kernel played by KernelWriter, no real sleeping."""

    def _apply(tree, document, **kwargs):
        kwargs.setdefault("writer", kernel(tree))
        kwargs.setdefault("sleep", lambda seconds: None)
        layout = gpu_layout_schema.parse_layout(document)
        return gpu_layout.apply_layout(layout, str(tree.root), **kwargs)

    return _apply


@pytest.fixture
def nvidia_smi():
    return FakeNvidiaSmi


@pytest.fixture
def digest():
    return tree_digest


class ModuleExit(Exception):
    """exit_json/fail_json of a module under test, with the result it carried."""

    def __init__(self, result):
        super().__init__(result.get("msg", ""))
        self.result = result


@pytest.fixture
def run_module(monkeypatch):
    """Run a module's run_module() (or main()) with args; return its result dict.

    ``failed`` is True in the result when the module called fail_json; ``warnings`` holds
    what it passed to ``module.warn``, when anything.
    """
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args

    def exit_json(self, **kwargs):
        kwargs.setdefault("failed", False)
        raise ModuleExit(kwargs)

    def fail_json(self, msg, **kwargs):
        kwargs.update(msg=msg, failed=True)
        raise ModuleExit(kwargs)

    warnings = []

    def warn(self, warning):
        warnings.append(warning)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)
    monkeypatch.setattr(basic.AnsibleModule, "warn", warn)

    def _run(module, args, check_mode=False, diff=False, use_main=False, **hooks):
        args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
        with patch_module_args(args):
            try:
                if use_main:
                    module.main()
                else:
                    module.run_module(module.build_module(), **hooks)
            except ModuleExit as done:
                result = dict(done.result)
                if warnings:
                    result["warnings"] = list(warnings)
                    warnings.clear()
                return result
        raise AssertionError("the module returned without exit_json or fail_json")

    return _run
