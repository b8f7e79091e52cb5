"""Warm start time of the local control plane (binaries already built and cached).

    COZYSTACK_GPU_BIN_DIR=$(tools/build-binaries.sh) .venv/bin/python \
        controller/benchmarks/control_plane_bench.py [runs]

Prints, per run, the time from nothing running to /readyz answering 200, and to the three
gpu.cozystack.io CRDs being Established; then the same for the fuller plane the test
session runs: every CRD (gpu, usage records, KubeVirt's) Established, kube-controller-manager
having made the default ServiceAccount, and kube-scheduler having bound a first pod. Then
the median and the worst of each.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.objects import WORKLOAD_CRD, Kube, wait_for


def _summary(label: str, values: list[float]) -> str:
    return f"{label:<22} median {statistics.median(values):.2f} s, worst {max(values):.2f} s"


def _first_binding(plane: cluster.ControlPlane) -> None:
    kube = Kube(plane.api_client())
    kube.node("bench-node", allocatable={"bench.example/unit": 1})
    kube.pod("default", "bench-pod", requests={"bench.example/unit": 1}, pinned_to="bench-node")
    wait_for(
        lambda: kube.core.read_namespaced_pod("bench-pod", "default").spec.node_name,
        timeout=60,
        what="the first binding",
    )


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

    crds: list[Path] = [
        *sorted(cluster.CRD_DIR.glob("*.yaml")),
        WORKLOAD_CRD,
        cluster.kubevirt_crds(bin_dir),
    ]
    full: list[float] = []
    bound: list[float] = []
    for i in range(runs):
        start = time.perf_counter()
        plane = cluster.start(bin_dir=bin_dir, scheduler=True, controller_manager=True, crds=crds)
        try:
            full.append(time.perf_counter() - start)
            _first_binding(plane)
            bound.append(time.perf_counter() - start)
        finally:
            plane.stop()
        print(
            f"full run {i + 1}: CRDs + controller-manager ready {full[-1]:.2f} s, "
            f"first pod bound {bound[-1]:.2f} s"
        )

    print(f"kube-apiserver {version}, {runs} warm starts of each")
    print(_summary("ready:", ready))
    print(_summary("CRDs established:", with_crds))
    print(_summary("full plane ready:", full))
    print(_summary("first pod bound:", bound))


if __name__ == "__main__":
    main()
