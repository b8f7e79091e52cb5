"""virt-api as virt-operator's Deployment runs it, with KubeVirt's own CA and its webhook
configurations as generated, each calling it by URL on loopback (``start_virt_api``,
``VirtApi``)."""

from __future__ import annotations

import ssl
import time
import urllib.error
import urllib.request
from typing import Any

from cozystack_gpu_testkit import cluster
from cozystack_gpu_testkit.cluster import VIRT_API, ControlPlane
from cozystack_gpu_testkit.kubevirt.install import (
    API_SERVICE_ACCOUNT,
    CA_BUNDLE_KEY,
    CA_CONFIGMAP,
    HANDLER_CLIENT_CN,
    NAMESPACE,
    READY_TIMEOUT_S,
    VIRT_API_HEALTHZ,
    VMI_FINALIZER,
    WEBHOOK_KINDS,
    KubeVirtError,
    _token_kubeconfig,
    manifests_file,
)
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port


class VirtApi:
    """A running virt-api with its webhooks registered: ``serving`` asks its readiness
    endpoint; ``stop`` removes the webhooks, then stops it."""

    def __init__(self, plane: ControlPlane, port: int, ca: CertificateAuthority) -> None:
        self.plane = plane
        self.port = port
        self.url = f"https://127.0.0.1:{port}"
        self.ca_pem = ca.cert_pem.decode()

    def serving(self) -> bool:
        """Whether it answers its readiness probe: its informers synced, its TLS server up
        and the API server reachable."""
        context = ssl.create_default_context(cadata=self.ca_pem)
        try:
            with urllib.request.urlopen(
                self.url + VIRT_API_HEALTHZ, context=context, timeout=2
            ) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_tail(self, lines: int = 40) -> str:
        return self.plane.log_tail(VIRT_API, lines)

    def webhook_configurations(self) -> list[dict[str, Any]]:
        """virt-api's webhook configurations as virt-operator generates them, each webhook
        calling this virt-api by URL (there is no Service or kube-proxy to route
        ``kubevirt/virt-api`` here) with this kit's CA; rules, failure and reinvocation
        policies, selectors and timeouts as generated."""
        import base64

        configurations = [
            d
            for d in cluster.load_manifests(manifests_file(self.plane.bin_dir))
            if d["kind"] in WEBHOOK_KINDS
        ]
        bundle = base64.b64encode(self.ca_pem.encode()).decode()
        for configuration in configurations:
            for webhook in configuration["webhooks"]:
                service = webhook["clientConfig"]["service"]
                if (service["namespace"], service["name"]) != (NAMESPACE, VIRT_API):
                    raise KubeVirtError(f"{webhook['name']} calls {service}, not virt-api")
                webhook["clientConfig"] = {
                    "url": self.url + service.get("path", "/"),
                    "caBundle": bundle,
                }
        return configurations

    def register(self) -> None:
        """Writes the webhook configurations (replacing those of an earlier virt-api)."""
        admission = _admission(self.plane)
        for configuration in self.webhook_configurations():
            write, remove = _writers(admission, configuration["kind"])
            _gone(remove, configuration["metadata"]["name"])
            write(configuration)

    def unregister(self) -> None:
        admission = _admission(self.plane)
        for configuration in self.webhook_configurations():
            _create, remove = _writers(admission, configuration["kind"])
            _gone(remove, configuration["metadata"]["name"])

    def stop(self) -> None:
        """Removes its webhook configurations, then stops it: with failurePolicy Fail they
        would refuse every VM and VMI write once it is gone. No-op once the plane has
        stopped it."""
        if not self.plane.running(VIRT_API):
            return
        self.unregister()
        self.plane.stop_component(VIRT_API)


def _admission(plane: ControlPlane) -> Any:
    from kubernetes import client

    return client.AdmissionregistrationV1Api(plane.api_client())


def _writers(admission: Any, kind: str) -> tuple[Any, Any]:
    if kind == "MutatingWebhookConfiguration":
        return (
            admission.create_mutating_webhook_configuration,
            admission.delete_mutating_webhook_configuration,
        )
    return (
        admission.create_validating_webhook_configuration,
        admission.delete_validating_webhook_configuration,
    )


def _gone(delete: Any, *args: str) -> None:
    """``delete(*args)``, already gone (404) being as good."""
    from kubernetes.client.rest import ApiException

    try:
        delete(*args)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _probe_vmi(name: str) -> dict[str, Any]:
    """A VMI that passes the CRD's schema, for dry runs in KubeVirt's namespace."""
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"domain": {"devices": {}, "memory": {"guest": "64Mi"}}},
    }


