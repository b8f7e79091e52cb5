"""`tools/release.py cut` on a clone of this repository: the artefacts, the commits, the record.

The image is left out (--skip-image: `make release` builds it with podman, minutes); the
device plugin recipe ships as its own tarball (the hoster builds that image), and
galaxy-importer is stood in for by a script that records which tarball it was given (`make
galaxy-import` runs the real one on the same tarball).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from chartkit import kube_version

from cozystack_gpu_testkit.releases import git

REPO = Path(__file__).resolve().parents[3]
VERSION = "9.9.9"


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """This repository as CI clones it: the committed tree with its history."""
    path = tmp_path / "repo"
    git(tmp_path, "clone", "--quiet", "--no-hardlinks", str(REPO), str(path))
    git(path, "config", "user.email", "release@example.net")
    git(path, "config", "user.name", "release test")
    return path


def _galaxy_stand_in(tmp_path: Path, exit_code: int) -> Path:
    script = tmp_path / "galaxy-import"
    script.write_text(f'#!/bin/sh\necho "$1" >> "{tmp_path}/galaxy-checked"\nexit {exit_code}\n')
    script.chmod(0o755)
    return script


def _cut(clone: Path, out: Path, helm: Path, check: Path) -> subprocess.CompletedProcess[str]:
    env = dict(
        os.environ, COZYSTACK_GPU_BIN_DIR=str(helm.parent), COZYSTACK_GPU_GALAXY_IMPORT=str(check)
    )
    return subprocess.run(
        [
            sys.executable,
            str(clone / "tools/release.py"),
            *("cut", VERSION, "--skip-image", "--out", str(out)),
        ],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_release_carries_its_version_in_every_artefact_and_is_recorded(
    clone: Path, tmp_path: Path, helm: Path
) -> None:
    start = git(clone, "rev-parse", "HEAD").strip()
    done = _cut(clone, tmp_path / "dist", helm, _galaxy_stand_in(tmp_path, 0))
    assert done.returncode == 0, done.stdout + done.stderr

    # Two commits: the release (versions, changelog), then its record.
    log = git(clone, "log", "--format=%H %s", f"{start}..HEAD").splitlines()
    assert [line.split(" ", 1)[1] for line in log] == [
        f"Record release {VERSION} ({log[1][:12]})",
        f"Release {VERSION}",
    ]
    release_commit = log[1].split()[0]
    record = yaml.safe_load((clone / "releases.yaml").read_text())["releases"]
    assert record[-1] == {"version": VERSION, "commit": release_commit}
    assert git(clone, "status", "--porcelain") == ""
    changelog = git(clone, "show", f"{release_commit}:CHANGELOG.rst")
    assert f"v{VERSION}" in changelog
    kept = git(clone, "ls-tree", "-r", "--name-only", release_commit, "changelogs").split()
    assert [p for p in kept if p.startswith("changelogs/fragments/")] == [], "fragments left"
    assert "changelogs/.plugin-cache.yaml" not in kept, "antsibull-changelog's cache committed"

    folder = tmp_path / "dist" / VERSION
    collection, chart, recipe = (
        folder / f"cozystack-gpu-{VERSION}.tar.gz",
        folder / f"cozystack-gpu-{VERSION}.tgz",
        folder / f"cozystack-gpu-device-plugin-recipe-{VERSION}.tar.gz",
    )
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [collection.name, chart.name, recipe.name, "SHA256SUMS"]
    )
    checked = subprocess.run(
        ["sha256sum", "-c", "SHA256SUMS"], cwd=folder, capture_output=True, check=False
    )
    assert checked.returncode == 0, checked.stdout
    listed = [line.split()[1] for line in (folder / "SHA256SUMS").read_text().splitlines()]
    assert sorted(listed) == sorted([collection.name, chart.name, recipe.name])
    # The recipe as the release commit has it, and never inside the collection.
    with tarfile.open(recipe) as tar:
        shipped = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    committed = git(clone, "ls-tree", "-r", "--name-only", release_commit, "deploy/device-plugin")
    assert shipped == {p.removeprefix("deploy/device-plugin/") for p in committed.split()}
    assert {"Containerfile", "build.sh"} <= shipped and any(n.endswith(".patch") for n in shipped)
    assert (tmp_path / "galaxy-checked").read_text().split() == [str(collection)]

    with tarfile.open(collection) as tar:
        manifest = tar.extractfile("MANIFEST.json")
        assert manifest is not None
        assert json.load(manifest)["collection_info"]["version"] == VERSION
        assert not [n for n in tar.getnames() if n.startswith("deploy")], "recipe in collection"
    shown = yaml.safe_load(
        subprocess.run(
            [str(helm), "show", "chart", str(chart)], capture_output=True, text=True, check=True
        ).stdout
    )
    assert shown["version"] == shown["appVersion"] == VERSION
    rendered = subprocess.run(
        [
            str(helm),
            "template",
            "r",
            str(chart),
            "-n",
            "cozy-gpu",
            "--kube-version",
            kube_version(),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    images = {
        c["image"]
        for doc in yaml.safe_load_all(rendered.stdout)
        if doc and doc.get("kind") in ("Deployment", "DaemonSet")
        for c in doc["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/cozystack/cozystack-gpu-controller:{VERSION}"}


def test_a_release_galaxy_would_refuse_is_not_cut(clone: Path, tmp_path: Path, helm: Path) -> None:
    start = git(clone, "rev-parse", "HEAD").strip()
    done = _cut(clone, tmp_path / "dist", helm, _galaxy_stand_in(tmp_path, 1))
    assert done.returncode != 0, "a release was cut although Galaxy's checks failed"
    assert f"release {VERSION} not cut: the tree is back at {start[:12]}" in done.stderr
    assert git(clone, "rev-parse", "HEAD").strip() == start
    assert git(clone, "status", "--porcelain") == "", "the failed release left changes"
    record = yaml.safe_load((clone / "releases.yaml").read_text())["releases"]
    assert VERSION not in [str(e["version"]) for e in record]
