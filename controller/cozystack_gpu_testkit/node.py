"""A real node on a running control plane: containerd 2 (with Debian's runc and CNI
plugins) and kubelet, built from source like the plane (``tools/build-binaries.sh``), so pods
really run, the product's images are run by a real container runtime, and kubelet's own
pod-resources socket answers.

Everything else in the kit plays the kubelet (``objects.Kube.node_status``): fast and
deterministic, but blind to what only a runtime shows (an image that crashes under
containerd for lack of a passwd entry, a socket kubelet really serves). This node is for
those few tests; it costs its start (about a second to Ready, see TESTING.md) and a lock.

What the plane lacks for a node, ``start`` supplies: a client certificate for kubelet from
the plane's CA (``system:node:<name>``), the ``not-ready`` taint removed once Ready (no
node-lifecycle controller runs), and the ``kube-root-ca.crt`` ConfigMap in every namespace
(the real root-ca-certificate-publisher controller, in a kube-controller-manager of the
node's own: pods with a service-account token wait for it). Pods reach kube-apiserver as in
a cluster, at the ``kubernetes`` Service's cluster IP that kubelet gives them: no kube-proxy
runs, so the node routes that one Service itself (``node_host.route_service``, one nat rule
from the pods' bridge to the API server's loopback address). Other Services are not routed
for pods; kube-apiserver reaches a webhook Service's pods at their addresses (aggregator
routing). The node carries the taint ``NODE_TAINT``, so the plane's scheduler places nobody
else's pods on it; pods that tolerate it may be scheduled there or bound with ``nodeName``.

Images come from OCI archives (``import_image``, ``podman save --format oci-archive``):
no registry is reachable; pods use ``imagePullPolicy: Never``.

Host-global state (``node_host``): one real node per machine at a time, and ``stop`` puts
back what it changed. Needs root.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cozystack_gpu_testkit import node_config, node_host
from cozystack_gpu_testkit.cluster import ControlPlane, _die_with_parent, alive, terminate
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port

CONTAINERD = "containerd"
KUBELET = "kubelet"
# A kube-controller-manager running only the root-ca-certificate-publisher controller.
CA_PUBLISHER = "root-ca-publisher"
# A detached node's hold on the machine's node lock: a process of its own, stopped last, so
# the lock is free only once the whole node is gone and the host put back (kubelet held it
# once, and a node waiting for the lock took it over between kubelet's exit and the rest
# of ``stop_detached``, which then waited for that node's whole session).
LOCK_HOLDER = "node-lock-holder"
CA_PUBLISHER_CONTROLLER = "root-ca-certificate-publisher-controller"
STOP_ORDER = (KUBELET, CA_PUBLISHER, CONTAINERD)
NODE_TAINT = {"key": "cozystack-gpu.test/real-node", "value": "true", "effect": "NoSchedule"}
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
READY_TIMEOUT_S = 90.0
LOCK_TIMEOUT_S = 300.0
# Set (to anything) to keep the node's work directory (logs, configs) after it stops.
KEEP_WORKDIR_ENV = "COZYSTACK_GPU_KEEP_NODE"
PAUSE_ARCHIVE = "pause.oci.tar"
PAUSE_REF_FILE = "pause-image"
NODE_BINARIES = ("kubelet", "containerd", "containerd-shim-runc-v2", "ctr")


class NodeError(RuntimeError):
    """The node could not start or stop cleanly; the message says what and shows logs."""


def check_host(bin_dir: Path) -> None:
    """Raises NodeError naming the fix when something the node needs is missing."""
    missing = [
        n for n in (*NODE_BINARIES, PAUSE_ARCHIVE, PAUSE_REF_FILE) if not (bin_dir / n).exists()
    ]
    if missing:
        raise NodeError(f"{bin_dir} lacks {', '.join(missing)}: run `make binaries`")
    packages = []
    if shutil.which("runc") is None:
        packages.append("runc")
    if not (node_config.CNI_BIN_DIR / "bridge").exists():
        packages.append("containernetworking-plugins")
    if packages:
        raise NodeError(f"missing {', '.join(packages)}: run tools/node-packages.sh as root")
    if os.geteuid() != 0:
        raise NodeError("a real node needs root (cgroups, mounts, network namespaces)")


@dataclass
class RealNode:
    """A running containerd + kubelet registered as Node ``name`` on ``plane``."""

    plane: ControlPlane
    name: str
    layout: node_config.Layout
    bin_dir: Path
    pause_image: str
    pids: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _host: node_host.HostRecord | None = field(default=None, repr=False)
    _lock: node_host.NodeLock = field(default_factory=node_host.NodeLock, repr=False)
    _owns_workdir: bool = field(default=False, repr=False)
    # Every container id ``stop`` found, sandboxes' included (their CNI results, if left).
    _containers: set[str] = field(default_factory=set, repr=False)
    # Outlives the calling process (``make cluster``): its processes in sessions of their
    # own, ``LOCK_HOLDER`` holding the machine's node lock; ``stop_detached`` stops it later.
    detach: bool = False

    @property
    def pod_resources_socket(self) -> Path:
        """kubelet's pod-resources socket (``PodResourcesClient``'s ``socket_path``)."""
        return self.layout.pod_resources_socket

    # --- containerd ------------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """containerd's ``ctr`` on the node's socket, in kubelet's namespace."""
        argv = [str(self.bin_dir / "ctr"), "--address", str(self.layout.containerd_socket)]
        return subprocess.run(
            [*argv, "--namespace", node_config.CRI_NAMESPACE, *args],
            check=check,
            capture_output=True,
            text=True,
        )

    def import_image(self, archive: Path) -> None:
        """Imports an OCI archive (``podman save --format oci-archive``) under the names it
        carries: kubelet runs it with ``imagePullPolicy: Never``."""
        done = self.ctr("images", "import", str(archive), check=False)
        if done.returncode != 0:
            raise NodeError(f"ctr images import {archive} failed:\n{done.stdout}{done.stderr}")

    def container_logs(self, namespace: str, pod: str) -> str:
        """What the pod's containers wrote, every run of each, read from kubelet's pod log
        directory (``kubectl logs`` shows one run)."""
        texts = []
        for path in sorted(self.layout.pod_logs.glob(f"{namespace}_{pod}_*/*/*.log")):
            texts.append(
                f"--- {path.parent.name} ({path.name})\n{path.read_text(errors='replace')}"
            )
        return "\n".join(texts) or "(no logs)"

    # --- the Node --------------------------------------------------------------------

    def node(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = self.plane.get_json(f"/api/v1/nodes/{self.name}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise
        return found

    def ready(self) -> bool:
        found = self.node()
        conditions = (found or {}).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Waits until the Node is Ready, then removes the ``not-ready`` taint kubelet
        registered it with (what the node-lifecycle controller would do)."""
        deadline = time.monotonic() + timeout
        while not self.ready():
            self._check_running()
            if time.monotonic() > deadline:
                raise NodeError(
                    f"Node {self.name} not Ready after {timeout:.0f} s:\n{self.log_tail(KUBELET)}"
                )
            time.sleep(0.2)
        self._untaint()

    def _untaint(self) -> None:
        from kubernetes import client

        found = self.node() or {}
        taints = found.get("spec", {}).get("taints") or []
        kept = [t for t in taints if t["key"] != NOT_READY_TAINT]
        if kept != taints:
            client.CoreV1Api(self.plane.api_client(pool_size=1)).patch_node(
                self.name, {"spec": {"taints": kept}}
            )

    # --- processes -------------------------------------------------------------------

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.layout.workdir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        """Starts one process, logging to ``<workdir>/<name>.log``; it dies with the calling
        process, even on SIGKILL (containerd's shims do not: ``stop`` finds them), unless
        the node is detached. A detached node's ``LOCK_HOLDER`` holds the node lock."""
        keeps_lock = self.detach and name == LOCK_HOLDER
        with (self.layout.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=None if self.detach else _die_with_parent,
                start_new_session=self.detach,
                pass_fds=(self._lock.fd,) if keeps_lock else (),
            )
        self.pids[name] = proc.pid
        self._procs[name] = proc

    def _check_running(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise NodeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def _start_containerd(self, timeout: float = 30.0) -> None:
        # containerd finds its shim on PATH; runc is Debian's, in /usr/sbin.
        path = os.pathsep.join([str(self.bin_dir), "/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        self._spawn(
            CONTAINERD,
            node_config.containerd_args(self.bin_dir, self.layout),
            env={**os.environ, "PATH": path},
        )
        deadline = time.monotonic() + timeout
        while self.ctr("version", check=False).returncode != 0:
            self._check_running()
            if time.monotonic() > deadline:
                raise NodeError(f"containerd did not answer in {timeout:.0f} s")
            time.sleep(0.1)

    def _route_api_service(self, timeout: float = 30.0) -> None:
        """The ``kubernetes`` Service's cluster IP and port (what kubelet gives every pod as
        ``KUBERNETES_SERVICE_HOST``/``_PORT``) lead from the node's pods to kube-apiserver,
        whose serving certificate names that address."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                service = self.plane.get_json("/api/v1/namespaces/default/services/kubernetes")
                break
            except urllib.error.HTTPError as exc:
                # kube-apiserver makes the Service shortly after it is ready.
                if exc.code != 404 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        port = int(service["spec"]["ports"][0]["port"])
        target = self.plane.server.removeprefix("https://")
        node_host.route_service(node_config.BRIDGE, service["spec"]["clusterIP"], port, target)

    def _start_ca_publisher(self) -> None:
        plane = self.plane
        self._spawn(
            CA_PUBLISHER,
            [
                str(plane.bin_dir / "kube-controller-manager"),
                f"--kubeconfig={plane.kubeconfig}",
                f"--controllers={CA_PUBLISHER_CONTROLLER}",
                f"--root-ca-file={plane.ca_file}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    # --- stop ------------------------------------------------------------------------

    def stop(self, timeout: float = 10.0) -> None:
        """Stops kubelet, the CA publisher, every pod container and containerd (and its
        shims), deletes the Node, then puts the host back (``node_host``): mounts, the work
        directory, cgroups, the bridge, new entries in the host paths, kubelet's iptables
        chains, the sysctls; and releases the lock. Each step runs even when one before
        failed; what could not be undone is raised at the end."""
        problems: list[str] = []

        def step(what: str, action: Any, *args: Any) -> None:
            try:
                action(*args)
            except Exception as exc:  # every step must run
                problems.append(f"{what}: {exc}")

        step("pods", self._drain)
        step("kubelet", self._stop_process, KUBELET, timeout)
        step("CA publisher", self._stop_process, CA_PUBLISHER, timeout)
        step("Node object", self._delete_node)
        step("containers", self._remove_containers)
        step("containerd", self._stop_process, CONTAINERD, timeout)
        step("host", self._restore_host, problems)
        self._lock.release()
        if problems:
            raise NodeError("the real node did not stop cleanly: " + "; ".join(problems))

    def _stop_process(self, name: str, timeout: float) -> None:
        pid = self.pids.pop(name, None)
        proc = self._procs.pop(name, None)
        if pid is not None:
            terminate(pid, proc, timeout)

    def _delete_node(self) -> None:
        if self.plane.running("kube-apiserver") and self.node() is not None:
            self.plane.kubectl("delete", "node", self.name, "--wait=false", check=False)

    def _running_tasks(self) -> list[str]:
        rows = self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        return [row.split()[0] for row in rows if row.split()[2:3] == ["RUNNING"]]

    def _drain(self, timeout: float = 20.0) -> None:
        """Deletes the node's pods while kubelet runs, and waits until their containers are
        gone: kubelet stops each sandbox as in a cluster, its network torn down by CNI (the
        forced removal after it is for what kubelet leaves)."""
        if not (self.running(KUBELET) and self.plane.running("kube-apiserver")):
            return
        self.plane.kubectl(
            "delete",
            "pods",
            "--all-namespaces",
            f"--field-selector=spec.nodeName={self.name}",
            "--grace-period=0",
            "--force",
            "--wait=false",
            check=False,
        )
        deadline = time.monotonic() + timeout
        while self._running_tasks() and time.monotonic() < deadline:
            time.sleep(0.2)

    def running(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is None
        pid = self.pids.get(name)  # a detached node's, stopped by another process
        return pid is not None and alive(pid)

    def state(self) -> dict[str, Any]:
        """What ``stop_detached`` needs to stop this node from another process."""
        return {"name": self.name, "workdir": str(self.layout.workdir), "pids": dict(self.pids)}

    def _remove_containers(self) -> None:
        """Kills and deletes every task and container (pods' and sandboxes') while
        containerd runs: its shims and the containers' processes outlive it otherwise."""
        if not self.running(CONTAINERD):
            return
        for task in self.ctr("tasks", "ls", "--quiet", check=False).stdout.split():
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self.ctr("containers", "ls", "--quiet", check=False).stdout.split():
            self._containers.add(container)
            self.ctr("containers", "delete", container, check=False)

    def _restore_host(self, problems: list[str]) -> None:
        if self._host is None:
            return
        remove = self._owns_workdir and not os.environ.get(KEEP_WORKDIR_ENV)
        problems.extend(self._host.put_back(self._containers, remove_workdir=remove))
        node_host.RECORD_FILE.unlink(missing_ok=True)

    def __enter__(self) -> RealNode:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start(
    plane: ControlPlane,
    *,
    name: str | None = None,
    workdir: Path | None = None,
    images: Sequence[Path] = (),
    lock_timeout: float = LOCK_TIMEOUT_S,
    timeout: float = READY_TIMEOUT_S,
    taints: Sequence[Mapping[str, str]] = (NODE_TAINT,),
    detach: bool = False,
) -> RealNode:
    """Starts containerd, imports the pause image and ``images``, starts kubelet and the CA
    publisher, and waits until the Node is Ready and untainted. Waits up to ``lock_timeout``
    for another real node on this machine to stop. A node that does not come up is stopped
    (its host state put back) before the error is raised.

    ``taints``: the Node's own (by default ``NODE_TAINT``: only pods that tolerate it go
    there). ``detach``: the node outlives the calling process (``RealNode.detach``)."""
    bin_dir = plane.bin_dir
    check_host(bin_dir)
    lock = node_host.NodeLock()
    lock.acquire(lock_timeout)
    try:
        _clear_host()
    except BaseException:
        lock.release()
        raise
    owns = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="cgpu-node-", dir="/var/tmp"))
    node = RealNode(
        plane=plane,
        name=name or f"real-node-{uuid.uuid4().hex[:6]}",
        layout=node_config.Layout(workdir),
        bin_dir=bin_dir,
        pause_image=(bin_dir / PAUSE_REF_FILE).read_text().strip(),
        _lock=lock,
        _owns_workdir=owns,
        detach=detach,
    )
    try:
        _bring_up(node, images, timeout, taints)
    except BaseException:
        with contextlib.suppress(NodeError):
            node.stop()
        raise
    if detach:
        node._spawn(LOCK_HOLDER, ["sleep", "infinity"])
        lock.hand_over()
    return node


def import_hint(node: RealNode) -> str:
    """The command that puts an OCI archive into the node's containerd, for pods to run."""
    return (
        f"{node.bin_dir / 'ctr'} --address {node.layout.containerd_socket} "
        f"-n {node_config.CRI_NAMESPACE} images import <image.oci.tar>"
    )


def stop_detached(plane: ControlPlane, state: Mapping[str, Any], timeout: float = 10.0) -> None:
    """Stops a detached node (``RealNode.state``) from another process as ``RealNode.stop``
    does, the host put back from the node's record, and only then its ``LOCK_HOLDER``: the
    lock is free once nothing of the node is left."""
    node = RealNode(
        plane=plane,
        name=str(state["name"]),
        layout=node_config.Layout(Path(state["workdir"])),
        bin_dir=plane.bin_dir,
        pause_image="",
        pids={k: int(v) for k, v in state["pids"].items()},
        _owns_workdir=True,
        detach=True,
    )
    if node_host.RECORD_FILE.exists():
        node._host = node_host.HostRecord.load()
    try:
        node.stop(timeout)
    finally:
        node._stop_process(LOCK_HOLDER, timeout)


def _clear_host() -> None:
    """With the lock held: puts back what a killed node left, and refuses a machine whose own
    kubelet serves the fixed device-plugin socket."""
    left = node_host.recover()
    if left:
        raise NodeError(f"a killed node's host state could not be put back: {left}")
    if node_host.other_kubelet():
        raise NodeError(
            f"a kubelet of this machine serves {node_host.DEVICE_PLUGIN_SOCKET}: a real "
            "node would take its device-plugin socket over"
        )


def _bring_up(
    node: RealNode, images: Sequence[Path], timeout: float, taints: Sequence[Mapping[str, str]]
) -> None:
    host = node._host = node_host.HostRecord(
        workdir=node.layout.workdir,
        socket=node.layout.containerd_socket,
        bridge=node_config.BRIDGE,
        network=node_config.CNI_NETWORK,
    )
    host.record()
    cgroup_root = f"cozystack-gpu-{node.name}"
    host.cgroups = [h / cgroup_root for h in node_host.cgroup_hierarchies()]
    host.save()
    node_host.make_cgroup_root(cgroup_root)
    node_config.write(
        node.layout,
        server=node.plane.server,
        ca=CertificateAuthority.load(node.plane.ca_file, node.plane.ca_file.with_suffix(".key")),
        node_name=node.name,
        pause_image=node.pause_image,
        kubelet_port=free_port(),
        cgroup_root=f"/{cgroup_root}",
        taints=[dict(t) for t in taints],
    )
    node_host.make_bridge(node_config.BRIDGE, f"{node_config.NODE_IP}/{node_config.NODE_IP_PREFIX}")
    host.routes_services = True
    host.save()
    node._route_api_service()
    node._start_containerd()
    for archive in (node.bin_dir / PAUSE_ARCHIVE, *images):
        node.import_image(archive)
    node._start_ca_publisher()
    node._spawn(KUBELET, node_config.kubelet_args(node.bin_dir, node.layout, node.name))
    node.wait_ready(timeout)


@contextlib.contextmanager
def running(plane: ControlPlane, **kwargs: Any) -> Iterator[RealNode]:
    node = start(plane, **kwargs)
    try:
        yield node
    finally:
        node.stop()
