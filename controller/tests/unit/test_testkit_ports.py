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


def test_processes_side_by_side_pick_from_shares_of_their_own() -> None:
    """A soak beside a CI run: two test processes never pick the same port while each has
    room in its share (a port picked by one and not yet bound looks free to the other)."""
    span = range(10000, 32768)
    first, second = ports.own_share(span, pid=4242), ports.own_share(span, pid=4243)
    assert not set(first) & set(second)
    assert len(first) >= 500 and first.start >= span.start and first.stop <= span.stop


def test_this_process_picks_from_its_own_share_first() -> None:
    share = ports.own_share(ports.port_span())
    picked = [ports.free_port() for _pick in range(20)]
    assert all(port in share for port in picked), (share, picked)
