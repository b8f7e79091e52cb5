"""A real local Kubernetes control plane: etcd and kube-apiserver on loopback, and on demand
kube-scheduler, a kube-controller-manager and KubeVirt's virt-controller and virt-api
(``kubevirt``).

Every test of CRDs, the controller, webhooks and the chart runs against this server; there
is no mocked Kubernetes API. The binaries come from ``tools/build-binaries.sh`` (built from
source once per machine and cached). The scheduler binds pods as in a cluster; the
controller-manager runs only the garbage collector and the namespace and service-account
controllers. There is no kubelet and no node lifecycle controller: tests patch Node and Pod
status as kubelets would (see ``objects.Kube.node_status``); the few that need a container
runtime start a real node on a plane (``node``).

What etcd and kube-apiserver start with (certificates, kubeconfig, arguments):
``plane_config``. By hand: ``local_cluster`` (``make cluster``).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit import plane_config
from cozystack_gpu_testkit.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-binaries.sh"
CRD_DIR = REPO_ROOT / "controller" / "cozystack_gpu" / "crds"
DEFAULT_STATE_DIR = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cozystack-gpu" / "dev-cluster"
)
READY_TIMEOUT_S = 90.0
KUBEVIRT_CRD_FILE = "kubevirt-crds.yaml"
# Set (to anything) to keep each control plane's work directory (its logs, the audit log,
# etcd's data) after it stops, for reading after a failed run.
KEEP_WORKDIR_ENV = "COZYSTACK_GPU_KEEP_PLANE"

SCHEDULER = "kube-scheduler"
CONTROLLER_MANAGER = "kube-controller-manager"
# KubeVirt's components as the plane names them (started by ``kubevirt.start``).
VIRT_CONTROLLER = "virt-controller"
VIRT_API = "virt-api"
# Only what makes owner references, namespaces and service accounts real. Not the node
# lifecycle controller: the tests play the kubelets, and it would mark their nodes NotReady
# and evict their pods.
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    # Fills the built-in admin/edit/view roles from labelled roles, as in every cluster: the
    # chart's tenant roles aggregate into them.
    "clusterrole-aggregation-controller",
    # Takes ended pods out of a ResourceClaim's reservedFor, lets an allocation go once none
    # is left, and lifts its delete protection, as in every cluster serving DRA.
    "resourceclaim-controller",
)
# What a chart's pods need on a plane with a real node (``node``): the Deployment's
# ReplicaSet, the DaemonSet's pods, the Service's EndpointSlices (kube-apiserver calls the
# webhooks at them, with aggregator routing) and the PodDisruptionBudget's status.
WORKLOAD_CONTROLLERS = (
    *CONTROLLERS,
    "deployment-controller",
    "replicaset-controller",
    "daemonset-controller",
    "endpointslice-controller",
    "disruption-controller",
)
# Clients first, the API server before its storage.
STOP_ORDER = (VIRT_CONTROLLER, VIRT_API, SCHEDULER, CONTROLLER_MANAGER, "kube-apiserver", "etcd")
# High enough that neither component's client is ever the limit of a test or benchmark
# (their defaults, 50/100 and 20/30 requests per second, would be).
CLIENT_QPS = 5000
CLIENT_BURST = 10000

_PR_SET_PDEATHSIG = 1


def kubeconfig_client(kubeconfig: Path | str, pool_size: int = 32) -> Any:
    """A kubernetes.client.ApiClient with the identity of ``kubeconfig``, its connection
    pool of ``pool_size``."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class ControlPlaneError(RuntimeError):
    """The control plane could not be started; the message carries the server's log tail."""


def binary_dir() -> Path:
    """The directory with the control plane's binaries and KubeVirt's CRDs, building them if
    needed."""
    configured = os.environ.get("COZYSTACK_GPU_BIN_DIR")
    if configured:
        return Path(configured)
    if not BUILD_SCRIPT.exists():
        raise ControlPlaneError(
            f"no binaries: set COZYSTACK_GPU_BIN_DIR or run {BUILD_SCRIPT} from a checkout"
        )
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    return Path(out.strip().splitlines()[-1])


def kubevirt_crds(bin_dir: Path | None = None) -> Path:
    """KubeVirt's CRDs (VirtualMachineInstance, VirtualMachine, instance types) as its
    virt-operator generates them at the pinned release; ``tools/build-binaries.sh`` writes
    them next to the binaries."""
    path = (bin_dir or binary_dir()) / KUBEVIRT_CRD_FILE
    if not path.is_file():
        raise ControlPlaneError(
            f"{path} is missing: run `make binaries` ({BUILD_SCRIPT}) to generate KubeVirt's CRDs"
        )
    return path


