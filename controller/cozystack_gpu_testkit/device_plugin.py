"""A device plugin for the real node (``node``): kubelet's v1beta1 device-plugin API served on
a unix socket, registered with the node's kubelet, advertising named devices of one
resource. Allocation hands nothing to the container (no device files, no environment): the
point is kubelet's own accounting, which its pod-resources API then reports to the agent's
``PodResourcesClient`` as it does on a GPU host.

The API's messages are compiled at first use from ``deviceplugin_v1beta1.proto`` (taken
unchanged from ``k8s.io/kubelet``) into a temporary directory: the kit's own, never the
product's. kubelet looks for plugins only in ``DEVICE_PLUGIN_DIR``, whatever its root
directory, so this works only beside the one real node of the machine (its stop removes
what was left there).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

import grpc

PROTO = Path(__file__).with_name("deviceplugin_v1beta1.proto")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"
API_VERSION = "v1beta1"
HEALTHY = "Healthy"


@functools.cache
def generated() -> tuple[ModuleType, ModuleType]:
    """The compiled messages and stubs (grpcio-tools, a dev dependency), once per process."""
    from grpc_tools import protoc

    out = Path(tempfile.mkdtemp(prefix="cgpu-deviceplugin-"))
    include = Path(protoc.__file__).resolve().parent / "_proto"
    # A module name of its own: the product's pod-resources modules are also api_pb2.
    proto = out / "cgpu_deviceplugin_v1beta1.proto"
    proto.write_text(PROTO.read_text())
    code = protoc.main(
        [
            "protoc",
            f"-I{out}",
            f"-I{include}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(proto),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed on {PROTO} ({code})")
    # The generated stubs import the messages by their bare module name; once both are
    # imported, the files are not read again and go.
    sys.path.insert(0, str(out))
    try:
        return (
            importlib.import_module("cgpu_deviceplugin_v1beta1_pb2"),
            importlib.import_module("cgpu_deviceplugin_v1beta1_pb2_grpc"),
        )
    finally:
        sys.path.remove(str(out))
        shutil.rmtree(out, ignore_errors=True)


class DevicePlugin:
    """Serves ``devices`` of ``resource`` until ``stop``; ``start`` registers with kubelet."""

    def __init__(self, resource: str, devices: Sequence[str]) -> None:
        self.resource = resource
        self.devices = tuple(devices)
        self.socket = DEVICE_PLUGIN_DIR / f"cgpu-{uuid.uuid4().hex[:8]}.sock"
        self.allocations: list[tuple[str, ...]] = []
        self._stopped = threading.Event()
        self._server: grpc.Server | None = None

    def start(self) -> None:
        messages, stubs = generated()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        stubs.add_DevicePluginServicer_to_server(_Servicer(self, messages), self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        self._server.start()
        with grpc.insecure_channel(f"unix://{KUBELET_SOCKET}") as channel:
            stubs.RegistrationStub(channel).Register(
                messages.RegisterRequest(
                    version=API_VERSION, endpoint=self.socket.name, resource_name=self.resource
                ),
                timeout=10,
            )

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
        self.socket.unlink(missing_ok=True)


class _Servicer:
    """kubelet's calls: the device list once (then the stream stays open until stop), an
    empty allocation for each container, no preferences, nothing before start."""

    def __init__(self, plugin: DevicePlugin, messages: ModuleType) -> None:
        self._plugin = plugin
        self._messages = messages

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return self._messages.DevicePluginOptions()

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        m = self._messages
        yield m.ListAndWatchResponse(
            devices=[m.Device(ID=d, health=HEALTHY) for d in self._plugin.devices]
        )
        while context.is_active() and not self._plugin._stopped.wait(0.5):
            pass

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return self._messages.PreferredAllocationResponse()

    def Allocate(self, request: Any, context: Any) -> Any:
        m = self._messages
        responses = []
        for container in request.container_requests:
            self._plugin.allocations.append(tuple(container.devices_ids))
            responses.append(m.ContainerAllocateResponse())
        return m.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return self._messages.PreStartContainerResponse()


@contextlib.contextmanager
def serving(resource: str, devices: Sequence[str]) -> Iterator[DevicePlugin]:
    plugin = DevicePlugin(resource, devices)
    plugin.start()
    try:
        yield plugin
    finally:
        plugin.stop()
