"""hypothesis: whatever a sysfs tree holds, the inventory comes back and never raises."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as s

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import sysfs_scenarios
from cozystack_gpu_testkit import sysfs_tree as st

_BASE = tempfile.mkdtemp(prefix="sysfs-fuzz-")
_TEMPLATE = os.path.join(_BASE, "template")
atexit.register(shutil.rmtree, _BASE, True)
sysfs_scenarios.mixed(_TEMPLATE)  # every kind of function: passthrough, VFs, mdevs, non-GPUs
_PATHS = sorted(
    os.path.relpath(os.path.join(d, n), _TEMPLATE)
    for d, dirs, files in os.walk(os.path.join(_TEMPLATE, "sys"))
    for n in dirs + files
)

contents = s.one_of(
    s.binary(max_size=64),
    s.text(max_size=64).map(str.encode),
    s.sampled_from([b"0x10de\n", b"0x030200\n", b"-1\n", b"0\n", b"1151\n", b"ID : x\n", b""]),
)
mutation = s.tuples(
    s.sampled_from(_PATHS),
    s.sampled_from(["write", "delete", "dir", "dangle", "loop"]),
    contents,
)


def _mutate(root: str, rel: str, how: str, data: bytes) -> None:
    path = os.path.join(root, rel)
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)
    if how == "write":
        with open(path, "wb") as handle:
            handle.write(data)
    elif how == "dir":
        os.mkdir(path)
    elif how == "dangle":
        os.symlink("../nowhere/" + data.hex()[:8], path)
    elif how == "loop":
        os.symlink(os.path.basename(path), path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s.lists(mutation, min_size=1, max_size=8))
def test_mutated_trees_never_raise(mutations: list[tuple[str, str, bytes]]) -> None:
    root = tempfile.mkdtemp(dir=_BASE)
    try:
        shutil.copytree(_TEMPLATE, root, symlinks=True, dirs_exist_ok=True)
        for rel, how, data in mutations:
            _mutate(root, rel, how, data)
        inv = sysfs.read_inventory(root)
        assert isinstance(inv, sysfs.Inventory)
        assert all(f.address == sysfs.canonical_pci_address(f.address) for f in inv.functions)
        inv.to_dict()
    finally:
        shutil.rmtree(root)


gpu = s.builds(
    st.Gpu,
    address=s.tuples(s.integers(0, 255), s.integers(0, 3)).map(
        lambda t: f"0000:{t[0]:02x}:{t[1] * 8:02x}.0"
    ),
    model=s.sampled_from([st.H100_SXM, st.L40S, st.T4, st.UNLISTED, st.RTX_A6000]),
    driver=s.sampled_from(["vfio-pci", "nvidia", "nvgrace_gpu_vfio_pci", None]),
    numa_node=s.integers(-1, 3),
    iommu_group=s.one_of(s.none(), s.integers(0, 5)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s.lists(gpu, max_size=5, unique_by=lambda g: g.address))
def test_random_trees_never_raise_and_keep_every_gpu(gpus: list[st.Gpu]) -> None:
    root = Path(tempfile.mkdtemp(dir=_BASE))
    try:
        st.build(root, gpus)
        inv = sysfs.read_inventory(str(root))
        assert sorted(f.address for f in inv.functions) == sorted(g.address for g in gpus)
        for f in inv.functions:
            expect_vfio = f.driver in sysfs.VFIO_DRIVERS
            assert (f.resource_name is not None) == expect_vfio
    finally:
        shutil.rmtree(root)
