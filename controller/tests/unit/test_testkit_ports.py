"""The test kit's ports stay out of the kernel's way: a replica restarted on its old port
once failed with EADDRINUSE because an outgoing connection had been given that port."""

from __future__ import annotations

import socket

import pytest

from cozystack_gpu_testkit import ports


def test_ports_come_from_outside_the_ephemeral_range() -> None:
    low, high = ports.ephemeral_range()
    picked = [ports.free_port() for _pick in range(50)]
    assert all(not low <= port <= high for port in picked), picked


def test_a_port_is_never_handed_out_twice_by_one_process() -> None:
    picked = [ports.free_port() for _pick in range(200)]
    assert len(set(picked)) == len(picked)


def test_a_picked_port_can_be_listened_on_every_address() -> None:
    port = ports.free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("0.0.0.0", port))
        server.listen()
        assert server.getsockname()[1] == port


def test_a_port_held_on_one_address_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    # The replica listens on 0.0.0.0: a port some socket holds on 127.0.0.1 is taken.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        taken = holder.getsockname()[1]
        other = ports.free_port()
        monkeypatch.setattr(ports.random, "sample", lambda span, k: [taken, other + 1, other])
        ports._given.discard(other)
        got = ports.free_port()
    assert got != taken
    assert got in (other, other + 1)
