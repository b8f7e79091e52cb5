"""The webhook server takes its key pair from the certificate directory, waits for it, and
serves a rotated pair without a restart (what cert-manager does to the mounted Secret);
with a client CA it answers only callers holding a certificate of that CA (the API
server's), never a guest that reaches its port."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from cozystack_gpu.admission.server import CertDirWebhookServer
from cozystack_gpu_testkit.pki import CertificateAuthority
from cozystack_gpu_testkit.ports import free_port


def _issue(ca: CertificateAuthority, cert_dir: Path) -> int:
    """Write a fresh serving pair for 127.0.0.1 and return its serial number."""
    pair = ca.issue("webhook", ip_addresses=("127.0.0.1",), server=True)
    pair.write(cert_dir / "tls.crt", cert_dir / "tls.key")
    (cert_dir / "ca.crt").write_bytes(ca.cert_pem)
    return x509.load_pem_x509_certificate(pair.cert_pem).serial_number


def _call(
    port: int, ca_pem: bytes, client_pair: tuple[Path, Path] | None = None
) -> tuple[int, dict[str, Any]]:
    """POST one review over TLS (with a client certificate when given); the serial of the
    served certificate and the answer."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    if client_pair is not None:
        context.load_cert_chain(*client_pair)
    body = json.dumps({"request": {"uid": "u"}}).encode()
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        tls.sendall(
            b"POST /mutate-vmi HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := tls.recv(65536):
            data += chunk
    answer = json.loads(data.split(b"\r\n\r\n", 1)[1])
    return x509.load_der_x509_certificate(der).serial_number, answer


async def _serial_when(port: int, ca: bytes, wanted: int, timeout: float = 10.0) -> int:
    deadline = asyncio.get_running_loop().time() + timeout
    last = -1
    while asyncio.get_running_loop().time() < deadline:
        try:
            last, _answer = await asyncio.to_thread(_call, port, ca)
        except OSError:
            last = -1
        if last == wanted:
            return last
        await asyncio.sleep(0.05)
    return last


async def _serve(server: CertDirWebhookServer) -> AsyncIterator[None]:
    async def fn(request: Any, **kwargs: Any) -> dict[str, Any]:
        return {"response": {"uid": request["request"]["uid"], "allowed": True}, **kwargs}

    async with server:
        async for _config in server(fn):
            yield None


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority()


async def test_a_rotated_key_pair_is_served_without_a_restart(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    first = _issue(ca, tmp_path)
    port = free_port()
    server = CertDirWebhookServer(tmp_path, port, addr="127.0.0.1", file_check_interval=0.1)
    task = asyncio.create_task(_drain(_serve(server)))
    try:
        assert await _serial_when(port, ca.cert_pem, first) == first
        served, answer = await asyncio.to_thread(_call, port, ca.cert_pem)
        assert served == first
        assert answer["response"] == {"uid": "u", "allowed": True}
        assert answer["webhook"] == "mutate-vmi"  # the path names the handler
        second = _issue(ca, tmp_path)
        assert await _serial_when(port, ca.cert_pem, second) == second
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_server_waits_for_its_key_pair(tmp_path: Path, ca: CertificateAuthority) -> None:
    port = free_port()
    server = CertDirWebhookServer(tmp_path, port, addr="127.0.0.1", file_check_interval=0.1)
    task = asyncio.create_task(_drain(_serve(server)))
    try:
        await asyncio.sleep(0.3)
        assert not task.done(), "the server gave up while its certificate was missing"
        with pytest.raises(OSError):
            await asyncio.to_thread(_call, port, ca.cert_pem)
        serial = _issue(ca, tmp_path)
        assert await _serial_when(port, ca.cert_pem, serial) == serial
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_the_server_says_it_listens_only_once_its_port_answers(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """The replica's readiness waits for this: a replica in the webhook Service whose port
    is not open yet is a refused order (``connection refused``, seen in a rolling upgrade)."""
    port = free_port()
    server = CertDirWebhookServer(tmp_path, port, addr="127.0.0.1", file_check_interval=0.1)
    task = asyncio.create_task(_drain(_serve(server)))
    try:
        await asyncio.sleep(0.3)
        assert not server.listening.is_set(), "listening without its key pair"
        _issue(ca, tmp_path)
        assert await asyncio.to_thread(server.listening.wait, 10)
        # Said only once a caller is answered: no retry needed.
        _served, answer = await asyncio.to_thread(_call, port, ca.cert_pem)
        assert answer["response"]["allowed"] is True
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def _drain(events: AsyncIterator[None]) -> None:
    async for _config in events:
        pass


async def test_with_a_client_ca_only_the_api_servers_certificate_gets_an_answer(
    tmp_path: Path, ca: CertificateAuthority
) -> None:
    """A forged review from a caller without the API server's client certificate (a guest
    on the pod network) is refused at the handshake; one with a certificate of another CA
    too; the API server's gets its answer."""
    _issue(ca, tmp_path)
    callers = CertificateAuthority("webhook-callers")
    (tmp_path / "client-ca.crt").write_bytes(callers.cert_pem)
    apiserver = callers.issue("kube-apiserver-webhook-client", client=True)
    apiserver.write(tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    CertificateAuthority("elsewhere").issue("guest", client=True).write(
        tmp_path / "guest.crt", tmp_path / "guest.key"
    )
    port = free_port()
    server = CertDirWebhookServer(
        tmp_path,
        port,
        addr="127.0.0.1",
        file_check_interval=0.1,
        client_ca=tmp_path / "client-ca.crt",
    )
    task = asyncio.create_task(_drain(_serve(server)))
    pair = (tmp_path / "apiserver.crt", tmp_path / "apiserver.key")
    try:
        deadline = asyncio.get_running_loop().time() + 10
        while True:
            try:
                _serial, answer = await asyncio.to_thread(_call, port, ca.cert_pem, pair)
                break
            except OSError:
                assert asyncio.get_running_loop().time() < deadline, "the server never answered"
                await asyncio.sleep(0.05)
        assert answer["response"] == {"uid": "u", "allowed": True}
        for forged in (None, (tmp_path / "guest.crt", tmp_path / "guest.key")):
            with pytest.raises((ssl.SSLError, ConnectionError, json.JSONDecodeError, IndexError)):
                taken = await asyncio.to_thread(_call, port, ca.cert_pem, forged)
                raise AssertionError(f"a caller with {forged} got an answer: {taken}")
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
