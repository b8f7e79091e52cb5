"""Ports for the processes the test kit starts, picked where the kernel never looks.

Binding port 0 and closing the probe hands back a port from the kernel's ephemeral range:
free now, but any outgoing connection (the load's clients, a watch) may be given it as its
local port a moment later. A server that starts again on the same port (a replica after a
SIGKILL, the API server after a restart) then fails with EADDRINUSE. So ports come from
below the ephemeral range, probed on every address, and never handed out twice by one
process.

Test processes that run side by side (a soak beside a CI run) each pick from a share of
the range of their own (by process id), first: a port one has picked but whose server has
not bound it yet is not free to the other (a replica's health port was taken that way once,
in a soak run beside a CI run). Only a full share falls back to the whole range.
"""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Above the well-known and registered ports most daemons use.
LOWEST = 10000

SHARES = 32  # of the range, one per process id modulo this

_given: set[int] = set()
_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it assigns to outgoing connections."""
    try:
        low, high = (int(part) for part in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def _bindable(port: int) -> bool:
    # 0.0.0.0 conflicts with a socket on any local address, the widest test there is.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def port_span() -> range:
    """Where the kit's ports come from: below the ephemeral range when there is room, above
    it otherwise."""
    low, high = ephemeral_range()
    return range(LOWEST, low) if low - LOWEST >= 2000 else range(high + 1, 65536)


def own_share(span: range, pid: int | None = None) -> range:
    """This process's share of ``span`` (``SHARES`` shares, by process id)."""
    size = len(span) // SHARES
    start = span.start + ((os.getpid() if pid is None else pid) % SHARES) * size
    return range(start, start + size)


def free_port() -> int:
    """A port nothing listens on, outside the ephemeral range, not given out before: from
    this process's share of the range while it has one free, else from anywhere in it."""
    span = port_span()
    with _lock:
        for where in (own_share(span), span):
            for port in random.sample(where, k=min(len(where), 500)):
                if port not in _given and _bindable(port):
                    _given.add(port)
                    return port
    raise RuntimeError(f"no free port in {span.start}-{span.stop - 1}")
