"""Compile the .proto files of the controller package with grpcio-tools.

The generated ``*_pb2.py`` / ``*_pb2_grpc.py`` files are build output (git ignores them), so
``make setup`` runs this once after installing the package::

    python controller/gen_protos.py          # (re)generate
    python controller/gen_protos.py --check  # exit 1 if a generated file is missing or stale

Nothing generates them at import time: a missing module fails loudly with this command in
its message.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOS = (Path("cozystack_gpu/agent/podresources/api.proto"),)


def outputs(proto: Path) -> list[Path]:
    stem = HERE / proto.with_suffix("")
    return [stem.with_name(stem.name + "_pb2.py"), stem.with_name(stem.name + "_pb2_grpc.py")]


def stale(proto: Path) -> bool:
    source = (HERE / proto).stat().st_mtime
    return any(not out.exists() or out.stat().st_mtime < source for out in outputs(proto))


def generate(force: bool = True) -> list[Path]:
    """Compile every proto (only stale ones unless ``force``); returns the files written."""
    from grpc_tools import protoc  # a build-time dependency only

    include = Path(protoc.__file__).resolve().parent / "_proto"
    written: list[Path] = []
    for proto in PROTOS:
        if not force and not stale(proto):
            continue
        # The include root is the controller directory, so the generated grpc module imports
        # its messages as cozystack_gpu.agent.podresources.api_pb2.
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{HERE}",
                f"-I{include}",
                f"--python_out={HERE}",
                f"--grpc_python_out={HERE}",
                str(HERE / proto),
            ]
        )
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit {code})")
        written.extend(outputs(proto))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--check", action="store_true", help="only check they are up to date")
    args = parser.parse_args(argv)
    if args.check:
        missing = [str(p) for p in PROTOS if stale(p)]
        if missing:
            print("stale or missing generated code for: " + ", ".join(missing), file=sys.stderr)
            return 1
        return 0
    for path in generate():
        print(path.relative_to(HERE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
