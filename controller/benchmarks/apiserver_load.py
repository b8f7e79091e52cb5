"""What the benchmarks against a real local API server share: a fresh control plane with the
GPU nodes they bind on, the load generator (creates from client threads, at the client's
top speed), a watch that times when each object is seen bound, and CPU time from /proc.

Claims and pods are created and watched alike (no client-side models: bodies go out as
dicts and answers are not deserialized), so the client costs the same for both. The same
capacity can also be published for Dynamic Resource Allocation (resource.k8s.io/v1): one
DeviceClass and, per node, a pool of ResourceSlices with one device per unit, and served by
a GPUClass of the dra source naming that DeviceClass.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, watch

from cozystack_gpu import keys
from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.objects import Kube, install_extra_crds, pod_body

RESOURCE = "nvidia.com/NVIDIA_L40S-6C"
POOL = {"bench.cozystack.io/pool": "l40s"}
GPU_CLASS = "l40s-6c"
DRA_CLASS = "bench-dra"  # a passthrough class of the dra source (``Bench.dra_class``)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# DRA: the driver the bench's ResourceSlices name and the DeviceClass selecting it.
DRA_DRIVER = "gpu.bench.cozystack.io"
DEVICE_CLASS = "bench-gpu"
DRA_VERSION = "resource.k8s.io/v1"
SLICE_MAX_DEVICES = 128  # resource.k8s.io/v1 refuses a ResourceSlice with more
# A CEL selector no bench device passes (every index is >= 0): a claim that fits no node.
NO_DEVICE = f'device.attributes["{DRA_DRIVER}"].index < 0'


def node_name(i: int) -> str:
    return f"gpu-{i:04d}"


def answered(response: Any) -> None:
    """Read an answer nobody needs, which gives its connection back to the pool. Left unread
    (``_preload_content=False``), the connection was dropped and the next create opened
    another: a TLS handshake per create, 0.5 ms or more of kube-apiserver CPU each, in every
    peer's figures alike."""
    response.data  # noqa: B018  # reading it is the point


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wait_until(predicate: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark phase did not finish")
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time a process has used, from /proc/<pid>/stat."""
    # The command name (field 2) may hold spaces; the fields after its ")" are fixed.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass
class Bench:
    """A fresh control plane with ``nodes`` GPU nodes of ``units`` each, one vGPU class
    serving them, a controller namespace and a tenant entitled to vGPU."""

    plane: Any
    kube: Kube
    controller_ns: str
    tenant: str
    gpu_class: str

    @classmethod
    def start(
        cls, nodes: int, units: int, bin_dir: Path, max_count: int = 8, profiling: bool = False
    ) -> Bench:
        """``profiling``: kube-apiserver serves /debug/pprof (``cpu_profile``)."""
        plane = cluster.start(
            bin_dir=bin_dir, extra_apiserver_args=("--profiling=true",) if profiling else ()
        )
        try:
            api = plane.api_client()
            cluster.install_crds(api)
            install_extra_crds(api)
            kube = Kube(api)
            test_id = uuid.uuid4().hex[:6]
            controller_ns, tenant = f"ctl-{test_id}", f"tenant-{test_id}"
            kube.namespace(controller_ns)
            kube.namespace(
                tenant, {f"tenant.cozystack.io/{tenant}": "", keys.LABEL_VGPU_ENTITLEMENT: "true"}
            )
            with ThreadPoolExecutor(8) as pool:
                list(
                    pool.map(
                        lambda i: kube.gpu_node(node_name(i), RESOURCE, units, labels=POOL),
                        range(nodes),
                    )
                )
            kube.gpu_class(
                GPU_CLASS, RESOURCE, mode="vgpu", profile="L40S-6C", selector=POOL,
                maxCount=max_count,
            )  # fmt: skip
        except BaseException:
            plane.stop()
            raise
        return cls(plane, kube, controller_ns, tenant, GPU_CLASS)

    def stop(self) -> None:
        self.plane.stop()

    def cpu_profile(self, seconds: int, into: Path) -> None:
        """kube-apiserver's CPU profile over the next ``seconds`` (pprof's format, read with
        ``go tool pprof -top``), written to ``into``; the plane must have been started with
        ``profiling``."""
        with urllib.request.urlopen(
            f"{self.plane.server}/debug/pprof/profile?seconds={seconds}",
            context=self.plane.ssl_context(),
            timeout=seconds + 30,
        ) as answer:
            into.write_bytes(answer.read())

    def pid(self, component: str) -> int:
        return int(self.plane.pids[component])

    def claim_creator(self, count: int = 1, gpu_class: str | None = None) -> Callable[[str], None]:
        custom = self.kube.custom
        namespace, klass = self.tenant, gpu_class or self.gpu_class

        def create(name: str) -> None:
            body = {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_CLAIM,
                "metadata": {"name": name},
                "spec": {"class": klass, "count": count},
            }
            answered(custom.create_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_CLAIMS, body,
                _preload_content=False,
            ))  # fmt: skip

        return create

    def reservation_creator(
        self, windows: Callable[[str], tuple[str, str, int]]
    ) -> Callable[[str], None]:
        """Creates a GPUReservation of the bench's class; ``windows(name)`` gives its start,
        end (RFC 3339) and count."""
        custom = self.kube.custom
        namespace, klass = self.tenant, self.gpu_class

        def create(name: str) -> None:
            start, end, count = windows(name)
            body = {
                "apiVersion": keys.API_VERSION,
                "kind": keys.KIND_RESERVATION,
                "metadata": {"name": name},
                "spec": {"class": klass, "count": count, "start": start, "end": end},
            }
            answered(custom.create_namespaced_custom_object(
                keys.GROUP, keys.VERSION, namespace, keys.PLURAL_RESERVATIONS, body,
                _preload_content=False,
            ))  # fmt: skip

        return create

    def pod_creator(self, units: int = 1) -> Callable[[str], None]:
        core = self.kube.core
        namespace = self.tenant

        def create(name: str) -> None:
            body = pod_body(name, requests={RESOURCE: units})
            answered(core.create_namespaced_pod(namespace, body, _preload_content=False))

        return create

    def publish_devices(self, nodes: int, units: int) -> None:
        """The nodes' capacity as DRA sees it: a DeviceClass selecting the bench's driver and,
        for each node, a pool named after it of ``units`` devices in ResourceSlices."""
        resource = client.ResourceV1Api(self.kube.api)
        selector = {"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}
        device_class = {
            "apiVersion": DRA_VERSION,
            "kind": "DeviceClass",
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [selector]},
        }
        answered(resource.create_device_class(device_class, _preload_content=False))
        slices = [body for i in range(nodes) for body in _slices(node_name(i), units)]
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda body: answered(
                        resource.create_resource_slice(body, _preload_content=False)
                    ),
                    slices,
                )
            )

    def dra_creator(self, selector: str | None = None) -> Callable[[str], None]:
        """Creates a ResourceClaim for one device of the bench's DeviceClass (narrowed by the
        CEL ``selector`` when given), then a Pod using it, both named ``name``."""
        resource, core = client.ResourceV1Api(self.kube.api), self.kube.core
        namespace = self.tenant
        exactly: dict[str, Any] = {
            "deviceClassName": DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": 1,
        }
        if selector:
            exactly["selectors"] = [{"cel": {"expression": selector}}]

        def create(name: str) -> None:
            claim = {
                "apiVersion": DRA_VERSION,
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
            }
            answered(
                resource.create_namespaced_resource_claim(namespace, claim, _preload_content=False)
            )
            answered(core.create_namespaced_pod(namespace, dra_pod(name), _preload_content=False))

        return create

    def dra_class(self, max_count: int) -> str:
        """A passthrough GPUClass of the dra source: the bench's DeviceClass on the vGPU
        class's nodes (``POOL``), up to ``max_count`` units a claim; its name. Passthrough
        needs no entitlement of the tenant. Call ``publish_devices`` for its devices."""
        self.kube.gpu_class(
            DRA_CLASS, RESOURCE, selector=POOL, maxCount=max_count,
            source={"dra": {"deviceClassName": DEVICE_CLASS}},
        )  # fmt: skip
        return DRA_CLASS

    def pinned_pod_creator(self, nodes: dict[str, str]) -> Callable[[str], None]:
        """Creates a Pod using the ResourceClaim of its name, pinned to ``nodes[name]`` by a
        required node affinity on ``metadata.name`` (as the product pins a claim's VM to the
        claim's node)."""
        core, namespace = self.kube.core, self.tenant

        def create(name: str) -> None:
            pod = dra_pod(name, pinned_to=nodes[name])
            answered(core.create_namespaced_pod(namespace, pod, _preload_content=False))

        return create

    def resource_claim_names(self, prefix: str) -> set[str]:
        """The names of the tenant's ResourceClaims named ``prefix``..."""
        answer = client.ResourceV1Api(self.kube.api).list_namespaced_resource_claim(
            self.tenant, _preload_content=False
        )
        names = (claim["metadata"]["name"] for claim in json.loads(answer.data)["items"])
        return {name for name in names if name.startswith(prefix)}

    def allocated_devices(self, prefix: str) -> dict[str, list[tuple[str, str]]]:
        """The (pool, device) pairs allocated to each ResourceClaim named ``prefix``... that is
        allocated and reserved for a pod."""
        answer = client.ResourceV1Api(self.kube.api).list_namespaced_resource_claim(
            self.tenant, _preload_content=False
        )
        allocated: dict[str, list[tuple[str, str]]] = {}
        for claim in json.loads(answer.data)["items"]:
            name, status = claim["metadata"]["name"], claim.get("status") or {}
            if not name.startswith(prefix) or not status.get("reservedFor"):
                continue
            results = ((status.get("allocation") or {}).get("devices") or {}).get("results")
            allocated[name] = [(r["pool"], r["device"]) for r in results or ()]
        return allocated


def dra_pod(name: str, pinned_to: str | None = None) -> dict[str, Any]:
    """A Pod using the ResourceClaim named ``name`` (no extended resource requested),
    optionally pinned to one node."""
    pod = pod_body(name, pinned_to=pinned_to)
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    return pod


def _slices(node: str, units: int) -> list[dict[str, Any]]:
    """One node's pool: ``units`` devices, split into slices the API accepts."""
    starts = range(0, units, SLICE_MAX_DEVICES)
    return [
        {
            "apiVersion": DRA_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{k}"},
            "spec": {
                "driver": DRA_DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": len(starts)},
                "devices": [
                    {"name": f"gpu-{j}", "attributes": {"index": {"int": j}}}
                    for j in range(start, min(start + SLICE_MAX_DEVICES, units))
                ],
            },
        }
        for k, start in enumerate(starts)
    ]


def create_many(
    create: Callable[[str], None], names: Iterable[str], threads: int = 8
) -> dict[str, float]:
    """Create every name from ``threads`` client threads; when each create returned."""
    created: dict[str, float] = {}

    def one(name: str) -> None:
        create(name)
        created[name] = time.perf_counter()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, names))
    return created


