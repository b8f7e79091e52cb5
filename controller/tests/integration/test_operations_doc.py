"""docs/operations.md gives the command that lets a hoster delete GPUClasses after
``helm uninstall``: with no controller left, the class-protection finalizer would keep a
deleted class Terminating for good. The command is run here as the page prints it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from cozystack_gpu import keys
from cozystack_gpu_testkit.cluster import ControlPlane
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
MARK = "<!-- command: release the classes after uninstall -->"


def documented_command() -> str:
    """The fenced bash block right after the page's marker."""
    text = DOC.read_text()
    assert MARK in text, f"docs/operations.md lacks the marked command ({MARK})"
    found = re.search(r"```bash\n(.*?)```", text[text.index(MARK) :], re.DOTALL)
    assert found, "the marker is followed by no bash block"
    return found.group(1)


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
        env = {
            **os.environ,
            "PATH": f"{control_plane.bin_dir}:{os.environ['PATH']}",
            "KUBECONFIG": str(control_plane.kubeconfig),
        }
        run = subprocess.run(
            ["bash", "-c", command], env=env, capture_output=True, text=True, check=True
        )
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
