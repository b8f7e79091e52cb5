"""Cuts a release of cozystack.gpu, or builds a recorded one again from its commit.

    tools/release.py cut 0.2.0 [--dry-run] [--skip-image] [--out DIR]
    tools/release.py rebuild 0.1.0 [--skip-image] [--out DIR]

`cut` refuses a version that is not semver or not newer than the latest in releases.yaml,
and a work tree with uncommitted changes. It then sets the version in lockstep (galaxy.yml,
the chart's version and appVersion, the package, the chart's default image tag), turns the
changelog fragments into CHANGELOG.rst with antsibull-changelog, commits that as the release
commit, builds the artefacts from that commit, and records the release in releases.yaml in a
second commit. `--dry-run` prints what it would change and build, and changes nothing.

The artefacts, all under DIR/<version>/ (default dist/<version>/, git-ignored):
    cozystack-gpu-<version>.tar.gz                    the collection (ansible-galaxy)
    cozystack-gpu-<version>.tgz                       the chart (helm package)
    cozystack-gpu-controller-<version>.oci.tar        the image (podman save, oci-archive)
    cozystack-gpu-device-plugin-recipe-<version>.tar.gz
                                                      deploy/device-plugin: the patch, the
                                                      Containerfile and build.sh that build
                                                      the device plugin image from NVIDIA's
                                                      source (the hoster builds it)
    SHA256SUMS                                        sha256sum -c checks them
They are always built from a clean checkout of the release commit (a temporary git
worktree), never from the work tree, so `rebuild` of a recorded release gives what `cut` gave.

Before the release is recorded, the collection tarball must pass galaxy-importer
(tools/galaxy-import.sh), so a release Galaxy would refuse is never cut.

Tools: helm from $COZYSTACK_GPU_BIN_DIR, or .cache/bin-dir, or PATH; ansible-galaxy and
antsibull-changelog next to this Python; podman for the image (as root).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RECORD = "releases.yaml"
# The files that carry the version, relative to the repository root.
GALAXY = "galaxy.yml"
CHART = "controller/chart/Chart.yaml"
VALUES = "controller/chart/values.yaml"
PACKAGE = "controller/pyproject.toml"
FRAGMENTS = "changelogs/fragments"
IMAGE_NAME = "cozystack-gpu-controller"
# The device plugin image recipe, shipped as it is: NVIDIA's source is the hoster's to fetch.
RECIPE = "deploy/device-plugin"
RECIPE_NAME = "cozystack-gpu-device-plugin-recipe"

# semver.org 2.0.0, without build metadata (a release is named by what precedes it).
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?$"
)


class Refused(Exception):
    """A release that must not be cut; the message says what is wrong and what would fix it."""


# --- versions (pure) -------------------------------------------------------------------------


@dataclass(frozen=True, order=False)
class Version:
    major: int
    minor: int
    patch: int
    pre: tuple[str, ...] = ()

    def __str__(self) -> str:
        core = f"{self.major}.{self.minor}.{self.patch}"
        return core + ("-" + ".".join(self.pre) if self.pre else "")

    def key(self) -> tuple[int, int, int, int, tuple[tuple[int, int, str], ...]]:
        """semver precedence: a pre-release sorts before its release; numeric identifiers
        compare as numbers and before alphanumeric ones."""
        pre = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre)
        return (self.major, self.minor, self.patch, 0 if self.pre else 1, pre)


def parse_version(text: str) -> Version:
    match = SEMVER.match(text)
    if not match:
        raise Refused(
            f"VERSION {text!r} is not a semantic version: give MAJOR.MINOR.PATCH, such as 0.2.0"
            " (a pre-release such as 0.2.0-rc.1 is allowed; no leading v, no build metadata)"
        )
    major, minor, patch, pre = match.groups()
    return Version(int(major), int(minor), int(patch), tuple(pre.split(".")) if pre else ())


def latest_release(record: dict[str, object]) -> tuple[Version, str] | None:
    """The newest recorded release and its commit, or None before the first."""
    entries = record.get("releases") or []
    assert isinstance(entries, list), f"{RECORD}: releases must be a list"
    if not entries:
        return None
    newest = max(entries, key=lambda e: parse_version(str(e["version"])).key())
    return parse_version(str(newest["version"])), str(newest["commit"])


def refuse_unless_newer(version: Version, record: dict[str, object]) -> None:
    latest = latest_release(record)
    if latest is not None and version.key() <= latest[0].key():
        raise Refused(
            f"VERSION {version} is not newer than the latest recorded release {latest[0]}"
            f" (commit {latest[1][:12]} in {RECORD}): give a version above {latest[0]}"
        )


def _sub_once(pattern: str, replacement: str, text: str, path: str) -> str:
    new, count = re.subn(pattern, replacement, text, count=1, flags=re.MULTILINE)
    if count != 1:
        raise Refused(f"{path}: no line matching {pattern!r} to set the version on")
    return new


def _package_version(text: str, version: str) -> str:
    """The version line of the [project] table only (other tables have their own)."""
    start = text.index("[project]")
    end = text.find("\n[", start + 1)
    end = len(text) if end < 0 else end
    section = _sub_once(r'^version = "[^"]*"$', f'version = "{version}"', text[start:end], PACKAGE)
    return text[:start] + section + text[end:]


def _image_tag(text: str, version: str) -> str:
    """An empty default tag means the chart's appVersion, which moves with the release; a
    pinned one is moved with it."""
    match = re.search(r'^(  tag: )"?([^"\n]*)"?$', text, flags=re.MULTILINE)
    if match is None:
        raise Refused(f"{VALUES}: no image.tag line")
    if match.group(2) == "":
        return text
    return text[: match.start()] + f'{match.group(1)}"{version}"' + text[match.end() :]


def set_versions(files: dict[str, str], version: str) -> dict[str, str]:
    """The files' new texts with ``version`` everywhere a release carries it; comments and
    every other line kept as they are."""
    return {
        GALAXY: _sub_once(r"^version: .*$", f"version: {version}", files[GALAXY], GALAXY),
        CHART: _sub_once(
            r"^appVersion: .*$",
            f'appVersion: "{version}"',
            _sub_once(r"^version: .*$", f"version: {version}", files[CHART], CHART),
            CHART,
        ),
        PACKAGE: _package_version(files[PACKAGE], version),
        VALUES: _image_tag(files[VALUES], version),
    }


def versions_in(files: dict[str, str]) -> dict[str, str]:
    """What each file says the version is (for the lockstep check and the dry run)."""
    import tomllib

    chart = yaml.safe_load(files[CHART])
    values = yaml.safe_load(files[VALUES])
    return {
        f"{GALAXY} version": str(yaml.safe_load(files[GALAXY])["version"]),
        f"{CHART} version": str(chart["version"]),
        f"{CHART} appVersion": str(chart["appVersion"]),
        f"{PACKAGE} project.version": str(tomllib.loads(files[PACKAGE])["project"]["version"]),
        f"{VALUES} image.tag (empty: appVersion)": str(
            values["image"]["tag"] or chart["appVersion"]
        ),
    }


def recipe_archive(recipe: Path, version: str, folder: Path, mtime: int) -> Path:
    """The recipe's files in one folder named for the release, as a tarball that is the same
    bytes whenever it is built from the same files and ``mtime`` (the release commit's time):
    sorted, owned by root, no build time in the tar or gzip headers."""
    top = f"{RECIPE_NAME}-{version}"
    archive = folder / f"{top}.tar.gz"
    files = sorted(p for p in recipe.rglob("*") if p.is_file())
    if not files:
        raise Refused(f"{recipe} holds no files: the device plugin recipe is missing")

    def entry(
        name: str, mode: int, size: int = 0, kind: bytes = tarfile.REGTYPE
    ) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.mode, info.size, info.type, info.mtime = mode, size, kind, mtime
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    with (
        archive.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=mtime) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        tar.addfile(entry(top, 0o755, kind=tarfile.DIRTYPE))
        for path in files:
            relative = path.relative_to(recipe).as_posix()
            mode = 0o755 if os.access(path, os.X_OK) else 0o644
            data = path.read_bytes()
            tar.addfile(entry(f"{top}/{relative}", mode, len(data)), io.BytesIO(data))
    return archive


def checksums(folder: Path) -> str:
    """SHA256SUMS in sha256sum's format, for every file in ``folder`` but itself."""
    lines = []
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.name != "SHA256SUMS"):
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {path.name}\n")
    return "".join(lines)


