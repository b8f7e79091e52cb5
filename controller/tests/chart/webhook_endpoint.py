"""Making the chart's webhook Service answer on the local control plane.

The Service is routed to a local process by the test kit's :mod:`webhook_route` (how, and why
it needs ``--enable-aggregator-routing=true``, is said there).

The process can be anything that serves the webhook paths with the chart's certificate:
:class:`AdmissionRecorder` (answers "allowed" and records every call, which proves the
chart's rules and selectors send the right requests to the right paths), or the controller
itself (``python -m cozystack_gpu --webhook-port PORT --webhook-cert-dir DIR`` with
:func:`write_cert_dir`'s directory).
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cozystack_gpu_testkit.webhook_route import host_address, route_service, write_cert_dir

__all__ = ["AdmissionRecorder", "Call", "host_address", "route_service", "write_cert_dir"]


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
