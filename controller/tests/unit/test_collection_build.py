"""`ansible-galaxy collection build` yields an installable tarball without tests or caches."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_collection_builds_without_tests_or_caches(tmp_path: Path) -> None:
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    assert galaxy.exists() or shutil.which("ansible-galaxy"), "ansible-galaxy is not installed"
    subprocess.run(
        [str(galaxy), "collection", "build", "--force", "--output-path", str(tmp_path)],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    (tarball,) = tmp_path.glob("cozystack-gpu-*.tar.gz")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
    top = {name.split("/", 1)[0] for name in names}
    assert {"MANIFEST.json", "FILES.json", "README.md", "meta", "plugins", "controller"} <= top
    assert "controller/cozystack_gpu/crds/gpuclasses.yaml" in names
    assert "controller/cozystack_gpu/keys.py" in names
    for left_out in ("tests", "molecule", ".venv", ".cache", "tools", ".git", ".ci"):
        assert left_out not in top, f"{left_out} is in the tarball"
    for name in names:
        assert "__pycache__" not in name and "_cache" not in name.split("/")[0], name
        assert not name.startswith("controller/tests"), name
    # The collection installs from the tarball.
    install = tmp_path / "installed"
    install_args = ["--offline", "--force", "-p", str(install), str(tarball)]
    subprocess.run(
        [str(galaxy), "collection", "install", *install_args],
        check=True,
        capture_output=True,
    )
    assert (install / "ansible_collections" / "cozystack" / "gpu" / "meta" / "runtime.yml").exists()


def _links(top: Path) -> dict[Path, Path]:
    """Every symbolic link below ``top`` (build and cache folders skipped) -> its target."""
    found: dict[Path, Path] = {}
    for base, dirs, files in os.walk(top):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        for name in dirs + files:
            path = Path(base) / name
            if path.is_symlink():
                found[path] = path.resolve()
    return found


SKIPPED_DIRS = {"build", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def test_shared_code_is_owned_by_the_controller_and_linked_from_the_collection() -> None:
    """The controller image is built from controller/ alone, so no link may leave it; the
    collection's module_utils reach the shared files through links into it."""
    controller = REPO / "controller"
    leaving = {
        str(p.relative_to(REPO)): str(t)
        for p, t in _links(controller).items()
        if not t.is_relative_to(controller)
    }
    assert leaving == {}, "links that leave controller/ (the image would miss their files)"
    shared = _links(REPO / "plugins")
    assert {p.name for p in shared} >= {"gpu_keys.py", "gpu_sysfs.py"}
    for path, target in shared.items():
        assert target.is_relative_to(controller / "cozystack_gpu"), (path, target)
        assert target.is_file(), f"{path} points at {target}, which is missing"
