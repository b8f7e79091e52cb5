"""A fake kubelet: the real pod-resources gRPC service (``v1.PodResourcesLister``) on a unix
socket, answering from state a test sets. It speaks the proto the agent is compiled from, so
the agent's client, channel handling and message decoding are exercised for real.

    python -m cozystack_gpu_testkit.fake_kubelet --socket /tmp/k/kubelet.sock --sysfs-root ROOT

serves what kubevirt-gpu-device-plugin would advertise for the tree below ROOT
(:func:`plugin_devices`) until interrupted. With ``--pods-file FILE`` it also lists the pods
that JSON file names (``[{"namespace", "name", "devices": {resource: [IDs]}}]``), read again
whenever it changes: how ``make demo`` tells a kubelet in another process which pods it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures
from typing import Any

import grpc

from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import generated

# (namespace, name, phase-independent devices: resource name -> device IDs)
Pod = tuple[str, str, Mapping[str, Sequence[str]]]


def plugin_devices(inventory: sysfs.Inventory) -> dict[str, list[str]]:
    """resource name -> device IDs as kubevirt-gpu-device-plugin (v1.5+, with PR #192) reports:
    PCI addresses of vfio functions and of vGPU VFs, UUIDs of mdevs."""
    out: dict[str, list[str]] = {}
    for f in inventory.functions:
        if f.resource_name and (f.driver in sysfs.VFIO_DRIVERS or f.vgpu_type_name):
            out.setdefault(f.resource_name, []).append(f.address)
    for m in inventory.mdevs:
        if m.resource_name:
            out.setdefault(m.resource_name, []).append(m.uuid)
    return out


class FakeKubelet:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = os.path.abspath(socket_path)
        self.allocatable: dict[str, list[str]] = {}
        self.pods: list[Pod] = []
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0}
        self._server: Any = None
        self._lock = threading.Lock()

    def set(
        self,
        allocatable: Mapping[str, Iterable[str]] | None = None,
        pods: Iterable[Pod] | None = None,
    ) -> None:
        with self._lock:
            if allocatable is not None:
                self.allocatable = {k: list(v) for k, v in allocatable.items()}
            if pods is not None:
                self.pods = list(pods)

    def _servicer(self) -> Any:
        messages, stubs = generated()
        fake = self

        def container_devices(items: Mapping[str, Sequence[str]]) -> list[Any]:
            return [
                messages.ContainerDevices(resource_name=name, device_ids=list(ids))
                for name, ids in items.items()
            ]

        class Servicer(stubs.PodResourcesListerServicer):  # type: ignore[name-defined,misc]
            def List(self, request: Any, context: Any) -> Any:
                with fake._lock:
                    fake.calls["List"] += 1
                    pods = [
                        messages.PodResources(
                            namespace=ns,
                            name=name,
                            containers=[
                                messages.ContainerResources(
                                    name="compute", devices=container_devices(devices)
                                )
                            ],
                        )
                        for ns, name, devices in fake.pods
                    ]
                return messages.ListPodResourcesResponse(pod_resources=pods)

            def GetAllocatableResources(self, request: Any, context: Any) -> Any:
                with fake._lock:
                    fake.calls["GetAllocatableResources"] += 1
                    devices = container_devices(fake.allocatable)
                return messages.AllocatableResourcesResponse(devices=devices)

        return Servicer(), stubs

    def start(self) -> FakeKubelet:
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)
        servicer, stubs = self._servicer()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        stubs.add_PodResourcesListerServicer_to_server(servicer, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        if os.path.exists(self.socket_path):
            os.unlink(self.socket_path)

    def restart(self) -> None:
        """What a kubelet restart looks like to a client: the socket goes and a new one comes."""
        self.stop()
        self.start()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cozystack_gpu_testkit.fake_kubelet")
    parser.add_argument("--socket", required=True)
    parser.add_argument("--sysfs-root", required=True)
    parser.add_argument("--pods-file", help="JSON list of the pods to report, re-read on change")
    args = parser.parse_args(argv)
    kubelet = FakeKubelet(args.socket)
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(args.sysfs_root)))
    kubelet.start()
    print(f"fake kubelet on {kubelet.socket_path}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    seen: float | None = None
    while not stop.wait(0.2):
        if args.pods_file:
            seen = _reload_pods(kubelet, args.pods_file, seen)
    kubelet.stop()
    return 0


def _reload_pods(kubelet: FakeKubelet, path: str, seen: float | None) -> float | None:
    """Sets the pods of ``path`` when its modification time is not ``seen``; returns it."""
    try:
        mtime = os.stat(path).st_mtime
    except FileNotFoundError:
        return seen
    if mtime == seen:
        return seen
    with open(path, encoding="utf-8") as f:
        entries = json.load(f)
    kubelet.set(pods=[(e["namespace"], e["name"], e["devices"]) for e in entries])
    return mtime


if __name__ == "__main__":
    sys.exit(main())
