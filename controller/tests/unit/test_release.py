"""tools/release.py: the version set in lockstep, and the releases it refuses to cut.

Temporary copies of the versioned files and temporary git repositories; no network, no
build. The recorded releases are checked against this repository's history.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from cozystack_gpu_testkit import releases
from cozystack_gpu_testkit.releases import git

REPO = Path(__file__).resolve().parents[3]


def _load_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release", REPO / "tools" / "release.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["release"] = module
    spec.loader.exec_module(module)
    return module


release = _load_release()
VERSIONED = (release.GALAXY, release.CHART, release.PACKAGE, release.VALUES)
# The tree's version (the latest release's) and the next one up, which a cut would make.
CURRENT = str(yaml.safe_load((REPO / release.GALAXY).read_text())["version"])
_current = release.parse_version(CURRENT)
NEXT = f"{_current.major}.{_current.minor + 1}.0"


def _files() -> dict[str, str]:
    return {path: (REPO / path).read_text() for path in VERSIONED}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository with the versioned files, the release record and the fragments."""
    root = tmp_path / "repo"
    for path in (*VERSIONED, release.RECORD):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, root / path)
    # Right after a release the fragments are gone, and git keeps no empty folder.
    if (REPO / release.FRAGMENTS).is_dir():
        shutil.copytree(REPO / release.FRAGMENTS, root / release.FRAGMENTS)
    else:
        (root / release.FRAGMENTS).mkdir(parents=True)
    git(tmp_path, "init", "-q", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "start")
    return root


def test_a_release_sets_the_version_in_lockstep_and_nothing_else() -> None:
    before = _files()
    after = release.set_versions(before, "1.2.3")
    assert set(release.versions_in(after).values()) == {"1.2.3"}, release.versions_in(after)
    # What the chart test holds: chart version = appVersion = package version.
    chart = yaml.safe_load(after[release.CHART])
    package = tomllib.loads(after[release.PACKAGE])["project"]["version"]
    assert chart["version"] == chart["appVersion"] == package == "1.2.3"
    changed = {
        path: [
            (old, new)
            for old, new in zip(before[path].splitlines(), after[path].splitlines(), strict=True)
            if old != new
        ]
        for path in VERSIONED
    }
    # One line in galaxy.yml and the package, two in Chart.yaml; comments and the package's
    # other "version" keys (ruff's target-version, mypy's python_version) untouched.
    assert {path: len(lines) for path, lines in changed.items()} == {
        release.GALAXY: 1,
        release.CHART: 2,
        release.PACKAGE: 1,
        release.VALUES: 0,
    }, changed


def test_a_pinned_default_image_tag_moves_with_the_release() -> None:
    files = _files()
    files[release.VALUES] = files[release.VALUES].replace('  tag: ""', '  tag: "0.1.0"')
    after = release.set_versions(files, "0.3.0")
    assert yaml.safe_load(after[release.VALUES])["image"]["tag"] == "0.3.0"


@pytest.mark.parametrize("text", ["v0.2.0", "0.2", "0.2.0.1", "01.2.3", "0.2.0+build.5", "", "x"])
def test_a_version_that_is_not_semver_is_refused(text: str) -> None:
    with pytest.raises(
        release.Refused, match=re.escape("is not a semantic version: give MAJOR.MINOR.PATCH")
    ):
        release.parse_version(text)


def test_versions_are_ordered_as_semver_orders_them() -> None:
    ordered = ["0.1.0", "0.1.1", "0.2.0-alpha", "0.2.0-rc.2", "0.2.0-rc.10", "0.2.0", "1.0.0"]
    keys = [release.parse_version(v).key() for v in ordered]
    assert keys == sorted(keys)


