"""Warm start time of the local control plane (binaries already built and cached).

    COZYSTACK_GPU_BIN_DIR=$(tools/build-binaries.sh) .venv/bin/python \
        controller/benchmarks/control_plane_bench.py [runs]

Prints, per run, the time from nothing running to /readyz answering 200, and to the three
gpu.cozystack.io CRDs being Established; then the median and the worst.
"""

from __future__ import annotations

import statistics
import sys
import time

from cozystack_gpu_testkit import cluster


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    bin_dir = cluster.binary_dir()
    ready: list[float] = []
    with_crds: list[float] = []
    version = ""
    for i in range(runs):
        start = time.perf_counter()
        plane = cluster.start(bin_dir=bin_dir)
        try:
            ready.append(time.perf_counter() - start)
            cluster.install_crds(plane.api_client())
            with_crds.append(time.perf_counter() - start)
            version = plane.version()
        finally:
            plane.stop()
        print(f"run {i + 1}: ready {ready[-1]:.2f} s, CRDs established {with_crds[-1]:.2f} s")
    print(f"kube-apiserver {version}, {runs} warm starts")
    print(f"ready:            median {statistics.median(ready):.2f} s, worst {max(ready):.2f} s")
    print(
        f"CRDs established: median {statistics.median(with_crds):.2f} s, "
        f"worst {max(with_crds):.2f} s"
    )


if __name__ == "__main__":
    main()
