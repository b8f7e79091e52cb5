"""The agent loop: writes on change and on its period, waits out kubelet, serves health and
metrics. The API side is a recording writer here; tests/integration/test_agent.py runs the
same loop against the real kube-apiserver."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cozystack_gpu.agent import sysfs
from cozystack_gpu.agent.podresources import PodResourcesClient
from cozystack_gpu.agent.runner import Agent, serve
from cozystack_gpu.metrics_access import Decision
from cozystack_gpu.metrics_server import MetricsServer, self_signed
from cozystack_gpu_testkit import sysfs_scenarios
from cozystack_gpu_testkit.fake_kubelet import FakeKubelet, plugin_devices


class RecordingWriter:
    node_name = "gpu-1"

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_status(self, fields: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(fields)
        return {"status": fields}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_agent(root: Path, kubelet: FakeKubelet, clock: Clock) -> tuple[Agent, RecordingWriter]:
    writer = RecordingWriter()
    agent = Agent(
        sysfs_root=str(root),
        kubelet=PodResourcesClient(kubelet.socket_path, timeout=1.0),
        writer=writer,
        period=60,
        poll=1,
        version="1.2.3",
        clock=clock,
    )
    return agent, writer


def test_writes_on_change_and_on_its_period_only(tmp_path: Path, kubelet: FakeKubelet) -> None:
    tree = sysfs_scenarios.t4_mdev(tmp_path / "root")
    kubelet.set(allocatable=plugin_devices(sysfs.read_inventory(str(tree.root))))
    clock = Clock()
    agent, writer = make_agent(tree.root, kubelet, clock)

    first = agent.tick()
    assert (first.written, first.reason) == (True, "changed")
    assert set(writer.patches[0]) == {
        "devices",
        "resourceNames",
        "otherResourceNames",
        "updatedAt",
        "agentVersion",
    }
    assert writer.patches[0]["agentVersion"] == "1.2.3"
    assert writer.patches[0]["resourceNames"] == ["nvidia.com/GRID_T4-4Q"]

    clock.now += 5
    assert agent.tick().reason == "unchanged"
    assert len(writer.patches) == 1

    tree.create_mdev("0000:af:00.0", "nvidia-230", "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")
    clock.now += 1
    changed = agent.tick()
    assert (changed.written, changed.reason) == (True, "changed")
    idle = {d["pciAddress"]: d for d in writer.patches[-1]["devices"]}["0000:af:00.0"]
    assert idle["mdev"]["devices"][0]["uuid"] == "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
    assert idle["allocatable"] == 0  # kubelet has not seen it yet

    clock.now += 60
    assert agent.tick().reason == "period"
    assert len(writer.patches) == 3
    assert agent.ready() and agent.healthy()


def test_nothing_is_written_while_kubelet_is_away(tmp_path: Path, kubelet: FakeKubelet) -> None:
    tree = sysfs_scenarios.h100_x8(tmp_path / "root")
    clock = Clock()
    agent, writer = make_agent(tree.root, kubelet, clock)
    kubelet.stop()
    result = agent.tick(force=True)
    assert (result.written, result.reason) == (False, "kubelet unavailable")
    assert writer.patches == []
    assert not agent.ready()
    kubelet.start()
    assert agent.tick().written


def test_health_and_metrics_are_served(tmp_path: Path, kubelet: FakeKubelet) -> None:
    tree = sysfs_scenarios.mixed(tmp_path / "root")
    inv = sysfs.read_inventory(str(tree.root))
    devices = plugin_devices(inv)
    devices["nvidia.com/gpu"] = ["7"]  # an index that is no group
    kubelet.set(allocatable=devices)
    clock = Clock()
    agent, _writer = make_agent(tree.root, kubelet, clock)
    server = serve(agent, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        try:
            urllib.request.urlopen(base + "/readyz")
            raise AssertionError("ready before the first write")
        except urllib.error.HTTPError as exc:
            assert exc.code == 503
        agent.tick()
        assert urllib.request.urlopen(base + "/healthz").status == 200
        assert urllib.request.urlopen(base + "/readyz").status == 200
        # The inventory is not on the plain-HTTP probe port.
        try:
            urllib.request.urlopen(base + "/metrics")
            raise AssertionError("/metrics served over plain HTTP")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        certs = self_signed(tmp_path / "certs", "cozystack-gpu-agent.n1")
        https = MetricsServer(
            None,
            certs,
            0,
            addr="127.0.0.1",
            registry=agent.metrics.registry,
            reviewer=lambda token: Decision(200) if token == "reader" else Decision(403, "no"),
        )
        try:
            insecure = ssl.create_default_context()
            insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
            request = urllib.request.Request(
                f"https://127.0.0.1:{https.port}/metrics",
                headers={"Authorization": "Bearer reader"},
            )
            metrics = urllib.request.urlopen(request, context=insecure).read().decode()
            refused = urllib.request.Request(
                f"https://127.0.0.1:{https.port}/metrics",
                headers={"Authorization": "Bearer tenant"},
            )
            try:
                urllib.request.urlopen(refused, context=insecure)
                raise AssertionError("a refused token read the agent's metrics")
            except urllib.error.HTTPError as exc:
                assert exc.code == 403
        finally:
            https.stop()
    finally:
        server.shutdown()
    assert "cozystack_gpu_agent_devices 11.0" in metrics
    assert (
        'cozystack_gpu_agent_allocatable{resource_name="nvidia.com/GH100_H100_SXM5_80GB"} 2.0'
        in (metrics)
    )
    assert (
        'cozystack_gpu_agent_unresolved_device_ids{resource_name="nvidia.com/gpu"} 1.0' in metrics
    )
    assert 'cozystack_gpu_agent_refreshes_total{result="written"} 1.0' in metrics
    assert "cozystack_gpu_agent_kubelet_up 1.0" in metrics