def _die_with_parent() -> None:
    """Runs in the child before exec: the kernel kills it when the test process dies.

    This is what keeps a killed (SIGKILL) pytest run from leaving etcd or kube-apiserver
    behind; atexit handlers never run in that case.
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver pair and the files a client needs to reach it."""

    workdir: Path
    bin_dir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    client_cert: Path
    client_key: Path
    pids: dict[str, int] = field(default_factory=dict)
    detach: bool = False
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)
    _owns_workdir: bool = field(default=False, repr=False)
    # The CA of the client certificate kube-apiserver presents to webhooks: a replica given
    # it (--webhook-client-ca) answers the API server and no one else.
    webhook_client_ca: Path | None = None
    # kube-apiserver's audit log, when ``start`` was given rules to log.
    audit_log: Path | None = None
    # The controllers kube-controller-manager runs (``start_controller_manager``).
    controllers: tuple[str, ...] = CONTROLLERS

    # --- clients ---------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx

    def get_json(self, path: str, timeout: float = 5.0) -> Any:
        with urllib.request.urlopen(
            self.server + path, context=self.ssl_context(), timeout=timeout
        ) as resp:
            return json.loads(resp.read())

    def version(self) -> str:
        return str(self.get_json("/version")["gitVersion"])

    def service_account_kubeconfig(
        self, namespace: str, account: str, path: Path, seconds: int = 3600
    ) -> Path:
        """A kubeconfig with a token of a ServiceAccount, the identity its pod's projected
        token would give a component (virt-controller, the controller under the chart's
        RBAC); its context's namespace is the account's."""
        from kubernetes import client

        token = (
            client.CoreV1Api(self.api_client())
            .create_namespaced_service_account_token(
                account, namespace, {"spec": {"expirationSeconds": seconds}}
            )
            .status.token
        )
        context = {"cluster": "local", "user": account, "namespace": namespace}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": context}],
            "current-context": account,
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def api_client(self, pool_size: int = 32) -> Any:
        """A kubernetes.client.ApiClient with the admin identity.

        The pool is sized for the binder's writer threads and informers sharing one client.
        """
        return kubeconfig_client(self.kubeconfig, pool_size)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            check=check,
            capture_output=True,
            text=True,
        )

    # --- lifecycle -------------------------------------------------------------------

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(
                        f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                    )
            try:
                req = urllib.request.Request(self.server + "/readyz")
                with urllib.request.urlopen(req, context=self.ssl_context(), timeout=2) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"/readyz answered {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {timeout:.0f} s ({last}):\n"
            f"{self.log_tail('kube-apiserver')}"
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _spawn(self, name: str, args: list[str]) -> None:
        """Starts one component, logging to ``<workdir>/<name>.log``.

        Attached, it dies with the calling process even on SIGKILL; detached (``cluster up``),
        it runs in its own session.
        """
        with (self.workdir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=self.detach,
                preexec_fn=None if self.detach else _die_with_parent,
            )
        self.pids[name] = proc.pid
        self._procs[name] = proc

    def running(self, name: str) -> bool:
        proc = self._procs.get(name)
        if proc is not None:
            return proc.poll() is None
        pid = self.pids.get(name)
        return pid is not None and alive(pid)

    def start_scheduler(self) -> None:
        """Starts kube-scheduler against this API server (no-op when it runs).

        No serving port and no leader election: one scheduler, reached by nobody.
        """
        if self.running(SCHEDULER):
            return
        config = self.workdir / "kube-scheduler.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kubescheduler.config.k8s.io/v1",
                    "kind": "KubeSchedulerConfiguration",
                    "clientConnection": {
                        "kubeconfig": str(self.kubeconfig),
                        "qps": CLIENT_QPS,
                        "burst": CLIENT_BURST,
                    },
                    "leaderElection": {"leaderElect": False},
                }
            )
        )
        self._spawn(
            SCHEDULER,
            [
                str(self.bin_dir / SCHEDULER),
                f"--config={config}",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def start_controller_manager(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Starts kube-controller-manager with ``controllers`` (no-op when it runs), and waits
        until its service-account controller has made ``default/default``: from then on, pods
        pass the ServiceAccount admission plugin in namespaces it has seen."""
        if not self.running(CONTROLLER_MANAGER):
            pki = self.workdir / "pki"
            self._spawn(
                CONTROLLER_MANAGER,
                [
                    str(self.bin_dir / CONTROLLER_MANAGER),
                    f"--kubeconfig={self.kubeconfig}",
                    f"--controllers={','.join(self.controllers)}",
                    # The token controller signs with the key the API server verifies with.
                    f"--service-account-private-key-file={pki / 'sa.key'}",
                    f"--root-ca-file={self.ca_file}",
                    "--leader-elect=false",
                    "--secure-port=0",
                    f"--kube-api-qps={CLIENT_QPS}",
                    f"--kube-api-burst={CLIENT_BURST}",
                    "--v=1",
                ],
            )
        self._wait_component(
            CONTROLLER_MANAGER,
            lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
            timeout,
            "the default ServiceAccount",
        )

    def stop_component(self, name: str, timeout: float = 10.0) -> None:
        """Stops one component this plane started (no-op when it does not run)."""
        pid = self.pids.pop(name, None)
        proc = self._procs.pop(name, None)
        if pid is not None:
            terminate(pid, proc, timeout)

    def _exists(self, path: str) -> bool:
        try:
            self.get_json(path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return False
            raise
        return True

    def _wait_component(
        self, name: str, predicate: Callable[[], bool], timeout: float, what: str
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                )
            time.sleep(0.1)
        raise ControlPlaneError(
            f"{name} did not make {what} within {timeout:.0f} s:\n{self.log_tail(name)}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stops the clients, then the API server before etcd, then removes a work directory
        it created."""
        for name in STOP_ORDER:
            pid = self.pids.get(name)
            if pid is None:
                continue
            proc = self._procs.get(name)
            terminate(pid, proc, timeout)
        self.pids.clear()
        self._procs.clear()
        if self._owns_workdir and not os.environ.get(KEEP_WORKDIR_ENV):
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def terminate(pid: int, proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None:
            if proc.poll() is not None:
                return
        elif not alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if proc is not None:
        proc.wait()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of someone else still answers signal 0; /proc tells the truth.
    with contextlib.suppress(OSError):
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    return False


def _scratch_parent() -> str | None:
    # etcd on tmpfs: the suite writes thousands of objects and fsync on disk would dominate.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def start(
    workdir: Path | None = None,
    *,
    bin_dir: Path | None = None,
    detach: bool = False,
    extra_apiserver_args: tuple[str, ...] = (),
    scheduler: bool = False,
    controller_manager: bool = False,
    controllers: Sequence[str] = CONTROLLERS,
    crds: Sequence[Path] = (),
    webhook_client_auth: bool = False,
    audit: Sequence[Mapping[str, Any]] = (),
) -> ControlPlane:
    """Starts etcd and kube-apiserver and waits for /readyz; installs ``crds``; then, when
    asked, kube-scheduler and kube-controller-manager (see ``ControlPlane.start_scheduler``
    and ``start_controller_manager``, which also start them later). CRDs installed before the
    controller-manager starts are known to its garbage collector at once; later ones only
    after its next discovery pass (every 30 s).

    With ``controller_manager`` the ServiceAccount admission plugin stays on, as in a cluster:
    its controller makes each namespace's ``default`` account. Without it the plugin is off,
    or it would refuse every pod.

    detach=False ties every process to the calling process (they die with it, even on
    SIGKILL); detach=True starts them in their own session for `cluster up`.

    ``controllers``: what kube-controller-manager runs (``WORKLOAD_CONTROLLERS`` where a
    real node runs a chart's pods).

    ``audit``: audit policy rules; what they match is logged to ``ControlPlane.audit_log``
    (every later stage than RequestReceived), and nothing else.

    ``webhook_client_auth``: kube-apiserver presents a client certificate to every webhook
    it calls (``ControlPlane.webhook_client_ca`` is its CA), as a hoster sets it up for
    ``webhook.clientAuth``. Off by default: virt-api's webhooks verify any client
    certificate they are given against a CA of their own, and refuse this one.
    """
    bin_dir = bin_dir or binary_dir()
    owns = workdir is None
    workdir = Path(workdir or tempfile.mkdtemp(prefix="cozystack-gpu-cp-", dir=_scratch_parent()))
    workdir.mkdir(parents=True, exist_ok=True)
    pki = workdir / "pki"
    pki.mkdir(exist_ok=True)
    ca, admin = plane_config.certificates(pki)
    webhook_client_ca, admission_args = plane_config.webhook_client_auth(pki, webhook_client_auth)
    audit_log, audit_args = plane_config.audit(workdir, audit)

    etcd_client, etcd_peer, secure_port = free_port(), free_port(), free_port()
    server = f"https://127.0.0.1:{secure_port}"
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(plane_config.kubeconfig(server, ca.cert_pem, admin.cert_pem, admin.key_pem))
    )
    kubeconfig.chmod(0o600)

    plane = ControlPlane(
        workdir=workdir,
        bin_dir=bin_dir,
        server=server,
        kubeconfig=kubeconfig,
        ca_file=pki / "ca.crt",
        client_cert=pki / "admin.crt",
        client_key=pki / "admin.key",
        detach=detach,
        _owns_workdir=owns,
        webhook_client_ca=webhook_client_ca,
        audit_log=audit_log,
        controllers=tuple(controllers),
    )

    etcd_args = plane_config.etcd_args(bin_dir, workdir, etcd_client, etcd_peer)
    apiserver_args = [
        *plane_config.apiserver_args(bin_dir, pki, etcd_client, secure_port),
        *admission_args,
        *plane_config.apiserver_policy_args(controller_manager),
        *audit_args,
        *extra_apiserver_args,
    ]
    _bring_up(plane, etcd_args, apiserver_args, scheduler, crds, controller_manager)
    return plane


def _bring_up(
    plane: ControlPlane,
    etcd_args: list[str],
    apiserver_args: list[str],
    scheduler: bool,
    crds: Sequence[Path],
    controller_manager: bool,
) -> None:
    """etcd, kube-apiserver until /readyz, then what ``start`` was asked for; a plane that
    does not come up is stopped."""
    try:
        plane._spawn("etcd", etcd_args)
        plane._spawn("kube-apiserver", apiserver_args)
        plane.wait_ready()
        # The scheduler does not care about CRDs: it starts while they are installed.
        if scheduler:
            plane.start_scheduler()
        if crds:
            install_crds(plane.api_client(), list(crds))
        if controller_manager:
            plane.start_controller_manager()
    except BaseException:
        plane.stop()
        raise


# --- CRDs and objects ----------------------------------------------------------------


def load_manifests(*paths: Path) -> list[dict[str, Any]]:
    """The documents of YAML files (copies: callers may change them)."""
    return [copy.deepcopy(d) for path in paths for d in _parsed(path)]


def _parsed(path: Path) -> tuple[dict[str, Any], ...]:
    stat = path.stat()
    return _parse(str(path.resolve()), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=32)
def _parse(path: str, _mtime_ns: int, _size: int) -> tuple[dict[str, Any], ...]:
    # KubeVirt's CRDs are 1.2 MB of YAML: libyaml reads them in under a second, the pure
    # Python loader takes four, and test modules install them again and again.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return tuple(d for d in yaml.load_all(Path(path).read_text(), Loader=loader) if d)


def install_crds(
    api_client: Any,
    paths: list[Path] | None = None,
    timeout: float = 30.0,
    *,
    replace: bool = True,
) -> None:
    """Creates (or replaces) CRDs and waits until each is Established and served.

    A CRD already served with the same spec is left alone, so installing again is cheap;
    with ``replace`` false so is one with another spec (a cluster's own, e.g. KubeVirt's).
    Bodies go and come back as raw JSON: the client's models would take seconds to build
    for KubeVirt's schemas.
    """
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api_client)
    crds = [d for path in paths or sorted(CRD_DIR.glob("*.yaml")) for d in _parsed(path)]
    for crd in crds:
        name = crd["metadata"]["name"]
        try:
            ext.create_custom_resource_definition(crd, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            if not replace:
                continue
            current = _read_crd(ext, name)
            if all(current["spec"].get(k) == v for k, v in crd["spec"].items()):
                continue
            body = {**crd, "metadata": {**crd["metadata"]}}
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            ext.replace_custom_resource_definition(name, body, _preload_content=False)
    for crd in crds:
        name = str(crd["metadata"]["name"])

        def established(name: str = name) -> bool:
            return _established(ext, name)

        _wait(established, timeout, f"CRD {name} not Established")


def _read_crd(ext: Any, name: str) -> dict[str, Any]:
    resp = ext.read_custom_resource_definition(name, _preload_content=False)
    crd: dict[str, Any] = json.loads(resp.data)
    return crd


def _established(ext: Any, name: str) -> bool:
    conditions = _read_crd(ext, name).get("status", {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"{what} after {timeout:.0f} s")


@contextlib.contextmanager
def running(**kwargs: Any) -> Iterator[ControlPlane]:
    plane = start(**kwargs)
    try:
        yield plane
    finally:
        plane.stop()
