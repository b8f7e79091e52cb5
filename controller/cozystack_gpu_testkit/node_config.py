"""What the real node's containerd and kubelet start with (``node.start``): where each keeps
its state, containerd's config, the CNI network of the node's pods, kubelet's config, its
certificates and kubeconfig, and its arguments.

Every path is the node's own (under one work directory), except what kubelet and containerd
hard-code (``node_host.HOST_PATHS``). The choices were measured on a Debian 12 machine in a
container with cgroup v1 (TESTING.md, "A real node"); each setting says which failure it
avoids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit import plane_config
from cozystack_gpu_testkit.pki import CertificateAuthority

# The CRI namespace containerd keeps kubelet's images and containers in.
CRI_NAMESPACE = "k8s.io"
# Debian's containernetworking-plugins (tools/node-packages.sh).
CNI_BIN_DIR = Path("/usr/lib/cni")
# The node's pod network: a bridge of its own in the host's network namespace and the pods'
# addresses in network namespaces made on this machine. Not podman's 10.88.0.0/16.
CNI_NETWORK = "cozystack-gpu-node"
BRIDGE = "cgpu-node0"
POD_SUBNET = "10.213.0.0/24"
# The node's address: the bridge's own (its pods' gateway), made before kubelet starts.
# kubelet refuses a loopback node IP (the Node then has no address and hostNetwork pods no
# IP), and this one never leaves the machine. kubelet serves on it; the API server reaches
# kubelet there.
NODE_IP = "10.213.0.1"
NODE_IP_PREFIX = 24


@dataclass(frozen=True)
class Layout:
    """Where one node keeps everything, under ``workdir``.

    Short on purpose: unix socket paths (containerd's, kubelet's pod-resources socket) are
    limited to about 100 bytes.
    """

    workdir: Path

    @property
    def containerd_root(self) -> Path:
        return self.workdir / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.workdir / "run"

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "run" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.workdir / "containerd.toml"

    @property
    def kubelet_root(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.workdir / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "kubelet.kubeconfig"

    @property
    def pki(self) -> Path:
        return self.workdir / "pki"

    @property
    def cni_conf_dir(self) -> Path:
        return self.workdir / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.workdir / "cni" / "ipam"

    @property
    def pod_logs(self) -> Path:
        return self.workdir / "pod-logs"

    @property
    def volume_plugins(self) -> Path:
        return self.workdir / "volume-plugins"

    @property
    def pod_resources_socket(self) -> Path:
        """kubelet's pod-resources API (the agent's ``PodResourcesClient`` reads it)."""
        return self.kubelet_root / "pod-resources" / "kubelet.sock"

    def make(self) -> None:
        for path in (
            self.containerd_root,
            self.containerd_state,
            self.kubelet_root,
            self.pki,
            self.cni_conf_dir,
            self.cni_data_dir,
            self.pod_logs,
            self.volume_plugins,
        ):
            path.mkdir(parents=True, exist_ok=True)


def containerd_config(layout: Layout, pause_image: str) -> str:
    """containerd's config (version 3, containerd 2.x).

    - ``restrict_oom_score_adj``: this machine's root lacks CAP_SYS_RESOURCE; without it
      runc cannot lower a sandbox's OOM score and every sandbox fails (``can't get final
      child's PID from pipe: EOF``).
    - ``SystemdCgroup = false``: no systemd here; kubelet's ``cgroupDriver`` is cgroupfs.
    - the sandbox image pinned to the locally built pause image, never pulled.
    - ``netns_mounts_under_state_dir``: the pods' network namespaces under the node's state,
      not in the host's /run/netns where podman keeps its own.
    - NRI off: its socket is host-global (/var/run/nri).
    """
    return f"""version = 3
