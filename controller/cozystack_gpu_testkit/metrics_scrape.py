"""A scraper of the controller's /metrics as Prometheus is one (HTTPS, a bearer token,
the serving certificate's CA), and as an attacker tries it (plain HTTP, no token)."""

from __future__ import annotations

import http.client
import ssl
from typing import Any


class _Connection(http.client.HTTPSConnection):
    """HTTPS to an address whose certificate names another host (a Service's DNS name
    served on 127.0.0.1): what Prometheus's ``tls_config.server_name`` does."""

    def __init__(self, host: str, port: int, server_name: str, context: ssl.SSLContext,
                 timeout: float) -> None:  # fmt: skip
        super().__init__(host, port, context=context, timeout=timeout)
        self._server_name, self._tls = server_name, context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


def scrape(
    port: int,
    token: str | None,
    ca_pem: bytes,
    *,
    host: str = "127.0.0.1",
    server_name: str | None = None,
    path: str = "/metrics",
    timeout: float = 5.0,
) -> tuple[int, str]:
    """(HTTP status, body) of a GET over HTTPS, the server's certificate checked."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    connection = _Connection(host, port, server_name or host, context, timeout)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    finally:
        connection.close()


def scrape_plain(port: int, host: str = "127.0.0.1", timeout: float = 5.0) -> Any:
    """A plain-HTTP GET without a token: (status, body) when something answered, else the
    error that ended it (what ``curl http://...`` from a tenant's pod would see)."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        return answer.status, answer.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as exc:
        return exc
    finally:
        connection.close()
