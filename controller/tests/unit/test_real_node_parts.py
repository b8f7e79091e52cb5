"""The real node's parts that need no root and no binaries: the configs it writes and the
record of host state it keeps for a killed run's successor (the node itself:
tests/integration/test_real_node.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from cozystack_gpu_testkit import node_config, node_host, plane_config


def test_containerd_config_keeps_everything_in_the_nodes_directory(tmp_path: Path) -> None:
    layout = node_config.Layout(tmp_path)
    config = tomllib.loads(node_config.containerd_config(layout, "localhost/pause:x"))
    assert config["version"] == 3
    assert config["root"] == str(layout.containerd_root)
    assert config["state"] == str(layout.containerd_state)
    assert config["grpc"]["address"] == str(layout.containerd_socket)
    runtime = config["plugins"]["io.containerd.cri.v1.runtime"]
    # Without it every sandbox fails where root lacks CAP_SYS_RESOURCE.
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["netns_mounts_under_state_dir"] is True
    assert runtime["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False
    assert runtime["cni"]["conf_dir"] == str(layout.cni_conf_dir)
    images = config["plugins"]["io.containerd.cri.v1.images"]
    assert images["pinned_images"]["sandbox"] == "localhost/pause:x"
    assert "io.containerd.nri.v1.nri" in config["disabled_plugins"]


def test_kubelet_config_touches_no_host_default(tmp_path: Path) -> None:
    layout = node_config.Layout(tmp_path)
    config = node_config.kubelet_config(layout, port=1234, cgroup_root="/x", taints=[])
    assert config["address"] == node_config.NODE_IP
    assert (config["readOnlyPort"], config["healthzPort"]) == (0, 0)
    assert config["makeIPTablesUtilChains"] is False
    assert config["cgroupDriver"] == "cgroupfs"
    assert (config["failCgroupV1"], config["failSwapOn"]) == (False, False)
    for key in ("podLogsDir", "volumePluginDir", "tlsCertFile"):
        assert config[key].startswith(str(tmp_path)), key
    assert config["containerRuntimeEndpoint"] == f"unix://{layout.containerd_socket}"


def test_pods_route_only_to_the_services_through_the_bridge(tmp_path: Path) -> None:
    (bridge, _loopback) = node_config.cni_conflist(node_config.Layout(tmp_path))["plugins"]
    assert bridge["isGateway"] and not bridge["ipMasq"]
    # Their one way out is the Services' range, which the node routes for the API server's.
    assert bridge["ipam"]["routes"] == [{"dst": plane_config.SERVICE_CIDR}]


def test_socket_paths_fit_a_unix_socket_address() -> None:
    layout = node_config.Layout(Path("/var/tmp/cgpu-node-abcdefgh"))
    assert len(str(layout.pod_resources_socket)) < 100
    assert len(str(layout.containerd_socket)) < 100


def test_the_host_record_survives_its_file(tmp_path: Path) -> None:
    record = node_host.HostRecord(
        workdir=tmp_path / "w",
        socket=tmp_path / "w" / "run" / "containerd.sock",
        sysctls=node_host.Sysctls({"kernel.panic": "1"}),
        paths=node_host.HostPaths({Path("/a"): frozenset({"x"}), Path("/b"): None}),
        chains=node_host.IptablesChains({("iptables", "mangle", "KUBE-IPTABLES-HINT")}),
        cgroups=[Path("/sys/fs/cgroup/cpu/n")],
        bridge="br",
        network="net",
        routes_services=True,
    )
    record.save(tmp_path / "record.json")
    assert node_host.HostRecord.load(tmp_path / "record.json") == record


def test_new_entries_go_and_old_ones_stay(tmp_path: Path) -> None:
    found, made = tmp_path / "found", tmp_path / "made"
    found.mkdir()
    (found / "old").write_text("")
    paths = node_host.HostPaths({found: frozenset({"old"}), made: None})
    made.mkdir()
    (found / "new").mkdir()
    (found / "new" / "file").write_text("")
    (found / "link").symlink_to(found / "old")
    paths.remove_new()
    assert sorted(p.name for p in found.iterdir()) == ["old"]
    assert not made.exists()


def test_only_the_nodes_cni_results_go(tmp_path: Path) -> None:
    for name in (
        "cozystack-gpu-node-aaa-eth0",
        "cni-loopback-bbb-lo",
        "cni-loopback-ccc-lo",
        "podman-ddd-eth0",
    ):
        (tmp_path / name).write_text("{}")
    node_host.remove_cni_results("cozystack-gpu-node", {"bbb"}, cache=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cni-loopback-ccc-lo", "podman-ddd-eth0"]