# --- the repository ----------------------------------------------------------------------------


def _run(argv: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    print("+ " + " ".join(argv), file=sys.stderr)
    done = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({done.returncode}):\n{done.stdout}{done.stderr}")
    return done.stdout


def _git(root: Path, *args: str) -> str:
    return _run(["git", *args], cwd=root)


def load_record(root: Path) -> dict[str, object]:
    data = yaml.safe_load((root / RECORD).read_text())
    assert isinstance(data, dict), f"{root / RECORD} is not a mapping"
    return data


def refuse_dirty(root: Path) -> None:
    status = _git(root, "status", "--porcelain", "--untracked-files=normal").splitlines()
    if status:
        listed = "\n  ".join(status[:20])
        raise Refused(
            "the work tree has uncommitted changes; a release is cut from a commit, so commit"
            f" or stash them first:\n  {listed}"
        )


def _read_files(root: Path) -> dict[str, str]:
    return {path: (root / path).read_text() for path in (GALAXY, CHART, PACKAGE, VALUES)}


def _tool(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else name


def _helm(root: Path) -> str:
    bin_dir = os.environ.get("COZYSTACK_GPU_BIN_DIR")
    if not bin_dir and (root / ".cache" / "bin-dir").exists():
        bin_dir = (root / ".cache" / "bin-dir").read_text().strip()
    if bin_dir and (Path(bin_dir) / "helm").exists():
        return str(Path(bin_dir) / "helm")
    found = shutil.which("helm")
    if found is None:
        raise Refused("no helm: set COZYSTACK_GPU_BIN_DIR (make binaries) or put helm on PATH")
    return found


def _image_repository(tree: Path) -> str:
    return str(yaml.safe_load((tree / VALUES).read_text())["image"]["repository"])


def build(
    root: Path, version: str, commit: str, out: Path, skip_image: bool, galaxy_check: bool
) -> Path:
    """The release's artefacts, built from a temporary worktree at ``commit``; with
    ``galaxy_check``, the collection must pass the checks Galaxy runs on upload."""
    folder = out / version
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix=f"cozystack-gpu-{version}-") as scratch:
        tree = Path(scratch) / "tree"
        _git(root, "worktree", "add", "--detach", str(tree), commit)
        try:
            carried = versions_in(_read_files(tree))
            wrong = {k: v for k, v in carried.items() if v != version}
            if wrong:
                raise Refused(f"commit {commit[:12]} does not carry version {version}: {wrong}")
            _run(
                [_tool("ansible-galaxy"), "collection", "build", "--output-path", str(folder)],
                cwd=tree,
            )
            if galaxy_check:
                collection = folder / f"cozystack-gpu-{version}.tar.gz"
                # Overridable so the release's own tests can stand in for Galaxy's checks.
                check = os.environ.get("COZYSTACK_GPU_GALAXY_IMPORT") or str(
                    root / "tools/galaxy-import.sh"
                )
                _run([check, str(collection)], cwd=root)
            _run([_helm(root), "package", str(tree / "controller/chart"), "-d", str(folder)], tree)
            # Releases before the recipe existed are rebuilt without it.
            if (tree / RECIPE).is_dir():
                mtime = int(_git(root, "show", "-s", "--format=%ct", commit).strip())
                recipe_archive(tree / RECIPE, version, folder, mtime)
            if not skip_image:
                _image(tree, version, folder)
        finally:
            _git(root, "worktree", "remove", "--force", str(tree))
    (folder / "SHA256SUMS").write_text(checksums(folder))
    return folder


def _image(tree: Path, version: str, folder: Path) -> None:
    """The release commit's own tools/build-image.sh, tagged with the chart's default image
    reference, saved as an OCI archive a hoster loads or pushes."""
    env = dict(
        os.environ,
        COZYSTACK_GPU_PYTHON=os.environ.get("COZYSTACK_GPU_PYTHON", sys.executable),
        # The developer's test image of the work tree stays; the release's is an extra one.
        COZYSTACK_GPU_IMAGE_KEEP_OTHERS="1",
    )
    built = _run([str(tree / "tools/build-image.sh")], cwd=tree, env=env).strip().splitlines()[-1]
    reference = f"{_image_repository(tree)}:{version}"
    _run(["podman", "tag", built, reference], cwd=tree)
    archive = folder / f"{IMAGE_NAME}-{version}.oci.tar"
    _run(["podman", "save", "--format", "oci-archive", "-o", str(archive), reference], cwd=tree)


def _record(root: Path, version: str, commit: str) -> None:
    """Appends the entry as text, so the file's comments stay."""
    path = root / RECORD
    text = path.read_text()
    if not text.endswith("\n"):
        text += "\n"
    path.write_text(text + f"  - version: {version}\n    commit: {commit}\n")


def cut(root: Path, text: str, out: Path, dry_run: bool, skip_image: bool) -> int:
    version = parse_version(text)
    record = load_record(root)
    refuse_unless_newer(version, record)
    refuse_dirty(root)
    files = _read_files(root)
    new = set_versions(files, str(version))
    fragments = sorted(p.name for p in (root / FRAGMENTS).glob("*.y*ml"))
    if dry_run:
        print(f"release {version} (dry run: nothing is changed)")
        before, after = versions_in(files), versions_in(new)
        for key in before:
            print(f"  {key}: {before[key]} -> {after[key]}")
        print(f"  CHANGELOG.rst: a {version} section from {len(fragments)} fragments, removed:")
        for name in fragments:
            print(f"    {FRAGMENTS}/{name}")
        print(f"  commit 'Release {version}', then built from it into {out / str(version)}/")
        print("  (the collection must pass tools/galaxy-import.sh, Galaxy's upload checks):")
        for name in _artefact_names(str(version), skip_image):
            print(f"    {name}")
        print(f"  {RECORD}: + version {version} with the release commit, in a second commit")
        return 0
    start = _git(root, "rev-parse", "HEAD").strip()
    try:
        for path, content in new.items():
            (root / path).write_text(content)
        # antsibull-changelog lists the collection's plugins with ansible-doc, found on PATH.
        tools_env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
        _run(
            [_tool("antsibull-changelog"), "release", "--version", str(version)],
            cwd=root,
            env=tools_env,
        )
        _git(root, "add", "-A", "--", ".")
        _git(root, "commit", "-q", "-m", f"Release {version}", "-m", "Versions, CHANGELOG.rst.")
        commit = _git(root, "rev-parse", "HEAD").strip()
        folder = build(root, str(version), commit, out, skip_image, galaxy_check=True)
    except BaseException:
        # The tree was clean when we started: going back to that commit drops only our work,
        # so a failed build never leaves a release commit without its record.
        _git(root, "reset", "-q", "--hard", start)
        _git(root, "clean", "-q", "-f", "--", "CHANGELOG.rst")
        print(f"release {version} not cut: the tree is back at {start[:12]}", file=sys.stderr)
        raise
    _record(root, str(version), commit)
    _git(root, "add", "--", RECORD)
    _git(root, "commit", "-q", "-m", f"Record release {version} ({commit[:12]})")
    print(f"release {version}: commit {commit}, artefacts in {folder}")
    return 0


def _artefact_names(version: str, skip_image: bool) -> list[str]:
    names = [
        f"cozystack-gpu-{version}.tar.gz",
        f"cozystack-gpu-{version}.tgz",
        f"{RECIPE_NAME}-{version}.tar.gz",
    ]
    if not skip_image:
        names.append(f"{IMAGE_NAME}-{version}.oci.tar")
    return [*names, "SHA256SUMS"]


def rebuild(root: Path, text: str, out: Path, skip_image: bool) -> int:
    version = parse_version(text)
    entries = load_record(root).get("releases") or []
    assert isinstance(entries, list)
    commits = [str(e["commit"]) for e in entries if str(e["version"]) == str(version)]
    if not commits:
        known = ", ".join(str(e["version"]) for e in entries)
        raise Refused(f"{version} is not a recorded release ({RECORD} has {known})")
    # Not the Galaxy check: an old release is rebuilt as it was, to compare or to upgrade from.
    folder = build(root, str(version), commits[0], out, skip_image, galaxy_check=False)
    print(f"release {version}: rebuilt from {commits[0]} in {folder}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("cut", "rebuild"):
        command = sub.add_parser(name)
        command.add_argument("version")
        command.add_argument("--skip-image", action="store_true", help="no image archive")
        command.add_argument("--out", type=Path, default=None, help="default: dist/ in the repo")
        command.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
        if name == "cut":
            command.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    out = (args.out or root / "dist").resolve()
    try:
        if args.command == "cut":
            return cut(root, args.version, out, args.dry_run, args.skip_image)
        return rebuild(root, args.version, out, args.skip_image)
    except Refused as refused:
        print(f"release refused: {refused}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