def _webhooks_in_force(plane: ControlPlane) -> bool:
    """Whether the API server calls virt-api's webhooks yet (it picks new configurations up
    a moment after they are written): a dry-run VMI comes back with the finalizer its
    mutator adds, and one with a disk of no volume is refused by its create validator."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    from cozystack_gpu import keys

    custom = client.CustomObjectsApi(plane.api_client())
    args = (keys.VMI.group, keys.VMI.version, NAMESPACE, keys.VMI.plural)
    try:
        mutated = custom.create_namespaced_custom_object(
            *args, _probe_vmi("virt-api-probe"), dry_run="All"
        )
    except ApiException:
        return False
    if VMI_FINALIZER not in (mutated["metadata"].get("finalizers") or []):
        return False
    invalid = _probe_vmi("virt-api-probe-invalid")
    invalid["spec"]["domain"]["devices"]["disks"] = [{"name": "none", "disk": {}}]
    try:
        custom.create_namespaced_custom_object(*args, invalid, dry_run="All")
    except ApiException as exc:
        return "virtualmachineinstances-create-validator.kubevirt.io" in str(exc.body)
    return False


def start_virt_api(plane: ControlPlane, timeout: float = READY_TIMEOUT_S) -> VirtApi:
    """Starts virt-api as ``API_USER`` with the flags virt-operator's Deployment gives it
    (install first: ``install``), waits until it answers its readiness probe, then
    registers its webhooks and waits until the API server calls them."""
    from kubernetes import client

    workdir = plane.workdir / VIRT_API
    workdir.mkdir(exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    _token_kubeconfig(plane, kubeconfig, API_SERVICE_ACCOUNT)
    # KubeVirt's own CA (virt-operator's kubevirt-ca): it signs virt-api's serving
    # certificate, which the webhook configurations trust, and its client certificate for
    # virt-handler; virt-api reads the CA from the ConfigMap virt-operator publishes it in.
    ca = CertificateAuthority(CA_CONFIGMAP)
    ca.issue(
        VIRT_API,
        dns_names=(f"{VIRT_API}.{NAMESPACE}.svc",),
        ip_addresses=("127.0.0.1",),
        server=True,
    ).write(workdir / "tls.crt", workdir / "tls.key")
    ca.issue(HANDLER_CLIENT_CN, client=True).write(
        workdir / "handler-tls.crt", workdir / "handler-tls.key"
    )
    core = client.CoreV1Api(plane.api_client())
    body = {"metadata": {"name": CA_CONFIGMAP}, "data": {CA_BUNDLE_KEY: ca.cert_pem.decode()}}
    _gone(core.delete_namespaced_config_map, CA_CONFIGMAP, NAMESPACE)
    core.create_namespaced_config_map(NAMESPACE, body)
    port = free_port()
    plane._spawn(
        VIRT_API,
        [
            str(plane.bin_dir / VIRT_API),
            f"--kubeconfig={kubeconfig}",
            "--listen=127.0.0.1",
            f"--port={port}",
            # virt-operator's arguments; nothing reaches the console port here.
            "--console-server-port=8186",
            "--subresources-only",
            f"--ca-configmap-name={CA_CONFIGMAP}",
            f"--tls-cert-file={workdir / 'tls.crt'}",
            f"--tls-key-file={workdir / 'tls.key'}",
            f"--handler-cert-file={workdir / 'handler-tls.crt'}",
            f"--handler-key-file={workdir / 'handler-tls.key'}",
            "--v=2",
        ],
    )
    api = VirtApi(plane, port, ca)
    try:
        _await(plane, VIRT_API, api.serving, timeout, "answer its readiness probe", api.log_tail)
        api.register()
        _await(
            plane, VIRT_API, lambda: _webhooks_in_force(plane), timeout,
            "have its webhooks called by the API server", api.log_tail,
        )  # fmt: skip
    except BaseException:
        api.stop()
        raise
    return api


def _await(
    plane: ControlPlane,
    component: str,
    ready: Any,
    timeout: float,
    what: str,
    log_tail: Any,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not plane.running(component):
            raise KubeVirtError(f"{component} exited:\n{log_tail()}")
        if ready():
            return
        time.sleep(0.2)
    raise KubeVirtError(f"{component} did not {what} within {timeout:.0f} s:\n{log_tail()}")
