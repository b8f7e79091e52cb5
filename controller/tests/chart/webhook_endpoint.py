"""Making the chart's webhook Service answer on the local control plane.

There is no kubelet or kube-proxy here, so no controller pod backs the Service. Started with
``--enable-aggregator-routing=true``, kube-apiserver calls a webhook Service at one of its
EndpointSlice addresses instead of its cluster IP; :func:`route_service` writes that slice by
hand, pointing at a process on this machine. The API server still checks the serving
certificate against the Service's DNS name and the configuration's caBundle, so the chart's
certificates are exercised as in a cluster.

The process can be anything that serves the webhook paths with the chart's certificate:
:class:`AdmissionRecorder` (answers "allowed" and records every call, which proves the
chart's rules and selectors send the right requests to the right paths), or the controller
itself (``python -m cozystack_gpu --webhook-port PORT --webhook-cert-dir DIR`` with
:func:`write_cert_dir`'s directory).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


def route_service(api: Any, namespace: str, service: str, address: str, port: int) -> None:
    """Points ``service`` (its port named https) at ``address:port``, replacing any earlier
    hand-made slice."""
    discovery = client.DiscoveryV1Api(api)
    name = f"{service}-local"
    body = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
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


@dataclass(frozen=True)
class Call:
    path: str
    kind: str
    operation: str
    name: str
    namespace: str
    dry_run: bool


@dataclass
class AdmissionRecorder:
    """An HTTPS server answering every AdmissionReview with "allowed", recording the calls."""

    cert_dir: Path
    host: str = "0.0.0.0"
    calls: list[Call] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> AdmissionRecorder:
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                obj = request.get("object") or request.get("oldObject") or {}
                recorder.calls.append(
                    Call(
                        path=self.path.split("?")[0],
                        kind=request["kind"]["kind"],
                        operation=request["operation"],
                        name=obj.get("metadata", {}).get("name", request.get("name", "")),
                        namespace=request.get("namespace") or "",
                        dry_run=bool(request.get("dryRun")),
                    )
                )
                answer = {
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {"uid": request["uid"], "allowed": True},
                }
                body = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer((self.host, 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        server.socket = context.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def calls_to(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]
