"""kubelet's pod-resources API (v1) behind a typed client.

The messages and stubs are generated from ``api.proto`` by ``controller/gen_protos.py``;
only :mod:`.client` touches them, so the rest of the agent sees plain dataclasses.
"""

from cozystack_gpu.agent.podresources.client import (
    DEFAULT_SOCKET,
    DeviceSet,
    PodDevices,
    PodResourcesClient,
    PodResourcesUnavailable,
    Snapshot,
    generated,
)

__all__ = [
    "DEFAULT_SOCKET",
    "DeviceSet",
    "PodDevices",
    "PodResourcesClient",
    "PodResourcesUnavailable",
    "Snapshot",
    "generated",
]
