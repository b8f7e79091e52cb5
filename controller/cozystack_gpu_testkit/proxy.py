"""A TCP proxy on loopback between a client and the API server (or any server), to make the
network between them slow, partitioned or broken, without touching either end.

It forwards bytes, not HTTP: TLS passes through untouched, so the client still checks the
server's certificate. Faults, each on every connection at once:

- ``delay`` seconds added to every chunk in each direction (a slow server or link);
- ``cut()``: nothing passes either way, and nothing is lost either: what the ends send
  waits in the proxy, as packets wait behind a partition, and ``heal()`` delivers it in
  order. A client that gave up meanwhile still has its request delivered (a late write);
- ``reset()``: every connection is closed at once (a network blip); new ones work.

``source`` binds the proxy's connections to the server to one loopback address
(127.0.0.0/8 all reaches this host), so the server's audit log tells clients apart.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

CHUNK = 65536


class _Pipe:
    """One direction of one connection: a reader stamps chunks, a writer delivers them."""

    def __init__(self, proxy: Proxy, src: socket.socket, dst: socket.socket, name: str) -> None:
        self.proxy = proxy
        self.src, self.dst = src, dst
        self._chunks: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self._ready = threading.Condition()
        self.closed = False
        self._threads = [
            threading.Thread(target=self._read, name=f"{name}-read", daemon=True),
            threading.Thread(target=self._write, name=f"{name}-write", daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def wake(self) -> None:
        with self._ready:
            self._ready.notify_all()

    def _read(self) -> None:
        while True:
            try:
                data = self.src.recv(CHUNK)
            except OSError:
                data = b""
            with self._ready:
                self._chunks.append((time.monotonic(), data or None))
                self._ready.notify_all()
            if not data:
                return

    def _write(self) -> None:
        while True:
            with self._ready:
                while True:
                    if self.closed:
                        return
                    wait = self._due_in()
                    if wait is not None and wait <= 0:
                        _stamp, data = self._chunks.popleft()
                        break
                    # Woken by a new chunk, heal(), a new delay or close().
                    self._ready.wait(wait)
            if data is None:
                with contextlib.suppress(OSError):
                    self.dst.shutdown(socket.SHUT_WR)
                return
            try:
                self.dst.sendall(data)
            except OSError:
                return  # the far end is gone; its own pipe ends the connection
            self.proxy.forwarded += len(data)

    def _due_in(self) -> float | None:
        """Seconds until the oldest chunk may go; None while nothing may go."""
        if not self._chunks or self.proxy.is_cut:
            return None
        stamp, _data = self._chunks[0]
        return stamp + self.proxy.delay - time.monotonic()

    def held(self) -> int:
        with self._ready:
            return sum(len(data or b"") for _stamp, data in self._chunks)

    def close(self) -> None:
        with self._ready:
            self.closed = True
            self._ready.notify_all()

    def done(self) -> bool:
        return not any(thread.is_alive() for thread in self._threads)


class Proxy:
    """Listens on 127.0.0.1:``port`` and forwards each connection to ``target``."""

    def __init__(
        self,
        target: tuple[str, int],
        *,
        source: str | None = None,
        port: int = 0,
        name: str = "proxy",
    ) -> None:
        self.target = target
        self.source = source
        self.name = name
        self.delay = 0.0
        self.is_cut = False
        self.forwarded = 0  # bytes delivered, both directions
        self.connections = 0
        self._pipes: list[tuple[socket.socket, socket.socket, _Pipe, _Pipe]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.port = int(self._listener.getsockname()[1])
        self._stopped = False
        self._thread = threading.Thread(target=self._accept, name=f"{name}-accept", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped:
            try:
                downstream, _peer = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(
                    self.target, timeout=5, source_address=(self.source, 0) if self.source else None
                )
            except OSError:
                downstream.close()  # the server is down: so is the connection
                continue
            upstream.settimeout(None)
            for sock in (downstream, upstream):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self.connections += 1
                n = self.connections
                up = _Pipe(self, downstream, upstream, f"{self.name}-{n}-up")
                down = _Pipe(self, upstream, downstream, f"{self.name}-{n}-down")
                up.start()
                down.start()
                self._pipes = [p for p in self._pipes if not (p[2].done() and p[3].done())]
                self._pipes.append((downstream, upstream, up, down))

    # --- faults ------------------------------------------------------------------------

    def cut(self) -> None:
        """Hold every byte from now on, in both directions, on every connection."""
        self.is_cut = True

    def heal(self) -> int:
        """Deliver what was held, in order, and pass everything again; returns the bytes
        that were held."""
        held = self.held()
        self.is_cut = False
        self._wake()
        return held

    def held(self) -> int:
        """Bytes waiting in the proxy, both directions (cut, or not yet due)."""
        with self._lock:
            pipes = [pipe for entry in self._pipes for pipe in entry[2:]]
        return sum(pipe.held() for pipe in pipes)

    def requests_waiting(self) -> int:
        """Bytes from the client not yet delivered to the server: under a ``delay``,
        requests on their way; after ``cut()``, requests that will arrive late."""
        with self._lock:
            pipes = [entry[2] for entry in self._pipes]
        return sum(pipe.held() for pipe in pipes)

    def reset(self) -> int:
        """Close every open connection at once; returns how many there were."""
        with self._lock:
            pipes, self._pipes = self._pipes, []
        for downstream, upstream, up, down in pipes:
            up.close()
            down.close()
            for sock in (downstream, upstream):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
        return len(pipes)

    @contextmanager
    def slowed(self, delay: float) -> Iterator[Proxy]:
        before, self.delay = self.delay, delay
        try:
            yield self
        finally:
            self.delay = before
            self._wake()

    def _wake(self) -> None:
        with self._lock:
            pipes = [pipe for entry in self._pipes for pipe in entry[2:]]
        for pipe in pipes:
            pipe.wake()

    def stop(self) -> None:
        """Refuse new connections (the port is closed) and close every open one."""
        self._stopped = True
        # close() alone does not wake an accept() blocked in another thread, and the socket
        # would go on accepting; shutdown() does.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()
        self._thread.join(5)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
