"""docs/operations.md gives the commands a hoster runs after ``helm uninstall``: the one that
lets GPUClasses be deleted (with no controller left, the class-protection finalizer would
keep a deleted class Terminating for good), and the one that removes the licence copies the
uninstall keeps on purpose. Each is run here as the page prints it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cozystack_gpu import keys
from cozystack_gpu.licensing import rules as licence_rules
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
MARK = "<!-- command: release the classes after uninstall -->"


COPIES_MARK = "<!-- command: remove the licence copies after uninstall -->"


def documented_command(mark: str = MARK) -> str:
    """The fenced bash block right after the page's marker (indented in a list or not)."""
    text = DOC.read_text()
    assert mark in text, f"docs/operations.md lacks the marked command ({mark})"
    found = re.search(r"```bash\n(.*?)```", text[text.index(mark) :], re.DOTALL)
    assert found, "the marker is followed by no bash block"
    return "\n".join(line.strip() for line in found.group(1).splitlines())


def _bash(plane: ControlPlane, command: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{plane.bin_dir}:{os.environ['PATH']}",
        "KUBECONFIG": str(plane.kubeconfig),
    }
    return subprocess.run(
        ["bash", "-c", command], env=env, capture_output=True, text=True, check=True
    )


def _class(kube: Kube, name: str, finalizers: list[str]) -> None:
    kube.gpu_class(name, "nvidia.com/GPU_DOC", selector={"doc": name})
    kube.custom.patch_cluster_custom_object(
        keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name,
        {"metadata": {"finalizers": finalizers}},
    )  # fmt: skip
    kube.custom.delete_cluster_custom_object(keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name)


def _get(kube: Kube, name: str) -> dict[str, object] | None:
    found: dict[str, object] | None = unless(
        404,
        lambda: kube.custom.get_cluster_custom_object(
            keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name
        ),
    )
    return found


def test_the_documented_command_lets_deleted_classes_go_after_uninstall(
    control_plane: ControlPlane, api_client: object
) -> None:
    command = documented_command()
    kube = Kube(api_client)
    ours, shared = "doc-left-behind", "doc-also-held"
    _class(kube, ours, [keys.FINALIZER_CLASS])
    _class(kube, shared, [keys.FINALIZER_CLASS, "example.com/keep"])
    try:
        run = _bash(control_plane, command)
        wait_for(lambda: _get(kube, ours) is None, what="the deleted class gone")
        # A finalizer of someone else's is left alone, and the command says so.
        held = _get(kube, shared)
        assert held is not None
        assert held["metadata"]["finalizers"] == [  # type: ignore[index]
            keys.FINALIZER_CLASS,
            "example.com/keep",
        ]
        assert shared in run.stderr + run.stdout, (run.stdout, run.stderr)
    finally:
        for name in (ours, shared):
            unless(
                404,
                lambda name=name: kube.custom.patch_cluster_custom_object(
                    keys.GROUP, keys.VERSION, keys.PLURAL_CLASSES, name,
                    {"metadata": {"finalizers": None}},
                ),
            )  # fmt: skip


def test_the_documented_command_removes_the_licence_copies_and_nothing_else(
    control_plane: ControlPlane, api_client: object, namespace: str
) -> None:
    """helm uninstall keeps the copies (they are the controller's, not the release's); the
    page's command removes every copy and leaves the tenant's own Secrets."""
    kube = Kube(api_client)
    copy = {
        "metadata": {
            "name": keys.license_copy_name("doc-l40s"),
            "labels": licence_rules.copy_labels("doc-l40s"),
        },
        "type": keys.LICENSE_SECRET_TYPE,
        "stringData": {keys.LICENSE_TOKEN_KEY: "stand-in"},
    }
    own = {"metadata": {"name": "tenant-own", "labels": {"app": "x"}}, "stringData": {"k": "v"}}
    for body in (copy, own):
        kube.core.create_namespaced_secret(namespace, body)
    _bash(control_plane, documented_command(COPIES_MARK))
    left = {s.metadata.name for s in kube.core.list_namespaced_secret(namespace).items}
    assert keys.license_copy_name("doc-l40s") not in left, left
    assert "tenant-own" in left, left
