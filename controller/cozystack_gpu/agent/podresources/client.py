"""A client of kubelet's ``v1.PodResourcesLister`` over its unix socket.

kubelet removes and recreates the socket when it restarts, and a gRPC channel to the old
inode would wait out its reconnect backoff; so the client notices a new inode, or an
UNAVAILABLE answer, builds a fresh channel and asks once more before giving up.
"""

from __future__ import annotations

import importlib
import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import grpc

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
_GEN_HINT = "generate it with `python controller/gen_protos.py` (make setup does)"


def generated() -> tuple[ModuleType, ModuleType]:
    """The generated message and stub modules; ImportError naming the fix when missing."""
    try:
        messages = importlib.import_module("cozystack_gpu.agent.podresources.api_pb2")
        stubs = importlib.import_module("cozystack_gpu.agent.podresources.api_pb2_grpc")
    except ImportError as exc:
        raise ImportError(f"pod-resources gRPC code is missing: {exc}; {_GEN_HINT}") from exc
    return messages, stubs


@dataclass(frozen=True)
class DeviceSet:
    """Devices of one resource name, with the IDs their device plugin reported."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class PodDevices:
    """The devices one pod holds, over all its containers."""

    namespace: str
    name: str
    devices: tuple[DeviceSet, ...]


@dataclass(frozen=True)
class Snapshot:
    """What kubelet said in one round trip: allocatable devices and the pods holding some."""

    allocatable: tuple[DeviceSet, ...]
    pods: tuple[PodDevices, ...]


class PodResourcesUnavailable(RuntimeError):
    """kubelet did not answer (not running, restarting, socket not mounted)."""


def _device_sets(items: Any) -> tuple[DeviceSet, ...]:
    return tuple(
        DeviceSet(str(d.resource_name), tuple(str(i) for i in d.device_ids)) for d in items
    )


class PodResourcesClient:
    """Blocking client; safe to share between threads."""

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0) -> None:
        self.socket_path = os.path.abspath(socket_path)
        self.timeout = timeout
        self._messages, self._stubs = generated()
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._stub: Any = None
        self._inode: tuple[int, int, int] | None = None
        self._connected_once = False
        self.reconnects = 0  # fresh channels after the first (kubelet restarts, failures)

    def _socket_inode(self) -> tuple[int, int, int] | None:
        # The change time too: a recreated socket may get the inode number of the old one.
        try:
            st = os.stat(self.socket_path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _connect(self) -> Any:
        inode = self._socket_inode()
        if self._channel is not None and inode == self._inode:
            return self._stub
        if self._channel is not None or self._connected_once:
            self.reconnects += 1
        self._drop()
        if inode is None:
            raise PodResourcesUnavailable(f"no kubelet socket at {self.socket_path}")
        self._connected_once = True
        self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        self._stub = self._stubs.PodResourcesListerStub(self._channel)
        self._inode = inode
        return self._stub

    def _drop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None
        self._inode = None

    def _call(self, method: str, request: Any) -> Any:
        with self._lock:
            retries = 1  # one more try on a fresh channel: kubelet may just have restarted
            while True:
                stub = self._connect()
                try:
                    return getattr(stub, method)(request, timeout=self.timeout)
                except grpc.RpcError as exc:
                    code = exc.code() if hasattr(exc, "code") else None
                    self._drop()
                    if code == grpc.StatusCode.UNAVAILABLE and retries > 0:
                        retries -= 1
                        continue
                    raise PodResourcesUnavailable(f"kubelet {method}: {code}: {exc}") from exc

    def allocatable(self) -> tuple[DeviceSet, ...]:
        """Devices kubelet counts as allocatable (healthy), per resource name."""
        reply = self._call("GetAllocatableResources", self._messages.AllocatableResourcesRequest())
        return _device_sets(reply.devices)

    def pods(self) -> tuple[PodDevices, ...]:
        """Pods holding devices; pods without any are left out."""
        reply = self._call("List", self._messages.ListPodResourcesRequest())
        result = []
        for pod in reply.pod_resources:
            sets = [s for c in pod.containers for s in _device_sets(c.devices) if s.device_ids]
            if sets:
                result.append(PodDevices(str(pod.namespace), str(pod.name), tuple(sets)))
        return tuple(result)

    def snapshot(self) -> Snapshot:
        return Snapshot(allocatable=self.allocatable(), pods=self.pods())

    def close(self) -> None:
        with self._lock:
            self._drop()

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
