"""The pod-resources client against a real gRPC server serving the real proto."""

from __future__ import annotations

import pytest

from cozystack_gpu.agent.podresources import (
    DeviceSet,
    PodDevices,
    PodResourcesClient,
    PodResourcesUnavailable,
    generated,
)
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet

NVML = "GPU-8f2c1d90-3e5a-4b17-9c2e-5da9abb51763"
MDEV = "9b1c6b2a-3f0e-4c7e-9a55-0c1f5d2b7a01"


def test_the_service_path_is_kubelets() -> None:
    messages, _services = generated()
    service = messages.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert sorted(m.name for m in service.methods) == ["Get", "GetAllocatableResources", "List"]


def test_allocatable_and_pods_round_trip(kubelet: FakeKubelet) -> None:
    kubelet.set(
        allocatable={
            "nvidia.com/GH100_H100_SXM5_80GB": ["0000:18:00.0", "0000:2a:00.0"],
            "nvidia.com/GRID_T4-4Q": [MDEV],
            "nvidia.com/GA100_A100_SXM4_40GB": ["40"],
            "nvidia.com/gpu": [NVML],
            "devices.kubevirt.io/kvm": ["kvm0"],
        },
        pods=[
            ("tenant", "virt-launcher-a", {"nvidia.com/GH100_H100_SXM5_80GB": ["0000:18:00.0"]}),
            ("ml", "trainer", {"nvidia.com/gpu": [NVML]}),
            ("kube-system", "no-devices", {}),
        ],
    )
    with PodResourcesClient(kubelet.socket_path) as client:
        snapshot = client.snapshot()
    assert DeviceSet("nvidia.com/GRID_T4-4Q", (MDEV,)) in snapshot.allocatable
    assert DeviceSet("nvidia.com/GA100_A100_SXM4_40GB", ("40",)) in snapshot.allocatable
    assert len(snapshot.allocatable) == 5
    assert snapshot.pods == (
        PodDevices(
            "tenant",
            "virt-launcher-a",
            (DeviceSet("nvidia.com/GH100_H100_SXM5_80GB", ("0000:18:00.0",)),),
        ),
        PodDevices("ml", "trainer", (DeviceSet("nvidia.com/gpu", (NVML,)),)),
    )
    assert kubelet.calls == {"List": 1, "GetAllocatableResources": 1}


def test_the_client_reconnects_after_kubelet_restarts(kubelet: FakeKubelet) -> None:
    kubelet.set(allocatable={"nvidia.com/x": ["0000:18:00.0"]})
    client = PodResourcesClient(kubelet.socket_path, timeout=2.0)
    assert client.allocatable() == (DeviceSet("nvidia.com/x", ("0000:18:00.0",)),)
    kubelet.restart()
    kubelet.set(allocatable={"nvidia.com/x": ["0000:18:00.0", "0000:2a:00.0"]})
    assert client.allocatable() == (DeviceSet("nvidia.com/x", ("0000:18:00.0", "0000:2a:00.0")),)
    assert client.reconnects == 1
    client.close()


def test_a_missing_kubelet_is_an_error_the_agent_can_wait_out(kubelet: FakeKubelet) -> None:
    client = PodResourcesClient(kubelet.socket_path, timeout=1.0)
    kubelet.stop()
    with pytest.raises(PodResourcesUnavailable, match="no kubelet socket"):
        client.pods()
    kubelet.start()
    assert client.pods() == ()
    client.close()


def test_a_socket_nobody_listens_on_is_unavailable(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import socket

    path = str(tmp_path / "dead.sock")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(path)  # exists, but nobody accepts
    sock.close()
    client = PodResourcesClient(path, timeout=1.0)
    with pytest.raises(PodResourcesUnavailable, match="UNAVAILABLE"):
        client.allocatable()
    client.close()
