"""What happens to nodes: NotReady, cordoned, short of memory or of one GPU, and back."""

from __future__ import annotations

from collections.abc import Mapping

from cozystack_gpu import keys
from cozystack_gpu_testkit import dra_objects
from cozystack_gpu_testkit.fault_suite import Run
from cozystack_gpu_testkit.fuzz.stage import Stage
from cozystack_gpu_testkit.objects import NODE_BASE_RESOURCES


def gpu_nodes(run: Run) -> list[str]:
    return list(run.world.vm_nodes)


def node_fault(stage: Stage, run: Run, fault: str) -> tuple[str, str, set[str]]:
    nodes = gpu_nodes(run)
    if fault == "gpu":
        # A unit no claim holds: the scheduler then refuses the next pod pinned there
        # for the GPU name. Taking a held one is a node over capacity whatever the
        # controller does next.
        held: dict[str, int] = {}
        for c in stage.claims.values():
            status = c.get("status") or {}
            if status.get("nodeName") and status.get("phase") in ("Bound", "Attached", "Lost"):
                node = str(status["nodeName"])
                held[node] = held.get(node, 0) + int((c.get("spec") or {}).get("count") or 1)
        nodes = [n for n in nodes if held.get(n, 0) < run.world.gpus]
        if not nodes:
            return "", "no node with a unit no claim holds", set()
    node = stage.rng.choice(nodes)
    kube = run.kube
    if fault == "not-ready":
        kube.node_status(node, ready=False)
    elif fault == "cordon":
        kube.cordon(node)
    elif fault == "memory":
        allocatable(run, node, {"memory": "512Mi"})
    elif fault == "gpu":
        # The listing above may be a tick old: a claim bound there since holds the unit
        # taken, by the hardware's doing, not the binder's (the checker is told).
        if stage.checker is not None:
            stage.checker.capacity_lost(node)
        gpus_left(run, node, max(0, run.world.gpus - 1))
    stage.faulted.setdefault(node, set()).add(fault)
    stage.faults += 1
    return node, fault, {node}


def allocatable(run: Run, node: str, values: Mapping[str, str]) -> None:
    """What kubelet reports when the node has less: allocatable and capacity."""
    body = {"status": {"allocatable": dict(values), "capacity": dict(values)}}
    run.kube.core.patch_node_status(node, body)


def gpus_left(run: Run, node: str, gpus: int) -> None:
    """The node has ``gpus`` GPUs: kubelet's allocatable of the resource name, or, on a
    node of the DRA pool, the driver's slice with that many (a GPU gone is gone in both
    its forms)."""
    if node not in run.world.dra_nodes:
        allocatable(run, node, {run.world.resource: str(gpus)})
        return
    (body,) = dra_objects.passthrough_node(node, gpus)
    kind = keys.RESOURCE_SLICE
    patch = {"spec": {"devices": body["spec"]["devices"]}}
    run.kube.custom.patch_cluster_custom_object(
        kind.group, kind.version, kind.plural, body["metadata"]["name"], patch
    )


def node_not_ready(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    return node_fault(stage, run, "not-ready")


def node_cordon(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    return node_fault(stage, run, "cordon")


def node_memory_short(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    return node_fault(stage, run, "memory")


def node_gpu_short(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    return node_fault(stage, run, "gpu")


def node_restore(stage: Stage, run: Run) -> tuple[str, str, set[str]]:
    if not stage.faulted:
        return "", "nothing to restore", set()
    node = stage.rng.choice(sorted(stage.faulted))
    return restore(stage, run, node, op=None)


def restore(stage: Stage, run: Run, node: str, op: str | None) -> tuple[str, str, set[str]]:
    faults = stage.faulted.pop(node, set())
    if "not-ready" in faults:
        run.kube.node_status(node, ready=True)
    if "cordon" in faults:
        run.kube.cordon(node, False)
    if "memory" in faults:
        allocatable(run, node, {"memory": NODE_BASE_RESOURCES["memory"]})
    if "gpu" in faults:
        gpus_left(run, node, run.world.gpus)
        if stage.checker is not None:
            stage.checker.capacity_restored(node)
    outcome = f"back from {', '.join(sorted(faults))}"
    if op is not None:
        stage.journal.record(op, node, outcome, {node})
    return node, outcome, {node}
