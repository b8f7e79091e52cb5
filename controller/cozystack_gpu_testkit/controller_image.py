"""This tree's controller image in a real node's containerd: built by tools/build-image.sh
(its layer cache makes a rebuild of an unchanged tree quick), saved as an OCI archive and
imported, since no registry is reachable (``node``). Shared by the real-node tests and the
demo."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cozystack_gpu_testkit.cluster import REPO_ROOT
from cozystack_gpu_testkit.node import RealNode

BUILD_IMAGE = REPO_ROOT / "tools" / "build-image.sh"


class ImageError(RuntimeError):
    """The image could not be built or handed to the node."""


def build() -> str:
    """Builds the image (once per tree) and returns its reference. Other builds are kept:
    another checkout's tests may be running theirs."""
    built = subprocess.run(
        ["bash", str(BUILD_IMAGE)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "COZYSTACK_GPU_IMAGE_KEEP_OTHERS": "1"},
    )
    if built.returncode != 0:
        raise ImageError(f"{BUILD_IMAGE} failed:\n{built.stderr[-4000:]}")
    return built.stdout.strip().splitlines()[-1]


def hand_to(node: RealNode, image: str, scratch: Path) -> None:
    """Puts ``image`` (a podman image) into the node's containerd."""
    archive = scratch / f"{image.rsplit('/', 1)[-1].replace(':', '-')}.oci.tar"
    saved = subprocess.run(
        ["podman", "save", "--quiet", "--format", "oci-archive", "--output", str(archive), image],
        capture_output=True,
        text=True,
        check=False,
    )
    if saved.returncode != 0:
        raise ImageError(f"podman save {image} failed: {saved.stderr.strip()}")
    try:
        node.import_image(archive)
    finally:
        archive.unlink(missing_ok=True)


def build_into(node: RealNode, scratch: Path) -> str:
    """The image of this tree, built and imported into ``node``; returns its reference."""
    image = build()
    hand_to(node, image, scratch)
    return image
