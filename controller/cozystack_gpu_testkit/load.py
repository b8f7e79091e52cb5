"""Load for fault runs: tenants ordering GPUs, and KubeVirt starting and stopping their VMs.

``World`` builds what the load runs on: GPU nodes in two pools, a class per pool sharing one
resource name, a tenant tree with budgets tight enough that some orders wait for budget,
and one canary node and class nobody else uses, so a health check always has room.

``Load`` plays the tenants and KubeVirt (there is no virt-controller or virt-handler here):
- orders arrive at a rate, or as a burst;
- VMs start on Bound claims: the claim's attachment (as the VMI webhook records it, unless
  the real webhooks run), the VMI with the claims annotation and reference label, the
  launcher pod owned by it (gated as the pod webhook leaves it); the leader's gate pins the
  pod and the real kube-scheduler binds it; then the VMI runs there;
- VMs stop (the VMI Succeeded, then deleted with its pod) and some Bound claims are released.

Every request has a timeout, and whatever a fault interrupts is done again on the next
tick: creates that landed without an answer read as AlreadyExists when repeated. Orders
the API server accepted are remembered, so a run can check that none was lost.
"""

from __future__ import annotations

import datetime
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from cozystack_gpu import keys
from cozystack_gpu.objects.translate import rfc3339 as _rfc3339
from cozystack_gpu_testkit import dra_objects
from cozystack_gpu_testkit.objects import Kube, unless, wait_for

log = logging.getLogger(__name__)

TIMEOUT = (5.0, 20.0)
_TIMED: dict[str, Any] = {"_request_timeout": TIMEOUT}
RUN_LABEL = "load.cozystack.io/run"
# The node agents' reports are refreshed this often, well within the controller's
# --inventory-stale-after (300 s), as running agents would.
REPORT_EVERY_S = 60.0


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class World:
    """Names of what ``build_world`` made; ``tenants`` are where orders go."""

    id: str
    resource: str
    nodes: list[str]
    classes: list[str]
    parent: str
    tenants: list[str]
    canary_class: str
    canary_tenant: str
    canary_node: str
    gpus: int
    # A third pool served by a DRA driver (SPEC §13): nodes whose GPUs are devices of
    # ResourceSlices, none of the resource name, and the ``dra`` class over them (also in
    # ``classes``); empty and None when the world has none.
    dra_nodes: list[str] = field(default_factory=list)
    dra_class: str | None = None

    @property
    def template_classes(self) -> list[str]:
        """The classes a VM's claim templates may name: a ``dra`` class's claims are held
        claims only (its templates are refused, DRAClassTemplate)."""
        return [c for c in self.classes if c != self.dra_class]

    @property
    def vm_nodes(self) -> list[str]:
        """Every node a GPU VM may run on: the resource name's and the DRA driver's."""
        return [*self.nodes, *self.dra_nodes]

    @property
    def gpu_nodes(self) -> list[str]:
        """Every node with a GPUNode: the pools and the canary's."""
        return [*self.nodes, self.canary_node]

    @property
    def capacity(self) -> int:
        return len(self.nodes) * self.gpus


