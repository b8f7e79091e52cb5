"""What etcd and kube-apiserver are started with (``cluster.start``): the plane's
certificates (its CA, the API server's serving pair, the admin client pair, the
service-account keys, the front proxy's CA and client pair), the admin kubeconfig, the
webhook client authentication and the audit policy when asked, and each process's
arguments."""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from cozystack_gpu_testkit.pki import CertificateAuthority, KeyPair, service_account_keys

# The user name of the admin identity every kubeconfig of the kit carries (system:masters).
ADMIN_USER = "cozystack-gpu-admin"
SERVICE_CIDR = "10.96.0.0/12"
# The common name of the API server's front-proxy client certificate (kubeadm's).
FRONT_PROXY_CLIENT = "front-proxy-client"
# The client certificate kube-apiserver presents to the admission webhooks it calls.
WEBHOOK_CLIENT = "kube-apiserver-webhook-client"
# The client certificate kube-apiserver presents to kubelets.
KUBELET_CLIENT = "kube-apiserver-kubelet-client"


def certificates(pki: Path) -> tuple[CertificateAuthority, KeyPair]:
    """The plane's CA (``ca.crt``), the API server's serving pair, the admin client pair
    (``ADMIN_USER``, system:masters; returned with the CA), the service-account keys, and
    the front proxy's CA and client pair, as kubeadm sets them up: the API server publishes
    the CA and the header names in kube-system/extension-apiserver-authentication, which
    extension API servers read at start (KubeVirt's virt-api refuses to start without the
    CA) and with which they trust the users it forwards."""
    ca = CertificateAuthority()
    # The key stays beside the certificate (0600, in the plane's own work directory): the real
    # node (``node``) issues its kubelet's client certificate from it, as kubeadm's CA does.
    ca.write(pki / "ca.crt", pki / "ca.key")
    ca.issue(
        "kube-apiserver",
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        ip_addresses=("127.0.0.1", "10.96.0.1"),
        server=True,
    ).write(pki / "apiserver.crt", pki / "apiserver.key")
    admin = ca.issue(ADMIN_USER, organization="system:masters", client=True)
    admin.write(pki / "admin.crt", pki / "admin.key")
    # What kube-apiserver presents to a kubelet (logs, exec, port-forward on the real node,
    # ``node``), as kubeadm's apiserver-kubelet-client.
    ca.issue(KUBELET_CLIENT, organization="system:masters", client=True).write(
        pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key"
    )
    service_account_keys().write(pki / "sa.pub", pki / "sa.key")
    front_proxy = CertificateAuthority("front-proxy-ca")
    (pki / "front-proxy-ca.crt").write_bytes(front_proxy.cert_pem)
    front_proxy.issue(FRONT_PROXY_CLIENT, client=True).write(
        pki / "front-proxy-client.crt", pki / "front-proxy-client.key"
    )
    return ca, admin


def webhook_client_auth(pki: Path, wanted: bool) -> tuple[Path | None, tuple[str, ...]]:
    """When ``wanted``, a CA that signs nothing else, as a hoster's should be, and the client
    pair it signs for kube-apiserver to present to every webhook: the CA's file, and the API
    server's arguments for it (None and none when not wanted)."""
    if not wanted:
        return None, ()
    callers = CertificateAuthority("webhook-client-ca")
    webhook_client_ca = pki / "webhook-client-ca.crt"
    webhook_client_ca.write_bytes(callers.cert_pem)
    callers.issue(WEBHOOK_CLIENT, client=True).write(
        pki / "webhook-client.crt", pki / "webhook-client.key"
    )
    return webhook_client_ca, (f"--admission-control-config-file={_webhook_client_config(pki)}",)


def audit(workdir: Path, audit: Sequence[Mapping[str, Any]]) -> tuple[Path | None, tuple[str, ...]]:
    """The audit policy of ``audit``'s rules (nothing else logged, every stage after
    RequestReceived): the log's path, and the API server's arguments for it (None and none
    without rules)."""
    if not audit:
        return None, ()
    policy = workdir / "audit-policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "audit.k8s.io/v1",
                "kind": "Policy",
                "omitStages": ["RequestReceived"],
                "rules": [*audit, {"level": "None"}],
            }
        )
    )
    audit_log = workdir / "audit.log"
    return audit_log, (f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}")


def etcd_args(bin_dir: Path, workdir: Path, client_port: int, peer_port: int) -> list[str]:
    return [
        str(bin_dir / "etcd"),
        "--name=default",
        f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{client_port}",
        f"--advertise-client-urls=http://127.0.0.1:{client_port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=default=http://127.0.0.1:{peer_port}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def apiserver_args(bin_dir: Path, pki: Path, etcd_client: int, secure_port: int) -> list[str]:
    """kube-apiserver's serving, storage, authentication and front-proxy arguments (what
    ``cluster.start`` adds after them depends on its options)."""
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{etcd_client}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={secure_port}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        # A real node's Hostname address is its name, which no resolver here knows.
        "--kubelet-preferred-address-types=InternalIP",
    ]


def apiserver_policy_args(controller_manager: bool) -> list[str]:
    """kube-apiserver's authorization and admission, and what it leaves out here."""
    return [
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        # Without the controller-manager nobody creates default service accounts, so the
        # ServiceAccount admission plugin would refuse every pod the tests create.
        *(() if controller_manager else ("--disable-admission-plugins=ServiceAccount",)),
        # The endpoint reconciler refuses a loopback advertise address; nothing here needs
        # the kubernetes Service's endpoints.
        "--endpoint-reconciler-type=none",
        "--profiling=false",
        "--v=0",
    ]


def kubeconfig(server: str, ca: bytes, cert: bytes, key: bytes) -> dict[str, Any]:
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "cozystack-gpu-local",
                "cluster": {"server": server, "certificate-authority-data": b64(ca)},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)},
            }
        ],
        "contexts": [
            {
                "name": "cozystack-gpu-local",
                "context": {"cluster": "cozystack-gpu-local", "user": "admin"},
            }
        ],
        "current-context": "cozystack-gpu-local",
    }


def _webhook_client_config(pki: Path) -> Path:
    """kube-apiserver's AdmissionConfiguration: both webhook plugins present the client
    certificate in ``pki`` to every webhook (the kubeconfig's user ``*``)."""
    users = {
        "apiVersion": "v1",
        "kind": "Config",
        "users": [
            {
                "name": "*",
                "user": {
                    "client-certificate": str(pki / "webhook-client.crt"),
                    "client-key": str(pki / "webhook-client.key"),
                },
            }
        ],
    }
    (pki / "webhook-kubeconfig").write_text(yaml.safe_dump(users))
    webhooks = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(pki / "webhook-kubeconfig"),
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": plugin, "configuration": webhooks}
            for plugin in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }
    path = pki / "admission-config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path
