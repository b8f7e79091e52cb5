"""The readiness endpoint: ``GET /readyz`` answers 200 only once this replica can judge.

Ready means synced and listening: a replica joins the webhook Service (kubelet's readiness
probe) only after its admission feed has read the cluster once and its webhook server's port
answers (kube-apiserver calls each replica at its address: a replica in the Service whose
port is closed refuses orders). Liveness stays kopf's ``/healthz`` (a part of the replica
died); the two differ on purpose, since a replica that is still listing is alive and must
not be restarted, only kept out of the Service. kopf serves one
path per health server, so this is a small server of its own on ``--ready-port``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

PATH = "/readyz"


class ReadinessServer:
    """``GET /readyz``: 200 ``ok`` while ``not_ready()`` is None, else 503 with its reason."""

    def __init__(
        self, port: int, not_ready: Callable[[], str | None], addr: str = "0.0.0.0"
    ) -> None:
        answer = not_ready

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != PATH:
                    self._reply(404, f"only {PATH} is served here\n")
                    return
                try:
                    reason = answer()
                except Exception as exc:  # an answer that cannot be computed is not ready
                    reason = f"readiness could not be computed: {type(exc).__name__}: {exc}"
                if reason is None:
                    self._reply(200, "ok\n")
                else:
                    self._reply(503, f"not ready: {reason}\n")

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                # A probe every few seconds is not news.
                return

        self._server = ThreadingHTTPServer((addr, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="readiness", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("readiness endpoint on port %d%s", self.port, PATH)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