def build_world(
    kube: Kube, test_id: str, *, nodes: int = 6, gpus: int = 8, dra_nodes: int = 0
) -> World:
    """Two pools of GPU nodes with a passthrough class each (one resource name, disjoint
    selectors); with ``dra_nodes``, a third pool of that many nodes whose ``gpus`` GPUs
    each a DRA driver publishes (NVIDIA's VFIO form and its sibling) and a ``dra`` class
    over them; a parent tenant with a total budget below capacity and two children, one
    with a class budget of its own; a tenant without a budget; and the canary's node,
    class and tenant."""
    resource = f"nvidia.com/GPU_{test_id}"
    node_names: list[str] = []
    pools = ("a", "b")
    for i in range(nodes):
        name = f"n{i}-{test_id}"
        labels = {"test.cozystack.io/id": test_id, "test.cozystack.io/pool": pools[i % 2]}
        kube.gpu_node(name, resource, gpus, labels=labels)
        node_names.append(name)
    classes = []
    for pool in pools:
        name = f"{pool}-{test_id}"
        selector = {"test.cozystack.io/id": test_id, "test.cozystack.io/pool": pool}
        kube.gpu_class(name, resource, selector=selector, maxCount=2)
        classes.append(name)
    dra_names = [f"d{i}-{test_id}" for i in range(dra_nodes)]
    dra_class = _dra_pool(kube, test_id, dra_names, gpus) if dra_names else None
    if dra_class is not None:
        classes.append(dra_class)
    parent = f"p-{test_id}"
    kube.namespace(parent, {f"{keys.TENANT_LABEL_PREFIX}{parent}": ""})
    children = [f"{parent}-{c}" for c in ("x", "y")]
    for child in children:
        kube.namespace(
            child,
            {f"{keys.TENANT_LABEL_PREFIX}{parent}": "", f"{keys.TENANT_LABEL_PREFIX}{child}": ""},
        )
    # Budgets that bite: the parent's tree may hold half the GPUs, one child one pool's
    # class up to a quarter; a second tenant has no budget, so capacity bites too.
    kube.quota(parent, {keys.QUOTA_KEY_TOTAL: nodes * gpus // 2})
    kube.quota(children[0], {keys.quota_key(classes[0]): nodes * gpus // 4})
    free = f"q-{test_id}"
    kube.namespace(free, {f"{keys.TENANT_LABEL_PREFIX}{free}": ""})
    canary = f"canary-{test_id}"
    canary_resource = f"nvidia.com/CANARY_{test_id}"
    kube.gpu_node(canary, canary_resource, 4, labels={"test.cozystack.io/canary": test_id})
    kube.gpu_class(canary, canary_resource, selector={"test.cozystack.io/canary": test_id})
    kube.namespace(canary, {f"{keys.TENANT_LABEL_PREFIX}{canary}": ""})
    return World(
        id=test_id,
        resource=resource,
        nodes=node_names,
        classes=classes,
        parent=parent,
        tenants=[parent, *children, free],
        canary_class=canary,
        canary_tenant=canary,
        canary_node=canary,
        gpus=gpus,
        dra_nodes=dra_names,
        dra_class=dra_class,
    )


def _dra_pool(kube: Kube, test_id: str, nodes: list[str], gpus: int) -> str:
    """The DRA pool's nodes (no GPUNode: the driver's slices are their inventory), this
    world's copy of NVIDIA's VFIO DeviceClass (DeviceClasses are cluster-wide) and the
    ``dra`` class over them; returns the class's name."""
    custom = kube.custom
    device_class = {**dra_objects.VFIO_DEVICE_CLASS, "metadata": {"name": f"vfio-{test_id}"}}
    custom.create_cluster_custom_object(
        keys.DEVICE_CLASS.group, keys.DEVICE_CLASS.version, keys.DEVICE_CLASS.plural,
        device_class,
    )  # fmt: skip
    labels = {"test.cozystack.io/id": test_id, "test.cozystack.io/pool": "d"}
    for node in nodes:
        kube.node(node, labels=labels, allocatable={})
        for body in dra_objects.passthrough_node(node, gpus):
            custom.create_cluster_custom_object(
                keys.RESOURCE_SLICE.group, keys.RESOURCE_SLICE.version,
                keys.RESOURCE_SLICE.plural, body,
            )  # fmt: skip
    name = f"d-{test_id}"
    kube.gpu_class(
        name, "", selector=labels, maxCount=2,
        source={"dra": {"deviceClassName": f"vfio-{test_id}"}},
    )  # fmt: skip
    return name


class VMStage(Enum):
    NEW = "new"
    VMI = "vmi"
    POD = "pod"
    RUNNING = "running"
    STOPPING = "stopping"
    GONE = "gone"


@dataclass
class VM:
    namespace: str
    name: str
    claim: str
    units: int
    stage: VMStage = VMStage.NEW
    uid: str | None = None
    started: float = 0.0
    stopping_since: float = 0.0


@dataclass
class Counts:
    """What the load did; ``operations`` is every step whose outcome was checked."""

    orders_sent: int = 0
    orders_accepted: int = 0
    orders_refused: int = 0
    bookings_sent: int = 0
    bookings_accepted: int = 0
    bookings_cancelled: int = 0
    released: int = 0
    vms_started: int = 0
    vms_stopped: int = 0
    retries: int = 0
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def operations(self) -> int:
        return (
            self.orders_accepted
            + self.orders_refused
            + self.released
            + self.vms_started
            + self.vms_stopped
        )


@dataclass
class LoadSettings:
    order_rate: float = 4.0  # orders a second between bursts
    max_live_orders: int = 200  # no new orders while this many exist
    tick_s: float = 0.5  # VM and release steps
    vm_starts_per_tick: int = 1
    max_vms: int = 12
    vm_lifetime_s: float = 6.0
    release_per_tick: float = 0.6  # chance a Bound claim is released each tick
    webhooks: bool = False  # the real admission webhooks attach and gate (scenario 6)
    # Share of the order loop's turns that book a short window instead (SPEC §11): it opens
    # 1 to 2 minutes ahead and lasts 1 to 2, so windows open and end under the faults.
    booking_share: float = 0.05


class Load:
    """Runs orders and VM churn in two threads until ``stop``."""

    def __init__(
        self, api: client.ApiClient, world: World, settings: LoadSettings | None = None
    ) -> None:
        self.world = world
        self.settings = settings or LoadSettings()
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.counts = Counts()
        self.accepted: dict[tuple[str, str], float] = {}  # orders the server took, when
        self.released_names: set[tuple[str, str]] = set()
        self.booked: list[tuple[str, str]] = []  # reservations accepted, not cancelled
        self.refusal_messages: list[str] = []
        self.vms: dict[tuple[str, str], VM] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}  # last listing
        self._seq = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._paused = threading.Event()
        self._rng = random.Random(world.id)
        self._threads = [
            threading.Thread(target=self._guard(self._order_loop), name="load-orders", daemon=True),
            threading.Thread(target=self._guard(self._churn_loop), name="load-churn", daemon=True),
        ]
        self.failure: str | None = None

    # --- control -----------------------------------------------------------------------

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)

    def pause(self) -> None:
        """No new orders, VM starts or releases; running VMs still stop and go."""
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def _guard(self, loop: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                loop()
            except Exception as exc:  # a bug in the load: the run reports it
                log.exception("load thread failed")
                self.failure = f"{type(exc).__name__}: {exc}"

        return run

    # --- orders ------------------------------------------------------------------------

    def burst(self, orders: int, threads: int = 4) -> None:
        """``orders`` orders as fast as ``threads`` creators send them (returns when sent)."""
        names = [self._next_order() for _order in range(orders)]
        chunks = [names[i::threads] for i in range(threads)]
        workers = [
            threading.Thread(target=lambda c=chunk: [self.order(*o) for o in c], daemon=True)
            for chunk in chunks
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    def _next_order(self) -> tuple[str, str, str, int]:
        with self._lock:
            self._seq += 1
            seq = self._seq
        tenant = self._rng.choice(self.world.tenants)
        gpu_class = self._rng.choice(self.world.classes)
        count = 2 if self._rng.random() < 0.2 else 1
        return tenant, f"o{seq:05d}", gpu_class, count

    def order(self, namespace: str, name: str, gpu_class: str, count: int = 1) -> bool:
        """One order, sent until the server answers it; True when it was accepted."""
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_CLAIM,
            "metadata": {"name": name, "labels": {RUN_LABEL: self.world.id}},
            "spec": {"class": gpu_class, "count": count},
        }
        self.counts.orders_sent += 1
        retried = False
        while not self._stop.is_set():
            try:
                self._claims(self.custom.create_namespaced_custom_object, namespace, body)
            except ApiException as exc:
                if exc.status == 409 and retried:
                    break  # an earlier try landed without an answer
                if exc.status in (400, 403, 422) or (exc.status == 409 and not retried):
                    self._refused(exc)
                    return False
                self._retry()
                retried = True
                continue
            except Exception:  # connection refused or reset: the server is away
                self._retry()
                retried = True
                continue
            break
        else:
            return False
        with self._lock:
            self.accepted[(namespace, name)] = time.time()
            self.counts.orders_accepted += 1
        return True

    def _refused(self, exc: ApiException) -> None:
        try:
            message = str(json.loads(exc.body).get("message", ""))
        except (TypeError, ValueError):
            message = str(exc.body)
        with self._lock:
            self.counts.orders_refused += 1
            reason = message.split(":", 1)[0][:60] if message else f"HTTP {exc.status}"
            self.counts.refusals[reason] = self.counts.refusals.get(reason, 0) + 1
            self.refusal_messages.append(message)

    def _retry(self) -> None:
        self.counts.retries += 1
        self._stop.wait(0.2)

    def live_orders(self) -> int:
        """Orders accepted and not released."""
        return len(self.accepted) - len(self.released_names)

    def _order_loop(self) -> None:
        rate = self.settings.order_rate
        while not self._stop.wait(1.0 / rate if rate > 0 else 1.0):
            if rate <= 0 or self._paused.is_set():
                continue
            if self.live_orders() >= self.settings.max_live_orders:
                continue
            draw = self._rng.random()
            if draw < self.settings.booking_share:
                self.book()
                continue
            if draw < self.settings.booking_share * 1.3 and self.booked:
                self.cancel_booking()
                continue
            self.order(*self._next_order())

    def book(self) -> bool:
        """One window a minute or two ahead, a minute or two long, sent until the server
        answers it; True when it was accepted. Its claim is made at its start and deleted
        at its end by the controller; no VM of the load uses it."""
        tenant, name, gpu_class, count = self._next_order()
        first = (int(time.time()) // 60 + 1) * 60
        start = first + self._rng.randrange(1, 3) * 60
        end = start + self._rng.randrange(1, 3) * 60
        body = {
            "apiVersion": keys.API_VERSION,
            "kind": keys.KIND_RESERVATION,
            "metadata": {"name": f"w{name}", "labels": {RUN_LABEL: self.world.id}},
            "spec": {"class": gpu_class, "count": count, "start": _rfc3339(start),
                     "end": _rfc3339(end)},
        }  # fmt: skip
        self.counts.bookings_sent += 1
        while not self._stop.is_set():
            try:
                self.custom.create_namespaced_custom_object(
                    keys.GROUP, keys.VERSION, tenant, keys.PLURAL_RESERVATIONS, body,
                    _request_timeout=TIMEOUT,
                )  # fmt: skip
            except ApiException as exc:
                if exc.status in (400, 403, 409, 422):
                    return False  # refused, or an earlier try landed without an answer
                self._retry()
                continue
            except Exception:  # connection refused or reset: the server is away
                self._retry()
                continue
            with self._lock:
                self.counts.bookings_accepted += 1
                self.booked.append((tenant, f"w{name}"))
            return True
        return False

    def cancel_booking(self) -> None:
        """A tenant cancels one of its windows, before or during it: its units (and its
        claim, by the garbage collector) go at once. One the server does not answer is
        let be: the settled look judges what is left."""
        with self._lock:
            namespace, name = self.booked.pop(self._rng.randrange(len(self.booked)))
        try:
            self.custom.delete_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, name,
                _request_timeout=TIMEOUT,
            )  # fmt: skip
        except Exception:  # gone already, or the server is away
            self.counts.retries += 1
            return
        with self._lock:
            self.counts.bookings_cancelled += 1

    # --- VMs and releases --------------------------------------------------------------

    def _churn_loop(self) -> None:
        reported = time.monotonic()
        while not self._stop.wait(self.settings.tick_s):
            if time.monotonic() - reported >= REPORT_EVERY_S:
                try:
                    self._report_inventory()
                    reported = time.monotonic()
                except Exception:  # the server is away: on the next tick
                    self.counts.retries += 1
            try:
                self._list_claims()
            except Exception:  # the server is away: try on the next tick
                self.counts.retries += 1
                continue
            for vm in list(self.vms.values()):
                try:
                    self._advance(vm)
                except Exception as exc:  # a fault interrupted the step: again next tick
                    log.debug("VM %s/%s step %s: %s", vm.namespace, vm.name, vm.stage, exc)
                    self.counts.retries += 1
            if self._paused.is_set():
                continue
            try:
                self._start_vms()
                self._release()
            except Exception as exc:
                log.debug("load step: %s", exc)
                self.counts.retries += 1

    def _report_inventory(self) -> None:
        """What each node agent does on its refresh: the report's time moves on."""
        for node in self.world.gpu_nodes:
            self.custom.patch_cluster_custom_object_status(
                keys.GROUP,
                keys.VERSION,
                keys.PLURAL_NODES,
                node,
                {"status": {"updatedAt": _now()}},
                **_TIMED,
            )

    def _list_claims(self) -> None:
        listing = self.custom.list_cluster_custom_object(
            keys.GROUP,
            keys.VERSION,
            keys.PLURAL_CLAIMS,
            label_selector=f"{RUN_LABEL}={self.world.id}",
            _request_timeout=TIMEOUT,
        )
        self.claims = {
            (c["metadata"]["namespace"], c["metadata"]["name"]): c for c in listing["items"]
        }

    def _free_bound(self) -> list[tuple[str, str]]:
        """Bound claims no VM holds."""
        live = (vm for vm in self.vms.values() if vm.stage is not VMStage.GONE)
        held = {(vm.namespace, vm.claim) for vm in live}
        return sorted(
            key
            for key, claim in self.claims.items()
            if (claim.get("status") or {}).get("phase") == "Bound"
            and not (claim.get("status") or {}).get("attachedTo")
            and key not in held
            and key not in self.released_names
        )

    def _start_vms(self) -> None:
        live = [vm for vm in self.vms.values() if vm.stage is not VMStage.GONE]
        room = self.settings.max_vms - len(live)
        candidates = self._free_bound()
        self._rng.shuffle(candidates)
        for namespace, claim in candidates[: max(0, min(room, self.settings.vm_starts_per_tick))]:
            with self._lock:
                self._seq += 1
                name = f"vm{self._seq:05d}"
            units = int(self.claims[(namespace, claim)]["spec"]["count"])
            self.vms[(namespace, name)] = VM(namespace, name, claim, units)

    def _release(self) -> None:
        if self._rng.random() >= self.settings.release_per_tick:
            return
        candidates = self._free_bound()
        if not candidates:
            return
        namespace, name = self._rng.choice(candidates)
        # Released before the delete is sent: a delete that lands while its answer is lost
        # (the API server killed mid-request) is a release, not an order lost.
        with self._lock:
            self.released_names.add((namespace, name))
            self.counts.released += 1
        unless(
            404, lambda: self._claims(self.custom.delete_namespaced_custom_object, namespace, name)
        )

    def _advance(self, vm: VM) -> None:
        steps: dict[VMStage, Callable[[VM], None]] = {
            VMStage.NEW: self._create_vmi,
            VMStage.VMI: self._create_pod,
            VMStage.POD: self._run_when_scheduled,
            VMStage.RUNNING: self._stop_when_due,
            VMStage.STOPPING: self._remove_when_detached,
        }
        step = steps.get(vm.stage)
        if step is not None:
            step(vm)

    def _create_vmi(self, vm: VM) -> None:
        labels = {keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE, RUN_LABEL: self.world.id}
        devices: dict[str, Any] = {}
        if not self.settings.webhooks:  # the webhook adds one gpus entry per unit
            devices["gpus"] = [
                {"name": f"{keys.VMI_GPU_NAME_PREFIX}{i}", "deviceName": self.world.resource}
                for i in range(vm.units)
            ]
        body = {
            "apiVersion": keys.VMI.api_version,
            "kind": keys.VMI.kind,
            "metadata": {
                "name": vm.name,
                "labels": labels,
                "annotations": {keys.ANNOTATION_CLAIMS: json.dumps({"claims": [vm.claim]})},
            },
            "spec": {"domain": {"devices": devices, "memory": {"guest": "1Gi"}}},
        }
        created = unless(
            409, lambda: self._vmis(self.custom.create_namespaced_custom_object, vm.namespace, body)
        ) or self._vmis(self.custom.get_namespaced_custom_object, vm.namespace, vm.name)
        vm.uid = str(created["metadata"]["uid"])
        vm.stage = VMStage.VMI

    def _create_pod(self, vm: VM) -> None:
        """The launcher pod virt-controller renders: owned by the VMI, its labels, the GPU
        requests of its gpus entries; gated as the pod webhook leaves it."""
        requests = {self.world.resource: str(vm.units)}
        body = {
            "metadata": {
                "name": f"virt-launcher-{vm.name}",
                "labels": {
                    "kubevirt.io": "virt-launcher",
                    keys.LABEL_CLAIMS_REF: keys.LABEL_CLAIMS_REF_VALUE,
                },
                "ownerReferences": [self._owner(vm)],
            },
            "spec": {
                "containers": [
                    {
                        "name": "compute",
                        "image": "virt-launcher",
                        "resources": {"requests": requests, "limits": requests},
                    }
                ],
                "schedulingGates": []
                if self.settings.webhooks
                else [{"name": keys.SCHEDULING_GATE_CLAIMS}],
            },
        }
        unless(409, lambda: self.core.create_namespaced_pod(vm.namespace, body, **_TIMED))
        vm.stage = VMStage.POD

    @staticmethod
    def _owner(vm: VM) -> dict[str, Any]:
        """The VMI as the controlling owner of its launcher pod."""
        owner = {"apiVersion": keys.VMI.api_version, "kind": keys.VMI.kind, "name": vm.name}
        return {**owner, "uid": vm.uid, "controller": True, "blockOwnerDeletion": True}

    def _run_when_scheduled(self, vm: VM) -> None:
        """virt-handler: once the scheduler bound the pod, the VMI runs on that node."""
        pod = self.core.read_namespaced_pod(
            f"virt-launcher-{vm.name}", vm.namespace, _request_timeout=TIMEOUT
        )
        node = pod.spec.node_name
        if not node:
            return
        self._vmi_status(vm, {"phase": "Running", "nodeName": node})
        vm.stage, vm.started = VMStage.RUNNING, time.monotonic()
        self.counts.vms_started += 1

    def _stop_when_due(self, vm: VM) -> None:
        if time.monotonic() - vm.started < self.settings.vm_lifetime_s:
            return
        self._vmi_status(vm, {"phase": "Succeeded"})
        vm.stage, vm.stopping_since = VMStage.STOPPING, time.monotonic()

    def _remove_when_detached(self, vm: VM) -> None:
        """Once the binder took the claim back to Bound (or after a while: deleting the VMI
        detaches it too), the pod and the VMI go."""
        claim = self.claims.get((vm.namespace, vm.claim))
        attached = claim is not None and (claim.get("status") or {}).get("attachedTo") == vm.name
        if attached and time.monotonic() - vm.stopping_since < 10.0:
            return
        pod = f"virt-launcher-{vm.name}"
        # No kubelet here: a pod bound to a node is only gone when deleted at once.
        unless(
            404,
            lambda: self.core.delete_namespaced_pod(
                pod, vm.namespace, grace_period_seconds=0, **_TIMED
            ),
        )
        unless(
            404,
            lambda: self._vmis(self.custom.delete_namespaced_custom_object, vm.namespace, vm.name),
        )
        vm.stage = VMStage.GONE
        self.counts.vms_stopped += 1

    def _vmi_status(self, vm: VM, status: dict[str, Any]) -> None:
        """KubeVirt's VMI CRD has no status subresource: status goes with the object."""
        patch = self.custom.patch_namespaced_custom_object
        self._vmis(patch, vm.namespace, vm.name, {"status": status})

    @staticmethod
    def _vmis(call: Callable[..., Any], namespace: str, *args: Any) -> Any:
        """One CustomObjectsApi call on the VMIs of ``namespace``."""
        return call(keys.VMI.group, keys.VMI.version, namespace, keys.VMI.plural, *args, **_TIMED)

    @staticmethod
    def _claims(call: Callable[..., Any], namespace: str, *args: Any) -> Any:
        """One CustomObjectsApi call on the GPUClaims of ``namespace``."""
        return call(keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, *args, **_TIMED)

    # --- after the run -----------------------------------------------------------------

    def lost_orders(self) -> list[str]:
        """Accepted orders that are gone although nobody released them."""
        self._list_claims()
        return sorted(
            f"{ns}/{name}"
            for ns, name in self.accepted
            if (ns, name) not in self.claims and (ns, name) not in self.released_names
        )

    def decided(self) -> int:
        """Accepted orders the binder decided: released after it bound them, or now Bound,
        Attached, or Pending with a reason."""
        count = 0
        for key in self.accepted:
            claim = self.claims.get(key)
            if claim is None:
                count += key in self.released_names
                continue
            status = claim.get("status") or {}
            if status.get("phase") in ("Bound", "Attached") or any(
                c.get("type") == keys.CONDITION_BOUND and c.get("reason")
                for c in status.get("conditions") or []
            ):
                count += 1
        return count

    def wait_running(self, vms: int, timeout: float) -> None:
        wait_for(lambda: self.counts.vms_started >= vms, timeout, f"{vms} VMs started")
