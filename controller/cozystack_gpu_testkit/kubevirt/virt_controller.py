"""virt-controller beside its virt-api, and ``start``: install, virt-api with its webhooks
in force, then virt-controller leading; also the kit's virt-handler identity on each plane
KubeVirt was started on (``virt_handler``)."""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.cluster import VIRT_API, VIRT_CONTROLLER, ControlPlane
from cozystack_gpu_testkit.kubevirt.install import (
    HANDLER_SERVICE_ACCOUNT,
    LAUNCHER_IMAGE,
    READY_TIMEOUT_S,
    KubeVirtError,
    _token_kubeconfig,
    install,
)
from cozystack_gpu_testkit.kubevirt.virt_api import VirtApi, _await, start_virt_api
from cozystack_gpu_testkit.objects import Kube
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port

# The kit's virt-handler identity on each plane KubeVirt was started on, by API server URL:
# ``reports`` writes VMI status with it.
_VIRT_HANDLERS: dict[str, Kube] = {}


def virt_handler(kube: Kube) -> Kube:
    """``kube``'s API server as virt-handler's ServiceAccount (``HANDLER_USER``), the only
    identity whose VMI status writes virt-api's mutator keeps, besides virt-controller's
    and its own: it puts a status changed by anyone else back as it was. Known once
    ``start`` has run on that plane."""
    server = kube.api.configuration.host
    try:
        return _VIRT_HANDLERS[server]
    except KeyError:
        raise KubeVirtError(
            f"no virt-handler identity for {server}: KubeVirt was not started there "
            "(kubevirt.start)"
        ) from None


class VirtController:
    """A running virt-controller beside its virt-api (``virt_api``): ``leading`` asks its
    /leader endpoint."""

    def __init__(
        self, plane: ControlPlane, port: int, ca: CertificateAuthority, virt_api: VirtApi
    ) -> None:
        self.plane = plane
        self.port = port
        self.virt_api = virt_api
        self._ca_pem = ca.cert_pem.decode()

    def leading(self) -> bool:
        """Whether it holds the lease and its controllers have started (its readiness)."""
        context = ssl.create_default_context(cadata=self._ca_pem)
        try:
            with urllib.request.urlopen(
                f"https://127.0.0.1:{self.port}/leader", context=context, timeout=2
            ) as resp:
                body = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return bool(body.get("apiserver", {}).get("leader") == "true")

    def log_tail(self, lines: int = 40) -> str:
        return self.plane.log_tail(VIRT_CONTROLLER, lines)

    def stop(self, timeout: float = 60.0) -> None:
        """Stops it once no VirtualMachine or VMI awaits deletion (up to ``timeout``): their
        finalizers are virt-controller's, and without it a deleted namespace holding a VM
        would never go. Then virt-api, its webhooks removed first (``VirtApi.stop``): the
        tests after these write VMIs by hand, as no KubeVirt would leave them. No-op for
        what the plane has stopped already."""
        from kubernetes import client

        if self.plane.running(VIRT_CONTROLLER):
            custom = client.CustomObjectsApi(self.plane.api_client())

            def deleting() -> list[str]:
                names = []
                for plural in ("virtualmachines", "virtualmachineinstances"):
                    listed = custom.list_cluster_custom_object("kubevirt.io", "v1", plural)
                    names += [
                        f"{plural}/{o['metadata']['namespace']}/{o['metadata']['name']}"
                        for o in listed["items"]
                        if o["metadata"].get("deletionTimestamp")
                    ]
                return names

            deadline = time.monotonic() + timeout
            while deleting() and time.monotonic() < deadline:
                time.sleep(0.2)
            self.plane.stop_component(VIRT_CONTROLLER)
        self.virt_api.stop()
        _VIRT_HANDLERS.pop(self.plane.server, None)


def start(plane: ControlPlane, timeout: float = READY_TIMEOUT_S) -> VirtController:
    """Installs what virt-operator would (``install``), starts virt-api with its webhooks
    (``start_virt_api``: in force before any VMI is made), then virt-controller, and waits
    until it leads with its controllers running. Also makes the kit's virt-handler identity
    (``virt_handler``). Once per plane (again only after ``VirtController.stop``)."""
    if plane.running(VIRT_CONTROLLER) or plane.running(VIRT_API):
        raise cluster.ControlPlaneError("KubeVirt already runs on this plane")

    install(plane)
    workdir = plane.workdir / VIRT_CONTROLLER
    workdir.mkdir(exist_ok=True)
    handler_config = workdir / "virt-handler.kubeconfig"
    _token_kubeconfig(plane, handler_config, HANDLER_SERVICE_ACCOUNT)
    virt_api = start_virt_api(plane, timeout)
    try:
        controller = _start_virt_controller(plane, workdir, virt_api, timeout)
    except BaseException:
        virt_api.stop()
        raise
    _VIRT_HANDLERS[plane.server] = Kube(cluster.kubeconfig_client(handler_config, 16))
    return controller


def _start_virt_controller(
    plane: ControlPlane, workdir: Path, virt_api: VirtApi, timeout: float
) -> VirtController:
    kubeconfig = workdir / "kubeconfig"
    _token_kubeconfig(plane, kubeconfig)
    # Its metrics and probe endpoints serve TLS only: a certificate of a CA of its own.
    ca = CertificateAuthority("virt-controller-ca")
    ca.issue(VIRT_CONTROLLER, ip_addresses=("127.0.0.1",), server=True).write(
        workdir / "tls.crt", workdir / "tls.key"
    )
    port = free_port()
    plane._spawn(
        VIRT_CONTROLLER,
        [
            str(plane.bin_dir / VIRT_CONTROLLER),
            f"--kubeconfig={kubeconfig}",
            "--listen=127.0.0.1",
            f"--port={port}",
            f"--launcher-image={LAUNCHER_IMAGE}",
            f"--prom-cert-file={workdir / 'tls.crt'}",
            f"--prom-key-file={workdir / 'tls.key'}",
            "--v=2",
        ],
    )
    controller = VirtController(plane, port, ca, virt_api)
    try:
        _await(
            plane, VIRT_CONTROLLER, controller.leading, timeout,
            "lead", controller.log_tail,
        )  # fmt: skip
    except BaseException:
        plane.stop_component(VIRT_CONTROLLER)
        raise
    return controller
