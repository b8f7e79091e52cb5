"""A live migration's target pod against a VM start (issue 44, SPEC §12): from the target
pod's creation to its pin, beside VM starts in the same run, with VMs running; against a
real local API server.

    COZYSTACK_GPU_BIN_DIR=$(cat .cache/bin-dir) .venv/bin/python \\
        controller/benchmarks/migration_bench.py [--vms 1000] [--nodes 400] [--rate 20]

The plane and the binder are gate_bench's (GPU nodes of 8 units, one class, the binder in
this process). ``--vms`` VMs are started through the gate first: claims of 1 unit bound, a
VMI naming each, its launcher pod pinned and ungated by the binder (created as fast as 4
threads go, not timed). Each VMI is then written Running on the node its launcher pod was
pinned to, as virt-handler would (no KubeVirt here, so no virt-api to refuse it); the
binder attached its claim when it saw the VMI, so every running VM's claim is Attached on
that node (and ``LiveMigratable``, as virt-handler marks an mdev vGPU VMI). Then ``--vms``
fresh starts are made ready as gate_bench makes them (new claims bound, a VMI naming each),
and the timed stream begins, from 4 threads for each kind: for each running VM, at
``--rate`` a second, a ``VirtualMachineInstanceMigration`` and, as soon as its create
returns, its target pod (the same launcher pod of its VMI, labelled
``kubevirt.io/migrationJobUID`` with the migration's uid and held at the gate, as
virt-controller renders it once it sees the migration and the pod webhook gates it);
between them, at the same rate, a fresh start's gated launcher pod. A pod watch times
every pod from its create returned to the first version pinned and ungated. The binder
places and records a target when it sees the migration, so the pod, when it comes, waits
for that record at most, then for one pod update, as a start does.

Every VM's unit is held twice during its migration, and the fresh starts hold theirs: the
nodes must have room for three units a VM (``--nodes`` of 8 units, at least 3 ``--vms`` / 8).
"""

from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from apiserver_load import Bench, answered, percentile, wait_until
from gate_bench import ReleaseWatch, create_at_rate, gate_plane, launcher_body, ready_vmis, spread

from cozystack_gpu import keys
from cozystack_gpu.binder.loop import Binder
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.kubevirt.install import manifests_file

UNITS = 8  # a node's units (gate_plane's)
HELD_PER_VM = 3  # its source, its migration's target, and a fresh start's


def run_vmis(bench: Bench, binder: Binder, nodes: dict[str, str]) -> None:
    """Each VMI ``name`` Running on ``nodes[name]``, as virt-handler writes it once the VM
    runs there; waits until the binder's view shows every one Running and the API every
    one's claim Attached to it on that node."""
    custom, tenant = bench.kube.custom, bench.tenant

    def running(name: str) -> None:
        migratable = [{"type": "LiveMigratable", "status": "True"}]
        body = {"status": {"phase": "Running", "nodeName": nodes[name], "conditions": migratable}}
        answered(custom.patch_namespaced_custom_object(
            keys.VMI.group, keys.VMI.version, tenant, keys.VMI.plural, name, body,
            _preload_content=False,
        ))  # fmt: skip

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(running, nodes))

    def seen_running() -> bool:
        return all(
            ((binder.view.vmi_object((tenant, name)) or {}).get("status") or {}).get("phase")
            == "Running"
            for name in nodes
        )

    def attached() -> bool:
        held = {
            (status.get("attachedTo"), status.get("nodeName"))
            for claim in bench.kube.claims(tenant)
            if (status := claim.get("status") or {}).get("phase") == "Attached"
        }
        return all((name, node) in held for name, node in nodes.items())

    wait_until(seen_running, 60)
    wait_until(attached, 60)


def migrations_at_rate(
    bench: Bench, running: dict[str, dict[str, Any]], rate: float, started: float
) -> tuple[dict[str, tuple[dict[str, Any], float]], list[float]]:
    """For each running VMI, due ``i / rate`` seconds after ``started`` from 4 threads: a
    migration of it, then its target pod labelled with the migration's uid. Returns each
    VMI's target pod with when its create returned, and how long each migration create
    took (ms)."""
    custom, core, tenant = bench.kube.custom, bench.kube.core, bench.tenant
    made: dict[str, tuple[dict[str, Any], float]] = {}
    job_ms: list[float] = []

    def migrate(index_and_name: tuple[int, str]) -> None:
        index, name = index_and_name
        time.sleep(max(0.0, started + index / rate - time.perf_counter()))
        asked = time.perf_counter()
        job = custom.create_namespaced_custom_object(
            keys.VMIM.group, keys.VMIM.version, tenant, keys.VMIM.plural,
            {"apiVersion": keys.VMIM.api_version, "kind": keys.VMIM.kind,
             "metadata": {"name": f"move-{name}"}, "spec": {"vmiName": name}},
        )  # fmt: skip
        job_ms.append((time.perf_counter() - asked) * 1000)
        pod = launcher_body(name, running[name], str(job["metadata"]["uid"]))
        answered(core.create_namespaced_pod(tenant, pod, _preload_content=False))
        made[name] = (pod, time.perf_counter())

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(migrate, enumerate(running)))
    return made, job_ms


