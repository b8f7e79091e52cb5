"""What the model reads and what it answers.

Inputs are frozen dataclasses a caller fills from API objects it already holds; the model
never reads the API. Times are float seconds since the Unix epoch (``datetime.timestamp()``
of an API timestamp), and the current time is always passed in, so one input gives one
answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from cozystack_gpu.keys import (
    LABEL_NODE_LAYOUT_STATE,
    LABEL_VGPU_ENTITLEMENT,
    VGPU_ENTITLEMENT_VALUE,
    LayoutState,
    Mode,
    OnCordon,
    Phase,
    tenant_ancestors,
)

# Taints Kubernetes derives from a node's own state. Ready and cordon are judged from the
# node's fields, so these never count as a taint a class must tolerate: otherwise a cordon
# would read as "no longer serving the class" and override onCordon: Stay.
NODE_STATE_TAINTS = frozenset(
    {
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
    }
)

HARD_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


class ClaimKey(NamedTuple):
    """A claim's identity: namespace and name."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Taint:
    """A Node ``spec.taints`` entry."""

    key: str
    effect: str  # NoSchedule | PreferNoSchedule | NoExecute
    value: str = ""


@dataclass(frozen=True, slots=True)
class Toleration:
    """A GPUClass ``spec.tolerations`` entry: operators Exists and Equal only.

    An empty key with Exists tolerates every taint; an empty effect matches every effect.
    ``tolerationSeconds`` does not change whether a bind may happen, so it is not carried.
    """

    key: str = ""
    operator: str = "Equal"  # Exists | Equal
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True, slots=True)
class Device:
    """One GPUNode ``status.devices`` entry: the resource name it is advertised under and how
    many device-plugin devices kubelet counts as allocatable for it.

    The agent already counts a device reported by IOMMU group once, on the group's
    lowest-addressed GPU, so the model only sums.
    """

    resource_name: str
    allocatable: int


@dataclass(frozen=True)
class NodeInfo:
    """A Node and its GPUNode, as the binder sees them.

    - ``labels``, ``taints``, ``unschedulable``: the Node's metadata and spec.
    - ``ready``: the Node's Ready condition is True.
    - ``allocatable``: the Node's ``status.allocatable`` (integers; only GPU resource names
      matter). A resource name the Node does not list has capacity 0.
    - ``devices``: the GPUNode's devices; capacity of a resource name is their allocatable
      sum capped at ``allocatable``.
    - ``raw_used``: units per resource name requested by running pods that hold no claim
      (raw-name VMs and pods); they take capacity like claims do.
    - ``inventory_stale``: the node agent has not refreshed the GPUNode for longer than the
      binder allows; nobody knows the devices' health, so nothing new is placed there, but
      its holds stay (kubelet's allocatable still caps them).
    - ``dra_units``: units per ``dra`` class key (``translate.dra_units_key``): the node's
      ResourceSlice devices the class matches that no other ResourceClaim holds (SPEC §13,
      ``objects.dra.node_units``); ``dra_shared``, the keys of classes that match a device
      another class matches here, which neither serves (as one resource name of two
      classes).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    ready: bool = True
    unschedulable: bool = False
    allocatable: Mapping[str, int] = field(default_factory=dict)
    devices: tuple[Device, ...] = ()
    raw_used: Mapping[str, int] = field(default_factory=dict)
    inventory_stale: bool = False
    dra_units: Mapping[str, int] = field(default_factory=dict)
    dra_shared: frozenset[str] = frozenset()

    @property
    def layout_pending(self) -> bool:
        """The host layer is changing this node's layout; the binder leaves it out."""
        return self.labels.get(LABEL_NODE_LAYOUT_STATE) == LayoutState.PENDING.value

    def capacity(self) -> dict[str, int]:
        """Units per resource name: device allocatable summed, capped at Node allocatable;
        and per ``dra`` class key, its units from the node's ResourceSlices."""
        summed: dict[str, int] = {}
        for device in self.devices:
            summed[device.resource_name] = summed.get(device.resource_name, 0) + max(
                device.allocatable, 0
            )
        units = {
            name: min(units, max(self.allocatable.get(name, 0), 0))
            for name, units in summed.items()
        }
        units.update((key, max(count, 0)) for key, count in self.dra_units.items())
        return units


@dataclass(frozen=True)
class ClassInfo:
    """A GPUClass spec. ``deleting`` is True once the object has a deletion timestamp: the
    class then keeps serving its Bound, Attached and Lost claims and refuses Pending ones.

    ``max_count`` is the spec value as written (None when absent); the model resolves it by
    ``keys.effective_max_count`` against the largest node serving the class.
    """

    name: str
    mode: Mode
    resource_name: str
    max_count: int | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    on_cordon: OnCordon = OnCordon.MOVE
    deleting: bool = False
    dra: bool = False  # served by DRA: its units are a key of its own, not a resource name

    def tolerates(self, taint: Taint) -> bool:
        return any(t.tolerates(taint) for t in self.tolerations)