class BoundWatcher:
    """Records when each claim (``Bound`` with a node) or pod (``spec.nodeName`` set) of a
    namespace is first seen bound, or bound to another node, by a watch as any client
    would see it. Resumes from the last resourceVersion when the server ends the watch."""

    def __init__(self, api: Any, namespace: str, kind: str = "claims") -> None:
        self.bound_at: dict[str, float] = {}
        self.nodes: dict[str, str] = {}
        self.seen = 0  # events read, the first listing's included
        self._stop = False
        if kind in ("claims", "reservations"):
            custom = client.CustomObjectsApi(api)
            plural = keys.PLURAL_CLAIMS if kind == "claims" else keys.PLURAL_RESERVATIONS
            self._list: Callable[..., Any] = custom.list_namespaced_custom_object
            self._args: tuple[str, ...] = (keys.GROUP, keys.VERSION, namespace, plural)
            self._node_of: Callable[[dict[str, Any]], str | None] = (
                _claim_node if kind == "claims" else _booked_node
            )
        else:
            self._list = client.CoreV1Api(api).list_namespaced_pod
            self._args = (namespace,)
            self._node_of = _pod_node
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop:
                raise  # a broken watch while measuring is a failed benchmark

    def _watch(self) -> None:
        version: str | None = None
        while not self._stop:
            kwargs: dict[str, Any] = {"timeout_seconds": 60, "deserialize": False}
            if version:
                kwargs["resource_version"] = version
            for event in watch.Watch().stream(self._list, *self._args, **kwargs):
                self.seen += 1
                obj = event["object"]
                version = obj["metadata"].get("resourceVersion") or version
                name = obj["metadata"]["name"]
                node = self._node_of(obj)
                if node and self.nodes.get(name) != node:
                    self.bound_at[name] = time.perf_counter()
                    self.nodes[name] = node
                if self._stop:
                    return

    def count(self, prefix: str = "") -> int:
        # tuple() copies the keys in one step the watch thread cannot interleave with.
        return sum(1 for name in tuple(self.bound_at) if name.startswith(prefix))

    def stop(self) -> None:
        self._stop = True


