"""Making the chart's webhook Service answer on a control plane without kube-proxy.

There is no kubelet or kube-proxy on the test kit's plane, so no controller pod backs the
Service. Started with ``--enable-aggregator-routing=true``, kube-apiserver calls a webhook
Service at one of its EndpointSlice addresses instead of its cluster IP; :func:`route_service`
writes that slice by hand, pointing at a process on this machine. The API server still checks
the serving certificate against the Service's DNS name and the configuration's caBundle, so
the chart's certificates are exercised as in a cluster. The chart tests and ``make demo``
both route the Service this way.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client

SLICE_MANAGER = "cozystack-gpu-tests"


def host_address() -> str:
    """A non-loopback address of this machine: EndpointSlices refuse loopback ones."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        # No packet is sent; connect() only picks the route's source address.
        probe.connect(("10.255.255.255", 1))
        address = str(probe.getsockname()[0])
    if address.startswith("127."):
        raise RuntimeError("no non-loopback IPv4 address: EndpointSlices cannot point here")
    return address


def write_cert_dir(api: Any, namespace: str, secret: str, directory: Path) -> Path:
    """The webhook Secret's tls.crt, tls.key and ca.crt as files (the controller's layout)."""
    data = client.CoreV1Api(api).read_namespaced_secret(secret, namespace).data
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key", "ca.crt"):
        (directory / name).write_bytes(base64.b64decode(data[name]))
    return directory


def slice_name(service: str) -> str:
    """The name of the hand-made EndpointSlice :func:`route_service` writes for ``service``."""
    return f"{service}-local"


def route_service(
    api: Any,
    namespace: str,
    service: str,
    address: str,
    port: int,
    *,
    labels: Mapping[str, str] | None = None,
) -> None:
    """Points ``service`` (its port named https) at ``address:port``, replacing any earlier
    hand-made slice; ``labels`` go on the slice too."""
    discovery = client.DiscoveryV1Api(api)
    name = slice_name(service)
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
                **(labels or {}),
            },
        },
        "addressType": "IPv4",
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
    }
    try:
        discovery.delete_namespaced_endpoint_slice(name, namespace)
    except client.ApiException as exc:
        if exc.status != 404:
            raise
    discovery.create_namespaced_endpoint_slice(namespace, body)