@pytest.mark.parametrize("text", ["0.1.0", "0.0.9", "0.1.0-rc.1"])
def test_a_version_not_newer_than_the_latest_release_is_refused(text: str) -> None:
    record = {"releases": [{"version": "0.1.0", "commit": "9227b6d" + "0" * 33}]}
    with pytest.raises(
        release.Refused, match=re.escape("is not newer than the latest recorded release 0.1.0")
    ):
        release.refuse_unless_newer(release.parse_version(text), record)
    release.refuse_unless_newer(release.parse_version("0.1.1"), record)
    release.refuse_unless_newer(release.parse_version("0.2.0-rc.1"), record)


def test_a_release_is_not_cut_from_a_dirty_tree(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / release.GALAXY).write_text((repo / release.GALAXY).read_text() + "# edited\n")
    (repo / "stray.txt").write_text("x")
    assert release.main(["cut", NEXT, "--dry-run", "--root", str(repo)]) == 2
    err = capsys.readouterr().err
    assert "the work tree has uncommitted changes" in err
    assert "commit or stash them first" in err
    assert "galaxy.yml" in err and "stray.txt" in err


def test_the_dry_run_says_what_it_would_change_and_changes_nothing(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    head = git(repo, "rev-parse", "HEAD")
    assert release.main(["cut", NEXT, "--dry-run", "--skip-image", "--root", str(repo)]) == 0
    out = capsys.readouterr().out
    assert f"galaxy.yml version: {CURRENT} -> {NEXT}" in out
    assert f"controller/chart/Chart.yaml appVersion: {CURRENT} -> {NEXT}" in out
    assert f"controller/pyproject.toml project.version: {CURRENT} -> {NEXT}" in out
    assert f"cozystack-gpu-{NEXT}.tar.gz" in out and f"cozystack-gpu-{NEXT}.tgz" in out
    assert f"cozystack-gpu-device-plugin-recipe-{NEXT}.tar.gz" in out
    assert "SHA256SUMS" in out and ".oci.tar" not in out
    for fragment in (repo / release.FRAGMENTS).glob("*.yml"):
        assert fragment.name in out
    assert git(repo, "status", "--porcelain") == ""
    assert git(repo, "rev-parse", "HEAD") == head


def test_the_checksums_file_is_what_sha256sum_checks(tmp_path: Path) -> None:
    (tmp_path / "a.tar.gz").write_bytes(b"collection")
    (tmp_path / "b.tgz").write_bytes(b"chart")
    (tmp_path / "SHA256SUMS").write_text(release.checksums(tmp_path))
    done = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == ["a.tar.gz: OK", "b.tgz: OK"]


def _recipe_files() -> dict[str, bytes]:
    recipe = REPO / release.RECIPE
    return {
        p.relative_to(recipe).as_posix(): p.read_bytes()
        for p in sorted(recipe.rglob("*"))
        if p.is_file()
    }


def test_the_device_plugin_recipe_ships_whole_in_one_reproducible_tarball(tmp_path: Path) -> None:
    """Every file of deploy/device-plugin under one folder named for the release, build.sh
    executable, the same bytes when built again from the same commit (rebuild), and listed
    in SHA256SUMS."""
    files = _recipe_files()
    assert {"Containerfile", "build.sh", "README.md"} <= set(files), sorted(files)
    assert any(name.endswith(".patch") for name in files), sorted(files)
    built = []
    for attempt in ("first", "again"):
        folder = tmp_path / attempt
        folder.mkdir()
        built.append(release.recipe_archive(REPO / release.RECIPE, "1.2.3", folder, 1700000000))
    assert built[0].name == "cozystack-gpu-device-plugin-recipe-1.2.3.tar.gz"
    assert built[0].read_bytes() == built[1].read_bytes(), "the recipe tarball is not reproducible"
    top = "cozystack-gpu-device-plugin-recipe-1.2.3"
    with tarfile.open(built[0]) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == sorted([top, *(f"{top}/{name}" for name in files)])
        for name, data in files.items():
            member = members[f"{top}/{name}"]
            extracted = tar.extractfile(member)
            assert extracted is not None and extracted.read() == data, name
            assert (member.uid, member.gid, member.mtime) == (0, 0, 1700000000), name
            assert member.mode == (0o755 if name == "build.sh" else 0o644), (name, oct(member.mode))
    (built[0].parent / "SHA256SUMS").write_text(release.checksums(built[0].parent))
    assert built[0].name in (built[0].parent / "SHA256SUMS").read_text()


def test_the_unpacked_recipe_is_complete_enough_for_its_script_to_run(tmp_path: Path) -> None:
    """build.sh, run from the unpacked tarball, finds its patch and Containerfile and goes on
    to check the source (here a folder that is not NVIDIA's, which it refuses)."""
    archive = release.recipe_archive(REPO / release.RECIPE, "1.2.3", tmp_path, 1700000000)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "unpacked", filter="data")
    script = tmp_path / "unpacked" / "cozystack-gpu-device-plugin-recipe-1.2.3" / "build.sh"
    pinned = re.search(r"^readonly PINNED_TAG=(\S+)$", script.read_text(), re.MULTILINE)
    assert pinned is not None
    (tmp_path / "not-nvidia").mkdir()
    done = subprocess.run(
        [str(script), str(tmp_path / "not-nvidia"), pinned.group(1)],
        capture_output=True,
        text=True,
        env=dict(os.environ, TMPDIR=str(tmp_path)),
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "the recipe is incomplete" not in done.stderr, done.stderr
    assert "is not kubevirt-gpu-device-plugin" in done.stderr, done.stderr


def test_a_recipe_folder_without_files_is_refused(tmp_path: Path) -> None:
    (tmp_path / "recipe").mkdir()
    with pytest.raises(release.Refused, match="the device plugin recipe is missing"):
        release.recipe_archive(tmp_path / "recipe", "1.2.3", tmp_path, 0)


def test_every_recorded_release_is_a_commit_in_history_carrying_its_version() -> None:
    """A release can be built again only from a commit the history still has; CI's clone
    has the full history (a shallow one would fail here, saying so)."""
    entries = release.load_record(REPO)["releases"]
    assert entries and entries[0] == {
        "version": "0.1.0",
        "commit": "9227b6d401a12cbddc6f317da50301f0758fd0db",
    }
    shallow = git(REPO, "rev-parse", "--is-shallow-repository").strip() == "true"
    for entry in entries:
        version, commit = str(entry["version"]), str(entry["commit"])
        release.parse_version(version)
        assert len(commit) == 40, f"{version}: name the full commit, not {commit!r}"
        found = subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"],
            cwd=REPO,
            capture_output=True,
            check=False,
        )
        assert found.returncode == 0, (
            f"release {version}'s commit {commit} is not in this repository's history"
            + (" (a shallow clone: fetch with --unshallow)" if shallow else "")
        )
        files = {path: git(REPO, "show", f"{commit}:{path}") for path in VERSIONED}
        carried = release.versions_in(files)
        assert set(carried.values()) == {version}, (version, carried)


def test_two_processes_asking_for_one_release_tree_at_once_both_get_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make test runs two pytest processes at once (tools/pytest-lanes.sh), and on a fresh
    machine both may ask for the latest release's tree: one makes it, the other waits for
    it, and neither removes what the other made."""
    monkeypatch.setattr(releases, "CACHE", tmp_path / "releases")
    release = releases.latest()
    with ThreadPoolExecutor(2) as pool:
        trees = list(pool.map(lambda _i: releases.tree(release), range(2)))
    assert trees[0] == trees[1] == tmp_path / "releases" / release.commit
    assert (trees[0] / releases.COMPLETE).read_text() == f"{release.version}\n"
    assert (trees[0] / "controller" / "chart" / "Chart.yaml").is_file()
    left = sorted(p.name for p in (tmp_path / "releases").iterdir())
    assert left == [release.commit, f"{release.commit}.lock"], "no half-made tree left"