@dataclass(frozen=True, slots=True)
class NodeRequirement:
    """One requirement of a node selector term (a PersistentVolume's ``nodeAffinity``):
    ``matchExpressions`` on labels, or ``matchFields`` on the node's name when ``on_name``."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    on_name: bool = False

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.on_name:
            # matchFields supports metadata.name with In and NotIn only.
            if self.operator == "In":
                return name in self.values
            return self.operator == "NotIn" and name not in self.values
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "In":
            return present and value in self.values
        if self.operator == "NotIn":
            return not present or value not in self.values
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        try:  # Gt / Lt compare integers
            left, right = int(str(value)), int(self.values[0])
        except (TypeError, ValueError, IndexError):
            return False
        if self.operator == "Gt":
            return present and left > right
        return self.operator == "Lt" and present and left < right


@dataclass(frozen=True, slots=True)
class VolumeAffinity:
    """A bound PersistentVolume's required node affinity: a node can use the volume when it
    matches one of ``terms`` (every requirement of that term)."""

    volume: str
    terms: tuple[tuple[NodeRequirement, ...], ...]

    def admits(self, name: str, labels: Mapping[str, str]) -> bool:
        return any(all(r.matches(name, labels) for r in term) for term in self.terms)


@dataclass(frozen=True, slots=True)
class RejectedNode:
    """A ``status.rejectedNodes`` entry. The binder drops an entry when the node's
    allocatable, taints or Ready change; the model only honours ``until``."""

    node: str
    until: float


@dataclass(frozen=True, slots=True)
class MigrationTarget:
    """A ``status.migration`` entry (SPEC §12): a live migration of the claim's VMI runs,
    and its target pod holds the claim's units on ``node`` too until it ends. ``uid`` is
    the VirtualMachineInstanceMigration's uid, ``since`` when the target was placed."""

    node: str
    uid: str
    since: float


OrderShape = tuple[str, str, int]  # class, tenant (namespace), count: ``ClaimInfo.shape``


@dataclass(frozen=True)
class ClaimInfo:
    """A GPUClaim: spec, status, and what the binder knows about its VM.

    - ``created``: creationTimestamp; with the name it fixes arrival order.
    - ``phase``, ``node``, ``attached_to``, ``bound_at``, ``rejected``: from status.
    - ``vmi_live``: the VMI named by ``attached_to`` exists and is not Succeeded or Failed
      (or its attachment is still within the attachment grace). A Lost claim with a live
      VMI still takes capacity on ``node`` and is not rebound elsewhere.
    - ``set_id``: claims of one VM share it (the binder takes it from the VM or VMI that
      names them, e.g. ``"vm/<name>"``), so they move and rebind together; None for a claim
      no VM names yet.
    - ``template``: created from a VMI's claim template. A Pending template claim is placed
      with its set by ``place_set`` when the launcher pod is gated, never by ``plan``.
    - ``window``: made by a GPUReservation at its window's start (SPEC §11), of its name
      and for its booked units: the binder binds it onto the booked node, never ``plan``,
      and packing leaves it where the window is booked.
    - ``volumes``: the node affinity of each bound PersistentVolume of the claim's VM (its
      VirtualMachine's volumes, which exist while it is stopped). A set whose volumes can be
      used from its node stays there: no move but for the node gone, no packing move (a
      VM's local disk does not follow its GPUs, so the next start could only go there).
    - ``migration``: a live migration's target placed for the claim's set (SPEC §12). While
      the claim holds its node, its units count on the target node too (``migrating_to``);
      budgets count it once; nothing moves or rebinds the set meanwhile.
    """

    namespace: str
    name: str
    class_name: str
    count: int
    created: float = 0.0
    phase: Phase = Phase.PENDING
    node: str | None = None
    attached_to: str | None = None
    vmi_live: bool = False
    bound_at: float | None = None
    rejected: tuple[RejectedNode, ...] = ()
    set_id: str | None = None
    template: bool = False
    volumes: tuple[VolumeAffinity, ...] = ()
    window: bool = False
    migration: MigrationTarget | None = None

    @property
    def key(self) -> ClaimKey:
        return ClaimKey(self.namespace, self.name)

    @property
    def shape(self) -> OrderShape | None:
        """Class, tenant and count: what a pass judges an order by, so that once one order
        is refused, the later ones of its shape wait with it unjudged. None for an order
        with rejected nodes, which is judged on its own."""
        if self.rejected:
            return None
        return (self.class_name, self.namespace, self.count)

    @property
    def ordered(self) -> bool:
        """A tenant's order, which ``plan`` places: neither a VM's template claim (placed
        with its set at the gate) nor a window's claim (bound where its window is booked)."""
        return not (self.template or self.window)

    @property
    def counts_budget(self) -> bool:
        """Bound, Attached and Lost claims count against budgets (Lost ones too, so a
        rebind never fails a budget check); a Pending one is judged when it binds."""
        return self.phase is not Phase.PENDING

    @property
    def waiting(self) -> bool:
        """Waiting for a node: an order not bound yet, or a template claim its VM's set has
        not been placed with. The one definition ``kubectl gpu top``, the pending gauge and
        the orders-waiting alert share (a Lost claim waiting to rebind has its own)."""
        return self.phase is Phase.PENDING

    @property
    def holds_node(self) -> bool:
        """Takes capacity on ``node``: Bound, Attached, or Lost while its VMI still runs."""
        if self.node is None:
            return False
        if self.phase is Phase.BOUND or self.phase is Phase.ATTACHED:
            return True
        return self.phase is Phase.LOST and self.vmi_live

    @property
    def migrating_to(self) -> str | None:
        """The node a live migration's target holds the claim's units on as well: set while
        the claim holds its node and a migration to another node is recorded."""
        target = self.migration
        if target is None or not self.holds_node or target.node == self.node:
            return None
        return target.node

    @property
    def nodes_held(self) -> frozenset[str]:
        """Every node the claim takes units on: its own, and its migration's target."""
        held = {self.node} if self.holds_node and self.node is not None else set()
        if self.migrating_to is not None:
            held.add(self.migrating_to)
        return frozenset(held)

    @property
    def set_key(self) -> tuple[str, str]:
        """Claims with one set key are placed, moved and rebound together."""
        if self.set_id is not None:
            return (self.namespace, "set:" + self.set_id)
        return (self.namespace, "claim:" + self.name)


