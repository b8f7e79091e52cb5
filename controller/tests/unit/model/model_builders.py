"""Short builders for the example tests: a node with N GPUs of one resource, a class, a
claim, a tenant tree."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from cozystack_gpu.keys import LABEL_VGPU_ENTITLEMENT, TENANT_LABEL_PREFIX, Mode, OnCordon, Phase
from cozystack_gpu.model import (
    ClaimInfo,
    ClassInfo,
    Device,
    NamespaceInfo,
    NodeInfo,
    Plan,
    RejectedNode,
    Snapshot,
    Taint,
    Toleration,
)

H100 = "nvidia.com/GH100_H100"
L40S = "nvidia.com/AD102GL_L40S"
L40S_24C = "nvidia.com/NVIDIA_L40S-24C"
NOW = 10_000.0


def node(
    name: str,
    gpus: int = 8,
    res: str = H100,
    *,
    labels: Mapping[str, str] | None = None,
    taints: tuple[Taint, ...] = (),
    ready: bool = True,
    unschedulable: bool = False,
    allocatable: int | None = None,
    raw_used: int = 0,
    extra: Mapping[str, int] | None = None,
) -> NodeInfo:
    """A node whose GPUNode reports ``gpus`` functions of ``res`` (one unit each)."""
    devices = [Device(res, 1)] * gpus
    alloc = {res: gpus if allocatable is None else allocatable}
    for other, units in (extra or {}).items():
        devices += [Device(other, 1)] * units
        alloc[other] = units
    return NodeInfo(
        name=name,
        labels=dict(labels or {}),
        taints=taints,
        ready=ready,
        unschedulable=unschedulable,
        allocatable=alloc,
        devices=tuple(devices),
        raw_used={res: raw_used} if raw_used else {},
    )


def passthrough(
    name: str = "h100",
    res: str = H100,
    *,
    selector: Mapping[str, str] | None = None,
    tolerations: tuple[Toleration, ...] = (),
    on_cordon: OnCordon = OnCordon.MOVE,
    max_count: int | None = None,
    deleting: bool = False,
) -> ClassInfo:
    return ClassInfo(
        name,
        Mode.PASSTHROUGH,
        res,
        max_count,
        dict(selector or {}),
        tolerations,
        on_cordon,
        deleting,
    )


def vgpu(name: str = "l40s-24c", res: str = L40S_24C, *, max_count: int | None = None) -> ClassInfo:
    return ClassInfo(name, Mode.VGPU, res, max_count)


_serial = [0]


def claim(
    cls: str = "h100",
    count: int = 1,
    ns: str = "tenant-a",
    *,
    name: str | None = None,
    created: float | None = None,
    phase: Phase = Phase.PENDING,
    node: str | None = None,
    attached_to: str | None = None,
    vmi_live: bool = False,
    bound_at: float | None = None,
    rejected: tuple[RejectedNode, ...] = (),
    set_id: str | None = None,
    template: bool = False,
) -> ClaimInfo:
    _serial[0] += 1
    return ClaimInfo(
        namespace=ns,
        name=name or f"claim-{_serial[0]}",
        class_name=cls,
        count=count,
        created=float(_serial[0]) if created is None else created,
        phase=phase,
        node=node,
        attached_to=attached_to,
        vmi_live=vmi_live,
        bound_at=bound_at,
        rejected=rejected,
        set_id=set_id,
        template=template,
    )


def bound(cls: str, count: int, node_name: str, ns: str = "tenant-a", **kw: object) -> ClaimInfo:
    return claim(cls, count, ns, phase=Phase.BOUND, node=node_name, **kw)  # type: ignore[arg-type]


def tenant(
    name: str,
    *ancestors: str,
    quota: Mapping[str, int] | None = None,
    vgpu: bool = False,
    raw_used: Mapping[str, int] | None = None,
) -> NamespaceInfo:
    """A tenant namespace labelled as Cozystack labels it: every ancestor and itself."""
    labels = {TENANT_LABEL_PREFIX + a: "" for a in (*ancestors, name)}
    if vgpu:
        labels[LABEL_VGPU_ENTITLEMENT] = "true"
    return NamespaceInfo(name, labels, dict(quota or {}), dict(raw_used or {}))


def record_bind(snap: Snapshot, order: ClaimInfo, node_name: str, now: float) -> ClaimInfo:
    """Record a bind in the snapshot as the binder does when it sends the write: the order
    (Pending or Lost) becomes Bound on the node; a rebound Lost claim loses its attachment."""
    bound_claim = replace(order, phase=Phase.BOUND, node=node_name, bound_at=now)
    if order.phase is Phase.LOST:
        bound_claim = replace(bound_claim, attached_to=None, vmi_live=False)
    snap.upsert_claim(bound_claim)
    return bound_claim


def commit(snap: Snapshot, result: Plan) -> None:
    """Record a plan's claim updates, as if their watch events had arrived."""
    for updated in result.updates.values():
        snap.upsert_claim(updated)