def _claim_node(obj: dict[str, Any]) -> str | None:
    status = obj.get("status") or {}
    node = status.get("nodeName")
    return str(node) if status.get("phase") == "Bound" and node else None


def _booked_node(obj: dict[str, Any]) -> str | None:
    status = obj.get("status") or {}
    node = status.get("nodeName")
    return str(node) if status.get("phase") == "Booked" and node else None


def _pod_node(obj: dict[str, Any]) -> str | None:
    node = (obj.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def print_table(columns: dict[str, dict[str, float]], short: dict[str, str]) -> None:
    """Each peer's figures in a column (the first peer's figures name the first rows, then
    any other peer's own), then each later peer's divided by the first's; a figure a peer
    lacks prints as nan."""
    names = list(columns)
    base, others = names[0], names[1:]
    widths = [max(10, len(name)) for name in names]
    ratios = [f"{short[name]}/{short[base]}" for name in others]
    head = [f"{name:>{w}}" for name, w in zip(names, widths, strict=True)]
    print(f"  {'':38} " + " ".join(head + [f"{r:>13}" for r in ratios]))
    figures = dict.fromkeys(figure for name in names for figure in columns[name])
    for figure in figures:
        row = [columns[name].get(figure, float("nan")) for name in names]
        value = row[0]
        cells = [f"{v:{w}.2f}" for v, w in zip(row, widths, strict=True)]
        cells += [f"{v / value if value else float('nan'):13.2f}" for v in row[1:]]
        print(f"  {figure:38} " + " ".join(cells))
