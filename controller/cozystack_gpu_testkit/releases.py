"""The recorded releases (``releases.yaml``) as trees a test can install: each release's files
at its commit, taken from git history once per machine and cached by commit.

A release's tree is what its image holds (the controller package) and what its chart package
is made from (``controller/chart``); the demo's local pods run a release's code by mapping its
image reference to the tree (``run_state.State.images``), as a node would pull that image.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from cozystack_gpu_testkit.cluster import REPO_ROOT

RECORD = REPO_ROOT / "releases.yaml"
CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cozystack-gpu" / "releases"
)
# Written last into a tree: a tree without it is a half-written one and is made again.
COMPLETE = ".complete"


@dataclass(frozen=True)
class Release:
    version: str
    commit: str

    @property
    def chart(self) -> Path:
        return tree(self) / "controller" / "chart"

    @property
    def code(self) -> Path:
        """What goes on ``$PYTHONPATH`` to run this release's controller and agent."""
        return tree(self) / "controller"


def recorded() -> list[Release]:
    entries = yaml.safe_load(RECORD.read_text())["releases"]
    return [Release(str(e["version"]), str(e["commit"])) for e in entries]


def latest() -> Release:
    return recorded()[-1]


def tree(release: Release) -> Path:
    """The release's files, from ``git archive`` of its commit, cached by commit. A history
    without the commit (a shallow clone) is refused, saying so."""
    path = CACHE / release.commit
    if (path / COMPLETE).exists():
        return path
    CACHE.mkdir(parents=True, exist_ok=True)
    # make test runs two pytest processes at once (tools/pytest-lanes.sh), and both may ask
    # for the same release on a fresh machine: one makes it while the other waits.
    with (CACHE / f"{release.commit}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path / COMPLETE).exists():
            _make_tree(release, path)
    return path


def _make_tree(release: Release, path: Path) -> None:
    archive = subprocess.run(
        ["git", "archive", "--format=tar", release.commit],
        cwd=REPO_ROOT, capture_output=True, check=False,
    )  # fmt: skip
    if archive.returncode != 0:
        raise RuntimeError(
            f"release {release.version}: commit {release.commit} is not in this clone's "
            f"history ({archive.stderr.decode().strip()}); fetch the full history "
            "(git fetch --unshallow) to install it"
        )
    partial = path.with_name(f"{release.commit}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(partial, filter="data")
    # The pod-resources messages are build output, as in this checkout (make setup).
    subprocess.run(
        [sys.executable, str(partial / "controller" / "gen_protos.py")],
        capture_output=True, check=True,
    )  # fmt: skip
    (partial / COMPLETE).write_text(f"{release.version}\n")
    shutil.rmtree(path, ignore_errors=True)
    partial.rename(path)


def git(cwd: Path, *args: str) -> str:
    """``git args`` in ``cwd`` as a test's own committer; its output. A failure stops the
    test with git's words."""
    done = subprocess.run(
        ["git", "-c", "user.email=t@example.net", "-c", "user.name=t", *args],
        cwd=cwd, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"git {' '.join(args)}: {done.stderr}")
    return done.stdout


# The chart tarball docs/operations.md's upgrade command names; a test puts its chart there.
DOCUMENTED_CHART = "cozystack-gpu-<new version>.tgz"
# The 0.2.0 workaround docs/operations.md gives (its image has no passwd entry).
DOCUMENTED_USER_FIX = "kubectl -n cozy-gpu set env deployment/cozystack-gpu-controller"


def _documented_line(start: str, marker: str) -> str:
    page = (REPO_ROOT / "docs" / "operations.md").read_text()
    (line,) = [
        part.strip("` ")
        for text in page.splitlines()
        for part in text.split("`")
        if part.strip().startswith(start) and marker in part
    ]
    return line


def documented_upgrade() -> str:
    """The upgrade command docs/operations.md gives a hoster, word for word."""
    return _documented_line("helm upgrade ", DOCUMENTED_CHART)


def documented_user_fix() -> str:
    """The command docs/operations.md gives to start 0.2.0's controller under containerd."""
    return _documented_line(DOCUMENTED_USER_FIX, "USER=")
