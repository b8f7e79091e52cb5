"""The leader's side of a VM start (issue 10's third figure): a gated launcher pod until it
is pinned to its claims' node and ungated, against a real local API server.

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \
        controller/benchmarks/gate_bench.py [--vms 500] [--nodes 100] [--rate 20]

A fresh control plane with ``--nodes`` GPU nodes of 8 units and one class; the binder in
this process (usage records off). ``--vms`` claims of 1 unit are ordered and bound first;
then, for each, a VMI naming its claim (stored as the VMI webhook leaves it) and its
launcher pod held at the scheduling gate, created at ``--rate`` pods a second from 4
threads, as virt-controller creates them. A watch on the pods times each from the
client's create returned to the first version the binder pinned and ungated. The gate
controller has to read the VMI, the claims and their node, and send one pod update.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from apiserver_load import RESOURCE, Bench, answered, create_many, percentile, wait_until
from binder_bench import config
from kubernetes import watch

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu.objects import vmi_pods
from cozystack_gpu_testkit import cluster


class ReleaseWatch:
    """When each launcher pod was first seen pinned and ungated, and the node it was pinned to."""

    def __init__(self, kube: Any, namespace: str) -> None:
        self.released: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self._stopped = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(
            target=self._run, args=(kube, namespace), name="pods", daemon=True
        )
        self._thread.start()

    def _run(self, kube: Any, namespace: str) -> None:
        try:
            for event in self._watch.stream(kube.core.list_namespaced_pod, namespace):
                pod = kube.api.sanitize_for_serialization(event["object"])
                name = pod["metadata"]["name"]
                node = vmi_pods.pinned_node(pod)
                if name in self.released or vmi_pods.is_gated(pod) or node is None:
                    continue
                self.nodes[name] = node
                self.released[name] = time.perf_counter()
        except Exception:  # the plane stopped under the watch: the figures are taken
            if not self._stopped:
                raise

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def vmi_body(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": keys.VMI.api_version,
        "kind": keys.VMI.kind,
        "metadata": {
            "name": name,
            "labels": {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE},
            "annotations": {keys.ANNOTATION_CLAIMS: json.dumps({"claims": [claim]})},
        },
        "spec": {"domain": {"devices": {}}},
    }


def launcher_body(name: str, vmi: dict[str, Any], migration: str | None = None) -> dict[str, Any]:
    """VMI ``name``'s launcher pod held at the gate, as the pod webhook leaves it; with a
    ``migration`` uid, the target pod virt-controller makes for that migration of the VMI
    (the same pod, labelled with the migration and named apart)."""
    requests = {RESOURCE: "1"}
    labels = {"kubevirt.io": "virt-launcher", keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE}
    pod = f"virt-launcher-{name}"
    if migration is not None:
        labels[keys.LABEL_MIGRATION_JOB_UID] = migration
        pod = f"{pod}-{migration[:5]}"
    return {
        "metadata": {
            "name": pod,
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": keys.VMI.api_version,
                    "kind": keys.VMI.kind,
                    "name": name,
                    "uid": vmi["metadata"]["uid"],
                    "controller": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "compute",
                    "image": "virt-launcher",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
            "schedulingGates": [{"name": keys.SCHEDULING_GATE_CLAIMS}],
        },
    }


@contextmanager
def gate_plane(
    nodes: int, bin_dir: Path, crds: Sequence[dict[str, Any]] = ()
) -> Iterator[tuple[Bench, Binder]]:
    """A fresh control plane with ``nodes`` GPU nodes of 8 units and one class (and the
    CRDs of ``crds``), and the binder in this process (usage records off), its first
    listing done."""
    bench = Bench.start(nodes, 8, bin_dir)
    if crds:
        path = bench.plane.workdir / "bench-crds.yaml"
        path.write_text(yaml.safe_dump_all(list(crds)))
        cluster.install_crds(bench.kube.api, [path])
    binder = Binder(bench.kube.api, config(bench.controller_ns))
    try:
        binder.start()
        assert binder.synced.wait(60), "the binder did not finish its first listing"
        yield bench, binder
    finally:
        binder.stop()
        bench.stop()


def ready_vmis(bench: Bench, claims: list[str]) -> dict[str, dict[str, Any]]:
    """Claims of 1 unit named ``claims``, ordered and waited for until every one is bound,
    then a VMI ``vm-<claim>`` naming each (stored as the VMI webhook leaves it): each VMI
    as created, by name."""
    kube, tenant = bench.kube, bench.tenant
    create_many(bench.claim_creator(), claims)
    wanted = set(claims)

    def all_bound() -> bool:
        bound = [
            c for c in kube.claims(tenant)
            if c["metadata"]["name"] in wanted and (c.get("status") or {}).get("phase") == "Bound"
        ]  # fmt: skip
        return len(bound) == len(wanted)

    wait_until(all_bound, 120)
    vmis = {}
    for claim in claims:
        name = f"vm-{claim}"
        vmis[name] = kube.custom.create_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, vmi_body(name, claim)
        )
    return vmis


def create_at_rate(
    bench: Bench, pods: list[dict[str, Any]], rate: float, started: float
) -> dict[str, float]:
    """Create ``pods`` in order, the i-th due ``i / rate`` seconds after ``started``, from 4
    client threads as virt-controller creates them; when each create returned, by name."""
    core, tenant = bench.kube.core, bench.tenant
    created: dict[str, float] = {}

    def create(index_and_pod: tuple[int, dict[str, Any]]) -> None:
        index, pod = index_and_pod
        time.sleep(max(0.0, started + index / rate - time.perf_counter()))
        answered(core.create_namespaced_pod(tenant, pod, _preload_content=False))
        created[pod["metadata"]["name"]] = time.perf_counter()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(create, enumerate(pods)))
    return created


def spread(latencies: list[float]) -> str:
    return (
        f"p50 {percentile(latencies, 0.5):.0f} ms, p99 {percentile(latencies, 0.99):.0f} ms, "
        f"max {max(latencies):.0f} ms"
    )


def run(vms: int, nodes: int, rate: float, bin_dir: Path) -> None:
    with gate_plane(nodes, bin_dir) as (bench, _binder):
        vmis = ready_vmis(bench, [f"c{i:05d}" for i in range(vms)])
        watcher = ReleaseWatch(bench.kube, bench.tenant)
        cpu_before = os.times()
        started = time.perf_counter()
        pods = [launcher_body(name, vmi) for name, vmi in vmis.items()]
        created = create_at_rate(bench, pods, rate, started)
        wait_until(lambda: len(watcher.released) >= vms, 120)
        elapsed = time.perf_counter() - started
        cpu = os.times()
        watcher.stop()
        latencies = [(watcher.released[p] - created[p]) * 1000 for p in created]
        print(f"gate: {vms} gated launcher pods at {rate:g}/s on {nodes} nodes")
        print(f"  created → pinned and ungated: {spread(latencies)}")
        busy = (cpu.user + cpu.system) - (cpu_before.user + cpu_before.system)
        print(
            f"  all released {elapsed:.1f} s after the first create; this process (binder and "
            f"load) {busy / vms * 1000:.1f} ms CPU per start"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--vms", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rate", type=float, default=20.0, help="launcher pods created a second")
    args = parser.parse_args()
    bin_dir = Path(os.environ["COZYSTACK_GPU_BIN_DIR"])
    run(args.vms, args.nodes, args.rate, bin_dir)


if __name__ == "__main__":
    main()
