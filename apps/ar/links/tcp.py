"""Frames over raw TCP: one connection per hop, fixed-size messages.

Every message is ``config.message_size`` bytes (an end message too), so a receiver reads
exactly that many into a buffer it reuses and needs no framing. Detectors listen for the
extractor; the combinator listens for the detectors, each of which first says its index.
Each listens on its host's address (loopback when every role runs on one host).

The combinator reads frame ``seq`` from detector ``seq % N``'s connection: each detector
sends its frames in order, so the stream is ordered without a buffer. A detector answers each
frame it has passed on with a one-byte credit, and the extractor sends a detector no more
than ``depth`` frames ahead of its credits: otherwise the kernel's socket buffers (megabytes
on loopback) would let it run frames ahead, and every frame would wait in them. Receivers
``recv_into`` the buffer they hand out: nothing is copied in user space.
"""

from __future__ import annotations

import socket
import struct

from apps.ar.config import RunConfig
from apps.ar.links import Backend, Peers

__all__ = ["BACKEND"]

_INDEX = struct.Struct("!I")
_CREDIT = b"+"


def _listen(address: str) -> socket.socket:
    return socket.create_server((address, 0))


def _address(server: socket.socket) -> str:
    host, port = server.getsockname()[:2]
    return f"{host}:{port}"


def _connect(address: str, timeout: float) -> socket.socket:
    host, port = address.rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _accept(server: socket.socket, timeout: float) -> socket.socket:
    server.settimeout(timeout)
    conn, _ = server.accept()
    conn.settimeout(timeout)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _recv_exact(conn: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = conn.recv_into(view[got:])
        if not n:
            raise ConnectionError("the sender closed the connection mid-stream")
        got += n


class _Extractor:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.address = ""
        self._buffer = memoryview(bytearray(config.message_size))
        self._conns: list[socket.socket] = []
        self._ahead = [0] * config.detectors

    def connect(self, peers: Peers) -> None:
        self._conns = [_connect(a, self.config.timeout_s) for a in peers.detectors]

    def slot(self, seq: int) -> memoryview:
        return self._buffer  # sendall returns once the kernel has every byte: reuse at once

    def send(self, seq: int) -> None:
        k = self.config.detector_of(seq)
        if self._ahead[k] == self.config.depth:
            self._credit(k)
        self._conns[k].sendall(self._buffer)
        self._ahead[k] += 1

    def _credit(self, k: int) -> None:
        if not self._conns[k].recv(1):
            raise ConnectionError(f"detector {k} closed its connection")
        self._ahead[k] -= 1

    def close(self) -> None:
        """Wait until every detector has passed on all it got (the end message last)."""
        try:
            for k in range(len(self._conns)):
                while self._ahead[k]:
                    self._credit(k)
        finally:
            for conn in self._conns:
                conn.close()


class _Detector:
    def __init__(self, config: RunConfig, index: int) -> None:
        self.config = config
        self.index = index
        self._server = _listen(config.address_for("detector", index))
        self.address = _address(self._server)
        self._buffer = memoryview(bytearray(config.message_size))
        self._inbound: socket.socket | None = None
        self._outbound: socket.socket | None = None

    def connect(self, peers: Peers) -> None:
        self._outbound = _connect(peers.combinator, self.config.timeout_s)
        self._outbound.sendall(_INDEX.pack(self.index))
        self._inbound = _accept(self._server, self.config.timeout_s)

    def receive(self) -> memoryview:
        assert self._inbound is not None
        _recv_exact(self._inbound, self._buffer)
        return self._buffer

    def forward(self) -> None:
        assert self._outbound is not None and self._inbound is not None
        self._outbound.sendall(self._buffer)
        self._inbound.sendall(_CREDIT)

    def close(self) -> None:
        for sock in (self._inbound, self._outbound, self._server):
            if sock is not None:
                sock.close()


class _Combinator:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self._server = _listen(config.address_for("combinator"))
        self.address = _address(self._server)
        self._buffer = memoryview(bytearray(config.message_size))
        self._conns: dict[int, socket.socket] = {}

    def connect(self, peers: Peers) -> None:
        while len(self._conns) < self.config.detectors:
            conn = _accept(self._server, self.config.timeout_s)
            index = bytearray(_INDEX.size)
            _recv_exact(conn, memoryview(index))
            self._conns[_INDEX.unpack(index)[0]] = conn

    def receive(self, seq: int) -> memoryview:
        _recv_exact(self._conns[self.config.detector_of(seq)], self._buffer)
        return self._buffer

    def release(self, seq: int) -> None:
        """Nothing to give back: the next receive overwrites the buffer."""

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._server.close()


BACKEND = Backend("tcp", _Extractor, _Detector, _Combinator)
