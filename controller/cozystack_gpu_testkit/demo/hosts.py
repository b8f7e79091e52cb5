"""The demo's simulated GPU hosts: their hardware, their filesystems, their kubelets.

A host's filesystem root is a sysfs fixture tree (:mod:`cozystack_gpu_testkit.sysfs_tree`) as
after a boot: passthrough GPUs already on vfio-pci (the vfio role binds them at boot), vGPU
cards on the nvidia driver without VFs (VFs and profiles are gone after every boot). Below the
same root live what the host layer calls and what the node agent reads:

* ``usr/lib/nvidia/sriov-manage`` and ``usr/bin/nvidia-smi``: the molecule stand-ins
  (``molecule/shared/stand-ins``), acting on this tree;
* ``var/lib/kubelet/pod-resources/kubelet.sock``: the fake kubelet's pod-resources socket,
  serving what kubevirt-gpu-device-plugin advertises for the tree, and the pods that
  ``pods.json`` (beside the tree) names.

The demo plays each host's kubelet towards the API server too: it registers the Node, keeps
it Ready and writes the device plugin's resources as allocatable (:class:`Kubelets`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cozystack_gpu import keys
from cozystack_gpu.agent import sysfs
from cozystack_gpu_testkit import kubevirt
from cozystack_gpu_testkit.fake_kubelet import plugin_devices
from cozystack_gpu_testkit.objects import Kube
from cozystack_gpu_testkit.sysfs_tree import H100_SXM, L40S, Gpu, build

REPO_ROOT = Path(__file__).resolve().parents[3]
STAND_INS = REPO_ROOT / "molecule" / "shared" / "stand-ins"
TESTKIT = Path(__file__).resolve().parents[1]
SOCKET = "var/lib/kubelet/pod-resources/kubelet.sock"
# What the kernel lets a unix socket path be (sun_path), less its terminating NUL.
SOCKET_PATH_MAX = 107

H100 = "nvidia.com/GH100_H100_SXM5_80GB"
L40S_WHOLE = "nvidia.com/AD102GL_L40S"
L40S_24C = "nvidia.com/NVIDIA_L40S-24C"


@dataclass(frozen=True)
class SimHost:
    """One GPU host: its cards as after a boot, and what its layout makes of them."""

    name: str
    about: str
    gpus: tuple[Gpu, ...]
    # resource name -> devices the device plugin advertises once the layout is applied
    advertises: dict[str, int]
    # Node labels the layout earns (a subset is enough to check)
    labels: dict[str, str] = field(default_factory=dict)


HOSTS = (
    SimHost(
        "gpu-h100-01",
        "4 x H100 SXM5 80GB, whole GPUs for VMs (passthrough)",
        tuple(
            Gpu(f"0000:{bus:02x}:00.0", H100_SXM, driver="vfio-pci", numa_node=i // 2)
            for i, bus in enumerate((0x18, 0x2A, 0x3A, 0x5D))
        ),
        {H100: 4},
        {
            keys.LABEL_NODE_LAYOUT: "h100-passthrough",
            keys.NODE_MODE_LABEL_PREFIX + "passthrough": "4",
        },
    ),
    SimHost(
        "gpu-l40s-01",
        "2 x L40S, each split into two NVIDIA L40S-24C vGPUs",
        (
            Gpu("0000:41:00.0", L40S, driver="nvidia"),
            Gpu("0000:81:00.0", L40S, driver="nvidia", numa_node=1),
        ),
        {L40S_24C: 4},
        {
            keys.LABEL_NODE_LAYOUT: "l40s-24c",
            keys.NODE_PROFILE_LABEL_PREFIX + "NVIDIA_L40S-24C": "4",
        },
    ),
    SimHost(
        "gpu-l40s-02",
        "2 x L40S of one model, mixed: one whole (passthrough), one as two L40S-24C vGPUs",
        (
            Gpu("0000:41:00.0", L40S, driver="vfio-pci"),
            Gpu("0000:81:00.0", L40S, driver="nvidia", numa_node=1),
        ),
        {L40S_WHOLE: 1, L40S_24C: 2},
        {
            keys.LABEL_NODE_LAYOUT: "l40s-mixed",
            keys.NODE_MODE_LABEL_PREFIX + "passthrough": "1",
            keys.NODE_MODE_LABEL_PREFIX + "vgpu": "1",
        },
    ),
)
# A node without GPUs, where the controller's pod runs.
WORKER = "worker-01"
# The hoster keeps ordinary pods off GPU nodes; the GPUClasses tolerate it.
GPU_TAINT = {"key": "gpu.example.net/dedicated", "value": "vm", "effect": "NoSchedule"}


def host_root(demo_dir: Path, host: str) -> Path:
    return demo_dir / "hosts" / host


def pods_file(demo_dir: Path, host: str) -> Path:
    return demo_dir / "hosts" / f"{host}.pods.json"


def build_host(demo_dir: Path, host: SimHost) -> Path:
    """The host's filesystem: its sysfs tree as after a boot, the stand-ins, kubelet's
    pod-resources directory. Returns its root."""
    root = host_root(demo_dir, host.name)
    shutil.rmtree(root, ignore_errors=True)
    build(root, host.gpus)
    stand_in_conf = root / "etc" / "cozystack-gpu-stand-in"
    stand_in_conf.mkdir(parents=True)
    (stand_in_conf / "root").write_text(f"{root}\n")
    # The vGPU manager is up (sriov-manage fails until it is, as the real one does).
    ready = root / "run" / "nvidia-vgpu-mgr.ready"
    ready.parent.mkdir(parents=True)
    ready.write_text("")
    for relpath, script in (
        ("usr/lib/nvidia/sriov-manage", "sriov_manage.py"),
        ("usr/bin/nvidia-smi", "nvidia_smi.py"),
    ):
        _stand_in(root / relpath, script, stand_in_conf, ready)
    (root / SOCKET).parent.mkdir(parents=True)
    return root


def _stand_in(path: Path, script: str, conf: Path, ready: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "#!/bin/sh\n"
        f"# {path.name} on this simulated host: the molecule stand-in, acting on its tree.\n"
        f"export COZYSTACK_GPU_STAND_IN_CONF={conf}\n"
        f"export COZYSTACK_GPU_STAND_IN_LIB={TESTKIT}\n"
        f"export COZYSTACK_GPU_STAND_IN_READY={ready}\n"
        # The stand-in's call log stays in the host's tree, not in this machine's /var/lib.
        f"export COZYSTACK_GPU_STAND_IN_CALLS={conf / 'calls'}\n"
        f'exec {sys.executable} {STAND_INS / script} "$@"\n'
    )
    path.chmod(0o755)


def check_socket_paths(demo_dir: Path, agent_root: Callable[[str], Path]) -> None:
    """Unix socket paths are short: refuse a directory too deep for them, saying so.
    ``agent_root`` gives the root directory of a node's agent pod."""
    paths = [host_root(demo_dir, h.name) / SOCKET for h in HOSTS]
    paths += [agent_root(h.name) / SOCKET for h in HOSTS]
    longest = max(len(str(p)) for p in paths)
    if longest > SOCKET_PATH_MAX:
        raise ValueError(
            f"{demo_dir} is too deep: kubelet's pod-resources socket below it would have a "
            f"path of {longest} characters, and unix sockets take at most {SOCKET_PATH_MAX}; "
            "choose a shorter --dir"
        )


