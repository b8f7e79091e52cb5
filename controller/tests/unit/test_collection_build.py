"""The collection as users get it: a tarball built by ansible-galaxy, installed with the
collections it declares into an empty path, every module documented and runnable from there.

Galaxy is unreachable here, so the dependency tarballs are built, offline, from the copies
the ``ansible`` package installed in the virtual environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from cozystack_gpu_testkit import sysfs_scenarios

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
SITE_COLLECTIONS = Path(sysconfig.get_paths()["purelib"]) / "ansible_collections"
# Build and cache folders are never part of what ships.
SKIPPED_DIRS = {"build", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is not installed next to {sys.executable}"
    return str(path)


def _run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=cwd, timeout=300, check=False
    )
    assert done.returncode == 0, f"{argv[:3]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _galaxy() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "galaxy.yml").read_text())
    return data


def _isolated(collections: Path) -> dict[str, str]:
    """An environment where Ansible sees only ``collections`` (not the venv's copies)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "K8S_AUTH_"))}
    env.update(
        ANSIBLE_COLLECTIONS_PATH=str(collections),
        ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="false",
        ANSIBLE_LOCAL_TEMP=str(collections / ".tmp"),
        ANSIBLE_REMOTE_TEMP=str(collections / ".tmp"),
        ANSIBLE_NOCOLOR="1",
    )
    return env


def _dependency_tarball(fqcn: str, work: Path) -> Path:
    """Build ``fqcn``'s tarball from the venv's installed copy (its MANIFEST as galaxy.yml)."""
    installed = SITE_COLLECTIONS / fqcn.replace(".", "/")
    info = json.loads((installed / "MANIFEST.json").read_text())["collection_info"]
    source = work / "src" / fqcn
    shutil.copytree(
        installed,
        source,
        ignore=shutil.ignore_patterns("__pycache__", "MANIFEST.json", "FILES.json"),
    )
    (source / "galaxy.yml").write_text(yaml.safe_dump(info))
    out = work / "dist"
    _run(_tool("ansible-galaxy"), "collection", "build", "--output-path", str(out), str(source))
    (tarball,) = out.glob(f"{fqcn.replace('.', '-')}-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Our tarball and one per declared dependency."""
    work = tmp_path_factory.mktemp("galaxy")
    _run(
        _tool("ansible-galaxy"),
        "collection",
        "build",
        "--force",
        "--output-path",
        str(work),
        cwd=REPO,
    )
    (ours,) = work.glob("cozystack-gpu-*.tar.gz")
    tarballs = {"cozystack.gpu": ours}
    for fqcn in _galaxy()["dependencies"]:
        tarballs[fqcn] = _dependency_tarball(fqcn, work)
    return tarballs


@pytest.fixture(scope="module")
def installed(built: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty collections path, then ``ansible-galaxy collection install`` of the tarballs."""
    collections = tmp_path_factory.mktemp("collections")
    (collections / ".tmp").mkdir()
    _run(
        _tool("ansible-galaxy"),
        "collection",
        "install",
        "--offline",
        "-p",
        str(collections),
        *map(str, built.values()),
        env=_isolated(collections),
    )
    return collections


def test_the_tarball_leaves_out_tests_and_caches(built: dict[str, Path]) -> None:
    with tarfile.open(built["cozystack.gpu"]) as tar:
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


def test_every_collection_the_roles_use_is_declared_with_a_range() -> None:
    """An FQCN in roles/ or playbooks/ (module, filter, lookup) names a declared collection."""
    known = {
        f"{ns.name}.{coll.name}"
        for ns in SITE_COLLECTIONS.iterdir()
        if ns.is_dir()
        for coll in ns.iterdir()
        if (coll / "MANIFEST.json").exists()
    }
    fqcn = re.compile(r"(?<![\w.])([a-z][a-z0-9_]*)\.([a-z][a-z0-9_]*)\.[a-z][a-z0-9_]*")
    used: set[str] = set()
    for top in ("roles", "playbooks"):
        for path in (REPO / top).rglob("*"):
            if path.suffix in (".yml", ".yaml", ".j2"):
                used |= {f"{a}.{b}" for a, b in fqcn.findall(path.read_text())}
    used = (used & known) - {"ansible.builtin"}
    declared = _galaxy()["dependencies"]
    assert used, "no collection found in roles/ or playbooks/: the scan is broken"
    assert used <= set(declared), f"used but not declared in galaxy.yml: {used - set(declared)}"
    for name, spec in declared.items():
        assert re.fullmatch(r">=\d+\.\d+\.\d+,<\d+\.\d+\.\d+", spec), f"{name}: {spec!r}"


def test_the_tarball_installs_with_its_dependencies_into_an_empty_path(
    installed: Path,
) -> None:
    root = installed / "ansible_collections"
    found = {f"{ns.name}.{c.name}" for ns in root.iterdir() if ns.is_dir() for c in ns.iterdir()}
    assert found == {"cozystack.gpu", *_galaxy()["dependencies"]}
    ours = root / "cozystack" / "gpu"
    assert (ours / "meta" / "runtime.yml").exists()
    # Shared code: module_utils links into the controller package, and the links survive.
    for name, owner in (
        ("gpu_sysfs.py", "cozystack_gpu/agent/sysfs.py"),
        ("gpu_keys.py", "cozystack_gpu/keys.py"),
        ("gpu_class_rules.py", "cozystack_gpu/class_rules.py"),
    ):
        linked = ours / "plugins" / "module_utils" / name
        assert linked.read_bytes() == (REPO / "controller" / owner).read_bytes(), name


def test_ansible_doc_documents_every_module_from_the_installed_path(installed: Path) -> None:
    modules = sorted(f"cozystack.gpu.{p.stem}" for p in (REPO / "plugins" / "modules").glob("*.py"))
    docs = json.loads(_run(_tool("ansible-doc"), "--json", *modules, env=_isolated(installed)))
    assert sorted(docs) == modules
    for name, entry in docs.items():
        assert entry["doc"]["short_description"], name
    # The connection options are documented in this collection's own fragment (k8s_auth).
    for name in ("cozystack.gpu.gpu_class", "cozystack.gpu.gpu_class_info"):
        options = docs[name]["doc"]["options"]
        assert {"kubeconfig", "impersonate_user", "proxy_headers"} <= set(options), name


def test_our_tarball_alone_documents_every_module_as_galaxy_reads_it(
    built: dict[str, Path], tmp_path: Path
) -> None:
    """Galaxy's importer runs ansible-doc on the collection alone, with no dependency
    installed beside it: every module, the Kubernetes ones with their connection options,
    is documented from our tarball alone (an extended fragment of kubernetes.core made
    ansible-doc fail for all of them, and Galaxy showed them undocumented)."""
    alone = tmp_path / "alone"
    (alone / ".tmp").mkdir(parents=True)
    env = _isolated(alone)
    galaxy = _tool("ansible-galaxy")
    tarball = str(built["cozystack.gpu"])
    _run(
        galaxy,
        "collection",
        "install",
        "--offline",
        "--no-deps",
        "-p",
        str(alone),
        tarball,
        env=env,
    )
    modules = sorted(f"cozystack.gpu.{p.stem}" for p in (REPO / "plugins" / "modules").glob("*.py"))
    done = subprocess.run(
        [_tool("ansible-doc"), "--json", *modules],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    docs = json.loads(done.stdout)
    assert sorted(docs) == modules
    for name in ("cozystack.gpu.gpu_class", "cozystack.gpu.gpu_class_info"):
        assert {"kubeconfig", "impersonate_user", "proxy_headers"} <= set(
            docs[name]["doc"]["options"]
        ), name


def test_a_module_runs_from_the_installed_path(installed: Path, tmp_path: Path) -> None:
    """gpu_facts reads a fixture tree through the installed module_utils (links included)."""
    tree = sysfs_scenarios.SCENARIOS["l40s-sriov"](tmp_path / "root")
    out = _run(
        _tool("ansible"),
        "localhost",
        "-c",
        "local",
        "-i",
        "localhost,",
        "-e",
        f"ansible_python_interpreter={sys.executable}",
        "-m",
        "cozystack.gpu.gpu_facts",
        "-a",
        f"root={tree.root}",
        "-o",
        env=_isolated(installed),
    )
    result = json.loads(out.split(" => ", 1)[1])
    facts = result["ansible_facts"]["cozystack_gpu"]
    assert facts["resource_names"] and facts["functions"]


def test_the_layout_checks_model_ships_in_the_collection_and_needs_only_the_stdlib(
    installed: Path,
) -> None:
    """gpu_node_layout's action plugin judges claims with the controller's own cluster view
    and model (``cozystack_gpu.layout_preview``), imported from the collection's controller/
    directory on the Ansible controller: it must be there and import with the standard
    library alone."""
    ours = installed / "ansible_collections" / "cozystack" / "gpu"
    assert (ours / "plugins" / "action" / "gpu_node_layout.py").is_file()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        " import cozystack_gpu.layout_preview as p, cozystack_gpu.model as m;"
        " print(p.__file__); print(m.__file__)"
    )
    # -S: no site-packages, so nothing but the standard library and that directory.
    out = _run(sys.executable, "-S", "-c", code, str(ours / "controller"))
    preview, model = out.split()
    assert preview == str(ours / "controller" / "cozystack_gpu" / "layout_preview.py")
    assert model.startswith(str(ours / "controller" / "cozystack_gpu" / "model"))


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
    assert {p.name for p in shared} >= {"gpu_keys.py", "gpu_sysfs.py", "gpu_class_rules.py"}
    for path, target in shared.items():
        assert target.is_relative_to(controller / "cozystack_gpu"), (path, target)
        assert target.is_file(), f"{path} points at {target}, which is missing"


def test_every_role_has_a_readme_naming_each_of_its_variables(built: dict[str, Path]) -> None:
    """Galaxy refuses a collection with a role that has no README ("No role readme found",
    galaxy-importer; `make galaxy-import` runs it on the tarball); a README that leaves out a
    variable of the role's argument spec leaves a hoster guessing."""
    with tarfile.open(built["cozystack.gpu"]) as tar:
        names = set(tar.getnames())
    missing: dict[str, list[str]] = {}
    for role in sorted(p for p in (REPO / "roles").iterdir() if p.is_dir()):
        if f"roles/{role.name}/README.md" not in names:
            missing[role.name] = ["README.md"]
            continue
        readme = (role / "README.md").read_text()
        spec = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())
        options = spec["argument_specs"]["main"]["options"]
        unnamed = [name for name in options if f"`{name}`" not in readme]
        if unnamed:
            missing[role.name] = unnamed
    assert missing == {}, f"roles whose README is missing or does not name these: {missing}"