@dataclass(frozen=True)
class NamespaceInfo:
    """A namespace's labels and its GPU-relevant quota.

    - ``labels``: the Namespace's labels; the ``tenant.cozystack.io/<ancestor>`` labels give
      its ancestors, ``gpu.cozystack.io/vgpu: "true"`` its vGPU entitlement.
    - ``quota``: ``spec.hard`` of its ResourceQuotas as integers (see ``merge_quotas``):
      budget keys ``gpu.cozystack.io/<class>`` and ``gpu.cozystack.io/total``, and raw keys
      on resource names (``requests.<name>`` or ``<name>``). Other keys are ignored.
    - ``raw_used``: units per resource name requested by this namespace's pods that hold no
      claim; they count against raw keys here and on every ancestor.
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    quota: Mapping[str, int] = field(default_factory=dict)
    raw_used: Mapping[str, int] = field(default_factory=dict)

    @property
    def ancestors(self) -> frozenset[str]:
        """Every tenant above this namespace, and the namespace itself."""
        return tenant_ancestors(dict(self.labels)) | {self.name}

    @property
    def vgpu_entitled(self) -> bool:
        return self.labels.get(LABEL_VGPU_ENTITLEMENT) == VGPU_ENTITLEMENT_VALUE


def merge_quotas(hards: list[Mapping[str, int]]) -> dict[str, int]:
    """One namespace's quota from several ResourceQuota ``spec.hard`` maps: the smallest
    limit of each key holds, as the API server enforces every quota."""
    merged: dict[str, int] = {}
    for hard in hards:
        for key, value in hard.items():
            merged[key] = min(value, merged.get(key, value))
    return merged


# --- Answers -----------------------------------------------------------------------------


class Reason(StrEnum):
    """Why an order, a set or a reservation does not fit: one machine reason per missing
    thing."""

    CLASS_MISSING = "ClassMissing"
    CLASS_DELETING = "ClassDeleting"
    MAX_COUNT_EXCEEDED = "MaxCountExceeded"
    VGPU_CLASSES_MIXED = "VGPUClassesMixed"
    VGPU_NOT_ENTITLED = "VGPUNotEntitled"
    BUDGET_EXCEEDED = "BudgetExceeded"
    RAW_KEY_UNCOVERED = "RawQuotaKeyWithoutClassKey"
    NO_NODE_SERVES = "NoNodeServesClass"
    INSUFFICIENT_CAPACITY = "InsufficientCapacity"
    # The class has the free units, scattered, and no plan of a few moves of unattached
    # holds frees one node for the order (see ``packing``).
    CAPACITY_FRAGMENTED = "CapacityFragmented"
    VMI_STILL_RUNNING = "VMIStillRunning"
    # A reservation's window (SPEC §11): it starts before now, starts later than the
    # hoster's reservations.maxLead ahead, or lasts longer than reservations.maxLength.
    WINDOW_IN_PAST = "WindowInPast"
    WINDOW_TOO_FAR_AHEAD = "WindowTooFarAhead"
    WINDOW_TOO_LONG = "WindowTooLong"


# The reasons only a reservation is refused for: an order has no window.
WINDOW_REASONS = frozenset(
    {Reason.WINDOW_IN_PAST, Reason.WINDOW_TOO_FAR_AHEAD, Reason.WINDOW_TOO_LONG}
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An order or set that does not fit: ``reason`` for machines and metrics, ``message``
    for people, naming the missing thing."""

    reason: Reason
    message: str


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an order or set fits."""

    node: str


Decision = Placement | Refusal


@dataclass(frozen=True, slots=True)
class ClassStatus:
    """GPUClass status numbers: free units over nodes serving the class, and the most free
    units on one of them."""

    free: int
    max_free_per_node: int
