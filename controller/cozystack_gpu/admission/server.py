"""The HTTPS server of the admission webhooks: kopf's, with certificate files.

The files are a cert-manager Secret's layout (``tls.crt``, ``tls.key``, ``ca.crt``) in
``--webhook-cert-dir``. kopf's ``WebhookServer`` re-reads them when they change and
restarts its listener with the new pair, so a rotation needs no restart of the replica.

The VMI webhook writes attachments, so a forged review is not harmless: anything that
reaches the port (a guest on the pod network) could attach another tenant's claim to a
VMI that never exists, until the attachment grace clears it. With ``client_ca`` (the CA of
the client certificate kube-apiserver presents to webhooks, from its
``--admission-control-config-file``), a caller without such a certificate is refused at the
TLS handshake, before any handler runs.
It does not wait for them: a replica whose Secret is not there yet would stop at once, so
this server waits until the key pair exists, saying so in the log. The chart renders the
webhook configurations; kopf does not manage them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import kopf

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
CA_FILE = "ca.crt"
# How often the files are compared for a rotation, and looked for while missing.
FILE_CHECK_INTERVAL_S = 10.0
WAIT_LOG_EVERY_S = 60.0


class CertDirWebhookServer(kopf.WebhookServer):
    """kopf's webhook server on ``addr:port`` with the key pair from ``cert_dir``."""

    def __init__(
        self,
        cert_dir: str | Path,
        port: int,
        *,
        addr: str = "0.0.0.0",
        file_check_interval: float = FILE_CHECK_INTERVAL_S,
        client_ca: str | Path | None = None,
        listening: threading.Event | None = None,
    ) -> None:
        # Set once the port answers: the replica's readiness waits for it (a replica in the
        # webhook Service whose port is closed refuses kube-apiserver's calls).
        self.listening = listening if listening is not None else threading.Event()
        self.cert_dir = Path(cert_dir)
        self.client_ca = Path(client_ca) if client_ca else None
        ca = self.cert_dir / CA_FILE
        super().__init__(
            addr=addr,
            port=port,
            certfile=str(self.cert_dir / CERT_FILE),
            pkeyfile=str(self.cert_dir / KEY_FILE),
            # The CA only shapes the client config kopf would publish; without it kopf
            # would offer the serving certificate itself.
            cafile=str(ca) if ca.exists() else None,
            file_check_interval=file_check_interval,
            verify_mode=ssl.CERT_REQUIRED if client_ca else None,
            verify_cafile=str(client_ca) if client_ca else None,
        )

    def _ready(self) -> bool:
        return (
            (self.cert_dir / CERT_FILE).is_file()
            and (self.cert_dir / KEY_FILE).is_file()
            and (self.client_ca is None or self.client_ca.is_file())
        )

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        told = -WAIT_LOG_EVERY_S
        while not self._ready():
            if time.monotonic() - told >= WAIT_LOG_EVERY_S:
                told = time.monotonic()
                log.warning(
                    "admission webhooks wait for %s and %s in %s%s",
                    CERT_FILE,
                    KEY_FILE,
                    self.cert_dir,
                    f" and the client CA {self.client_ca}" if self.client_ca else "",
                )
            await asyncio.sleep(self.file_check_interval)
        if self.cafile is None and (self.cert_dir / CA_FILE).exists():
            self.cafile = str(self.cert_dir / CA_FILE)
        log.info(
            "admission webhooks listen on %s:%s (%s)",
            self.addr,
            self.port,
            f"callers need a client certificate of {self.client_ca}"
            if self.client_ca
            else "any caller",
        )
        async for client_config in super().__call__(fn):
            # kopf yields once its site has started: the port answers from here on.
            self.listening.set()
            yield client_config


class NoWebhookServer:
    """``--webhook-port 0``: kopf insists on a server once admission handlers exist, so
    this one serves nothing and waits forever."""

    async def __call__(self, fn: kopf.WebhookFn) -> AsyncIterator[kopf.WebhookClientConfig]:
        await asyncio.Event().wait()
        # Unreachable; makes this an async generator, as kopf expects.
        yield kopf.WebhookClientConfig()  # pragma: no cover
