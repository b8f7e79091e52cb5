"""The /metrics server: TLS only, a reviewed bearer token only, and a rotated key pair
served without a restart. The API server's reviews are stood in for here; the integration
test (tests/integration/test_metrics_access.py) asks the real one."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from prometheus_client import CollectorRegistry, Gauge

from cozystack_gpu.metrics_access import Decision
from cozystack_gpu.metrics_server import MetricsServer
from cozystack_gpu_testkit.metrics_scrape import scrape, scrape_plain
from cozystack_gpu_testkit.objects import wait_for
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port

INVENTORY = "cozystack_gpu_node_units"


def _issue(ca: CertificateAuthority, cert_dir: Path) -> int:
    pair = ca.issue("cozystack-gpu-webhook", ip_addresses=("127.0.0.1",), server=True)
    pair.write(cert_dir / "tls.crt", cert_dir / "tls.key")
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[MetricsServer, CertificateAuthority, Path]]:
    registry = CollectorRegistry()
    Gauge(INVENTORY, "units", ["node"], registry=registry).labels("n1").set(8)
    ca = CertificateAuthority()
    _issue(ca, tmp_path)
    answers = {
        "reader": Decision(200),
        "tenant": Decision(403, "system:serviceaccount:t:default may not get /metrics"),
    }
    server = MetricsServer(
        None,
        tmp_path,
        free_port(),
        addr="127.0.0.1",
        registry=registry,
        file_check_interval=0.1,
        reviewer=lambda token: answers.get(token, Decision(401, "the bearer token is not valid")),
    )
    try:
        yield server, ca, tmp_path
    finally:
        server.stop()


def test_plain_http_gets_no_metrics(
    served: tuple[MetricsServer, CertificateAuthority, Path],
) -> None:
    server, _ca, _dir = served
    answer = scrape_plain(server.port)
    assert isinstance(answer, Exception), f"plain HTTP was answered: {answer}"


def test_only_a_reviewed_reader_gets_the_inventory(
    served: tuple[MetricsServer, CertificateAuthority, Path],
) -> None:
    server, ca, _dir = served
    for token, status in ((None, 401), ("forged", 401), ("tenant", 403)):
        code, body = scrape(server.port, token, ca.cert_pem)
        assert (code, INVENTORY in body) == (status, False), (token, code, body)
    code, body = scrape(server.port, "reader", ca.cert_pem)
    assert code == 200 and f'{INVENTORY}{{node="n1"}} 8.0' in body, body
    code, _body = scrape(server.port, "reader", ca.cert_pem, path="/other")
    assert code == 404


def test_a_rotated_key_pair_is_served_without_a_restart(
    served: tuple[MetricsServer, CertificateAuthority, Path],
) -> None:
    server, ca, cert_dir = served

    def serial() -> int:
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        with (
            socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            der = tls.getpeercert(binary_form=True)
            assert der is not None
            return x509.load_der_x509_certificate(der).serial_number

    first = serial()
    second = _issue(ca, cert_dir)
    assert second != first
    wait_for(lambda: serial() == second, 10, "the rotated certificate", interval=0.1)