def run(vms: int, nodes: int, rate: float, bin_dir: Path) -> None:
    if nodes * UNITS < HELD_PER_VM * vms:
        raise SystemExit(
            f"{vms} VMs need {HELD_PER_VM * vms} units (source, target, a fresh start's): "
            f"--nodes {-(-HELD_PER_VM * vms // UNITS)} at least"
        )
    # KubeVirt's VirtualMachineInstanceMigration CRD, from what virt-operator installs.
    manifests = cluster.load_manifests(manifests_file(bin_dir))
    crds = [
        d for d in manifests
        if d["kind"] == "CustomResourceDefinition"
        and d["spec"]["names"]["plural"] == keys.VMIM.plural
    ]  # fmt: skip
    with gate_plane(nodes, bin_dir, crds) as (bench, binder):
        watcher = ReleaseWatch(bench.kube, bench.tenant)
        running = ready_vmis(bench, [f"r{i:05d}" for i in range(vms)])
        launchers = {name: launcher_body(name, vmi) for name, vmi in running.items()}
        create_at_rate(bench, list(launchers.values()), float("inf"), time.perf_counter())
        wait_until(lambda: len(watcher.released) >= vms, 120)
        source = {name: watcher.nodes[pod["metadata"]["name"]] for name, pod in launchers.items()}
        run_vmis(bench, binder, source)

        fresh = ready_vmis(bench, [f"s{i:05d}" for i in range(vms)])
        starts = [launcher_body(name, vmi) for name, vmi in fresh.items()]
        cpu_before = os.times()
        started = time.perf_counter()
        # Each migration: the VirtualMachineInstanceMigration, then at once its target pod
        # (virt-controller renders it once it sees the migration), between two starts.
        with ThreadPoolExecutor(1) as beside:
            migrating = beside.submit(migrations_at_rate, bench, running, rate, started)
            created = create_at_rate(bench, starts, rate, started + 0.5 / rate)
            targets, jobs_ms = migrating.result()
        created.update({pod["metadata"]["name"]: at for pod, at in targets.values()})
        wait_until(lambda: all(p in watcher.released for p in created), 120)
        elapsed = time.perf_counter() - started
        cpu = os.times()
        watcher.stop()

        moved = sum(
            1
            for vmi, (pod, _at) in targets.items()
            if watcher.nodes[pod["metadata"]["name"]] != source[vmi]
        )
        recorded = sum(
            1 for claim in bench.kube.claims(bench.tenant)
            if ((claim.get("status") or {}).get("migration") or {}).get("migrationUID")
        )  # fmt: skip
        assert moved == vms, f"only {moved} of {vms} targets pinned off their source node"
        assert recorded == vms, f"only {recorded} of {vms} claims record their target"

        def latencies(kind: list[dict[str, Any]]) -> list[float]:
            names = [p["metadata"]["name"] for p in kind]
            return [(watcher.released[p] - created[p]) * 1000 for p in names]

        target_ms = latencies([pod for pod, _at in targets.values()])
        start_ms = latencies(starts)
        ratio = percentile(target_ms, 0.99) / percentile(start_ms, 0.99)
        busy = (cpu.user + cpu.system) - (cpu_before.user + cpu_before.system)
        print(
            f"migration: {vms} target pods interleaved with {vms} VM starts at {rate:g}/s each, "
            f"{vms} VMs running, on {nodes} nodes"
        )
        print(f"  migration object created (its create call): {spread(jobs_ms)}")
        print(f"  target pod created → pinned and ungated: {spread(target_ms)}")
        print(f"  start pod created → pinned and ungated:  {spread(start_ms)}")
        print(
            f"  all released {elapsed:.1f} s after the first create; this process (binder and "
            f"load) {busy / (2 * vms) * 1000:.1f} ms CPU per pod"
        )
        print(
            f"| {vms} VMs running, {vms} targets beside {vms} starts at {rate:g}/s each, "
            f"{nodes} nodes | target p50 {percentile(target_ms, 0.5):.0f} ms, p99 "
            f"{percentile(target_ms, 0.99):.0f} ms | start p50 {percentile(start_ms, 0.5):.0f} "
            f"ms, p99 {percentile(start_ms, 0.99):.0f} ms | p99 target/start {ratio:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--vms", type=int, default=1000, help="VMs running, each migrated once")
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument(
        "--rate", type=float, default=20.0, help="target pods a second, and as many start pods"
    )
    args = parser.parse_args()
    bin_dir = Path(os.environ["COZYSTACK_GPU_BIN_DIR"])
    run(args.vms, args.nodes, args.rate, bin_dir)


if __name__ == "__main__":
    main()
