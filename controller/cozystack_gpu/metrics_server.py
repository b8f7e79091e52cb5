"""/metrics over HTTPS, to authenticated and authorized clients only (SPEC.md §7).

Every request's bearer token goes to the API server (TokenReview), and its owner must be
allowed ``get`` on the non-resource URL ``/metrics`` (SubjectAccessReview); the rule and
its cache are ``metrics_access``. Plain HTTP is not served: a connection that does not
start with a TLS handshake is closed.

The key pair is the replica's serving certificate (``tls.crt``, ``tls.key`` in the
webhooks' certificate directory, a cert-manager Secret's layout), compared every
``file_check_interval`` seconds and loaded again when it changes, so a rotation needs no
restart. Until the files exist every connection is closed: the metrics wait with the
webhooks for the Secret, they are never served without TLS.
"""

from __future__ import annotations

import datetime
import logging
import ssl
import threading
import time
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from socket import socket
from typing import Any
from urllib.parse import urlsplit

import urllib3
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

from cozystack_gpu.metrics_access import (
    METRICS_PATH,
    Decision,
    MetricsAccess,
    authenticated,
    authorized,
    review_failed,
    subject_access_review,
)

log = logging.getLogger(__name__)

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
FILE_CHECK_INTERVAL_S = 10.0
# A client that opens a connection and says nothing holds a thread only this long.
HANDSHAKE_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 30.0
# Below Prometheus's scrape timeout: a slow API server fails a scrape, it does not pile up.
REVIEW_TIMEOUT_S = 5.0


class ServingCertificate:
    """The TLS context of the key pair in ``cert_dir``, loaded again when the files change;
    None while they are missing or unreadable."""

    def __init__(
        self,
        cert_dir: str | Path,
        file_check_interval: float = FILE_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cert_dir = Path(cert_dir)
        self.file_check_interval, self.clock = file_check_interval, clock
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._seen: tuple[int, ...] | None = None
        self._checked = -file_check_interval
        self._told = False

    def _stamp(self) -> tuple[int, ...] | None:
        try:
            stats = [(self.cert_dir / name).stat() for name in (CERT_FILE, KEY_FILE)]
        except OSError:
            return None
        return tuple(n for s in stats for n in (s.st_mtime_ns, s.st_size, s.st_ino))

    def context(self) -> ssl.SSLContext | None:
        with self._lock:
            now = self.clock()
            if now - self._checked >= self.file_check_interval:
                self._checked = now
                self._reload()
            return self._context

    def _reload(self) -> None:
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            if stamp is None and not self._told:
                self._told = True
                log.warning(
                    "/metrics waits for %s and %s in %s", CERT_FILE, KEY_FILE, self.cert_dir
                )
            return
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(self.cert_dir / CERT_FILE), str(self.cert_dir / KEY_FILE))
        except (OSError, ssl.SSLError) as exc:
            # Half-written during a rotation: the old pair serves until the next check.
            log.warning("/metrics keeps its key pair: %s in %s: %s", CERT_FILE, self.cert_dir, exc)
            return
        log.info("/metrics serves the key pair of %s", self.cert_dir)
        self._context, self._seen, self._told = context, stamp, False


def self_signed(cert_dir: str | Path, common_name: str, days: int = 3650) -> Path:
    """A key pair of its own in ``cert_dir`` for a server nobody issued one to (the node
    agent): the scraper skips verifying it, but the token still travels encrypted and is
    reviewed like any other. Returns the directory."""
    directory = Path(cert_dir)
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(common_name)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_path = directory / KEY_FILE
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_path.chmod(0o600)
    (directory / CERT_FILE).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        certificate: ServingCertificate,
        access: MetricsAccess,
        registry: CollectorRegistry,
    ) -> None:
        self.certificate, self.access, self.registry = certificate, access, registry
        super().__init__(address, _Handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The TLS handshake in the request's thread (a slow client holds up no other);
        a connection that is not TLS, or comes before the key pair, is closed."""
        context = self.certificate.context()
        if context is None:
            return
        raw: socket = request
        raw.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            tls = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            log.debug("/metrics: no TLS handshake from %s: %s", client_address, exc)
            return
        try:
            tls.settimeout(REQUEST_TIMEOUT_S)
            _Handler(tls, client_address, self)
        finally:
            tls.close()


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if urlsplit(self.path).path != METRICS_PATH:
            self._reply(404, b"not found\n", "text/plain; charset=utf-8")
            return
        decision = self.server.access.check(self.headers.get("Authorization"))
        if not decision.allowed:
            phrase = HTTPStatus(decision.status).phrase
            body = f"{phrase}: {decision.reason}\n".encode()
            self._reply(decision.status, body, "text/plain; charset=utf-8")
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept") or "")
        self._reply(200, encoder(self.server.registry), content_type)

    def _reply(self, code: int, body: bytes, content_type: str) -> None:
        self.send_response(code)
        if code == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="cozystack-gpu metrics"')
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("/metrics: " + format, *args)


class TokenReviewer:
    """The API server's answer for a token: TokenReview, then SubjectAccessReview for
    ``get`` on ``/metrics``. A failed call is refused (503) and asked again next time."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.authentication = client.AuthenticationV1Api(api)
        self.authorization = client.AuthorizationV1Api(api)

    def __call__(self, token: str) -> Decision:
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        try:
            review = self.authentication.create_token_review(
                body, _request_timeout=REVIEW_TIMEOUT_S
            )
            status = self.api.sanitize_for_serialization(review.status) or {}
            refused = authenticated(status)
            if refused is not None:
                return refused
            user = status["user"]
            access = self.authorization.create_subject_access_review(
                subject_access_review(user, METRICS_PATH, "get"),
                _request_timeout=REVIEW_TIMEOUT_S,
            )
            allowed = self.api.sanitize_for_serialization(access.status) or {}
        except ApiException as exc:
            log.warning("/metrics: a review failed: %s %s", exc.status, exc.reason)
            return review_failed(f"{exc.status} {exc.reason}")
        except (OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("/metrics: a review failed: %s", exc)
            return review_failed(str(exc))
        return authorized(user, allowed, METRICS_PATH, "get")


class MetricsServer:
    """Listens on ``addr:port`` from construction; ``stop`` ends it."""

    def __init__(
        self,
        api: client.ApiClient | None,
        cert_dir: str | Path,
        port: int,
        *,
        addr: str = "0.0.0.0",
        registry: CollectorRegistry = REGISTRY,
        file_check_interval: float = FILE_CHECK_INTERVAL_S,
        reviewer: Callable[[str], Decision] | None = None,
    ) -> None:
        """``reviewer`` stands in for the API server's reviews (tests)."""
        certificate = ServingCertificate(cert_dir, file_check_interval)
        if reviewer is None:
            if api is None:
                raise ValueError("the metrics server needs an API client to review tokens")
            reviewer = TokenReviewer(api)
        access = MetricsAccess(reviewer, time.monotonic)
        self._server = _Server((addr, port), certificate, access, registry)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-https", daemon=True
        )
        self._thread.start()
        log.info("/metrics listens on %s:%s (HTTPS, bearer tokens)", addr, self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