root = "{layout.containerd_root}"
state = "{layout.containerd_state}"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "{layout.containerd_socket}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = false
  enable_unprivileged_icmp = false
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{layout.cni_conf_dir}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def cni_conflist(layout: Layout) -> dict[str, Any]:
    """The pods' network: a bridge with host-local addresses whose state stays in the
    node's directory. No masquerading and no port mapping: nothing leaves the machine. The
    pods' one route out is to the Services' addresses, through the bridge, where the node
    routes the ``kubernetes`` Service (``node_host.route_service``)."""
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "routes": [{"dst": plane_config.SERVICE_CIDR}],
                    "dataDir": str(layout.cni_data_dir),
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(
    layout: Layout, *, port: int, cgroup_root: str, taints: list[dict[str, str]]
) -> dict[str, Any]:
    """kubelet's KubeletConfiguration.

    cgroup v1 with cgroupfs and a cgroup root of the node's own; no swap check; serving on
    the node's bridge address only, no read-only port and no healthz port; no iptables
    chains of its own (``makeIPTablesUtilChains`` would add a DROP rule to the host's INPUT
    and OUTPUT); pod logs and volume plugins in the node's directory; eviction and image
    garbage collection that never fire on a busy shared machine (they would remove the
    tests' pods and imported images).
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "makeIPTablesUtilChains": False,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "podLogsDir": str(layout.pod_logs),
        "volumePluginDir": str(layout.volume_plugins),
        "tlsCertFile": str(layout.pki / "kubelet-serving.crt"),
        "tlsPrivateKeyFile": str(layout.pki / "kubelet-serving.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(layout.pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "registerWithTaints": taints,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "2s",
    }


def certificates(layout: Layout, ca: CertificateAuthority, node_name: str) -> None:
    """kubelet's client pair (``system:node:<name>`` in ``system:nodes``: the API server's
    Node authorizer and NodeRestriction let it write its own Node and its pods' status and
    nothing else) and its serving pair for ``NODE_IP``, both from the plane's CA."""
    (layout.pki / "ca.crt").write_bytes(ca.cert_pem)
    ca.issue(f"system:node:{node_name}", organization="system:nodes", client=True).write(
        layout.pki / "kubelet-client.crt", layout.pki / "kubelet-client.key"
    )
    ca.issue(
        node_name, dns_names=(node_name, "localhost"), ip_addresses=(NODE_IP,), server=True
    ).write(layout.pki / "kubelet-serving.crt", layout.pki / "kubelet-serving.key")


def write(
    layout: Layout,
    *,
    server: str,
    ca: CertificateAuthority,
    node_name: str,
    pause_image: str,
    kubelet_port: int,
    cgroup_root: str,
    taints: list[dict[str, str]],
) -> None:
    """Every file containerd and kubelet read, in ``layout``."""
    layout.make()
    certificates(layout, ca, node_name)
    pki = layout.pki
    client = plane_config.kubeconfig(
        server,
        ca.cert_pem,
        (pki / "kubelet-client.crt").read_bytes(),
        (pki / "kubelet-client.key").read_bytes(),
    )
    layout.kubeconfig.write_text(yaml.safe_dump(client))
    layout.kubeconfig.chmod(0o600)
    layout.containerd_config.write_text(containerd_config(layout, pause_image))
    (layout.cni_conf_dir / "10-cozystack-gpu-node.conflist").write_text(
        json.dumps(cni_conflist(layout), indent=2)
    )
    config = kubelet_config(layout, port=kubelet_port, cgroup_root=cgroup_root, taints=taints)
    layout.kubelet_config.write_text(yaml.safe_dump(config))


def containerd_args(bin_dir: Path, layout: Layout) -> list[str]:
    return [str(bin_dir / "containerd"), f"--config={layout.containerd_config}"]


def kubelet_args(bin_dir: Path, layout: Layout, node_name: str) -> list[str]:
    return [
        str(bin_dir / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.pki}",
        f"--hostname-override={node_name}",
        f"--node-ip={NODE_IP}",
        "--v=1",
    ]