def advertised(root: Path) -> dict[str, list[str]]:
    """resource name -> device IDs, as the device plugin advertises the tree now."""
    return plugin_devices(sysfs.read_inventory(str(root)))


@dataclass
class Kubelets:
    """The kubelets of the simulated hosts, towards the API server and the node agents."""

    kube: Kube
    demo_dir: Path
    # The demo run's mark, on each Node registered (platform.MARK).
    mark: dict[str, str] = field(default_factory=dict)
    # host -> pods running there: (namespace, name, resource name -> device IDs)
    running: dict[str, list[tuple[str, str, dict[str, list[str]]]]] = field(default_factory=dict)

    def register(self, name: str, *, gpu: bool) -> None:
        """kubelet's first start: the Node, Ready, with no GPU resources yet. GPU hosts
        register with the hoster's taint (kubelet --register-with-taints) that keeps pods
        other than VMs off them."""
        labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.mark,
        }
        self.kube.node(name, labels=labels, ready=True, taints=[GPU_TAINT] if gpu else [])
        # virt-handler's start on the host: its labels and device plugins.
        kubevirt.as_virt_handler(self.kube.api, name)

    def advertise(self, host: str) -> dict[str, list[str]]:
        """The device plugin registered its resources: allocatable follows them."""
        devices = advertised(host_root(self.demo_dir, host))
        self.kube.node_status(
            host, allocatable={r: len(ids) for r, ids in devices.items()}, ready=True
        )
        return devices

    def ready(self, host: str, ready: bool) -> None:
        self.kube.node_status(host, ready=ready)

    def run_pod(
        self, host: str, namespace: str, name: str, requests: dict[str, int]
    ) -> dict[str, list[str]]:
        """Starts a pod the scheduler bound here: the device plugin allocates free devices
        of each requested resource, the pod-resources API lists them, the pod runs."""
        in_use = {
            device
            for _ns, _name, devices in self.running.get(host, [])
            for ids in devices.values()
            for device in ids
        }
        free = advertised(host_root(self.demo_dir, host))
        allocated = {
            resource: [d for d in free.get(resource, []) if d not in in_use][:count]
            for resource, count in requests.items()
        }
        self.running.setdefault(host, []).append((namespace, name, allocated))
        self._write_pods(host)
        pod = self.kube.core.read_namespaced_pod(name, namespace)
        self.kube.core.patch_namespaced_pod_status(
            name, namespace, {"status": kubevirt.running_status(pod.spec.containers, ready=True)}
        )
        return allocated

    def forget_pod(self, namespace: str, name: str) -> None:
        for host, pods in self.running.items():
            kept = [p for p in pods if (p[0], p[1]) != (namespace, name)]
            if len(kept) != len(pods):
                self.running[host] = kept
                self._write_pods(host)

    def _write_pods(self, host: str) -> None:
        entries = [
            {"namespace": ns, "name": name, "devices": devices}
            for ns, name, devices in self.running.get(host, [])
        ]
        path = pods_file(self.demo_dir, host)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entries))
        os.replace(tmp, path)
