"""How bytes cross between hosts: the transport seam, its TCP backend and the choice of one.

A transport is small on purpose: ``connect(address)`` gives a stream to another host's
gateway, ``listen(address)`` accepts them. The gateway frames its requests on that stream
(``cdi.remote.wire``). TCP is what runs here; RDMA (``cdi.remote.rdma``) plugs in at the same
seam where a device exists.

*Why a plain TCP stream, not gRPC:* between two network namespaces on this machine a 10 KB
hand-off took ~16 us over a TCP stream and ~260 us over gRPC (unary) or ~420 us (streaming,
1 MiB messages); at 64 MB streaming gRPC came close (74 against 83 ms, a loaded machine), but
its every message is a fresh ``bytes`` on both sides, where a TCP stream is received straight
into the object's mapping (``cdiflow bench cdi --hosts 2``, docs/benchmarks.md).
"""

from __future__ import annotations

import socket
from typing import Protocol

from cdi.errors import ConfigError

__all__ = [
    "TRANSPORTS",
    "TcpTransport",
    "Transport",
    "choose_transport",
    "parse_address",
    "tune_accepted",
]

TRANSPORTS = ("auto", "tcp", "rdma")
_BUFFER = 4 << 20  # socket buffers: a 64 MB object in a few dozen windows, not hundreds


class Transport(Protocol):
    """Streams between gateways on different hosts."""

    name: str

    def connect(self, address: str, timeout: float) -> socket.socket:
        """A stream to the gateway at ``address`` (``host:port``); ``OSError`` if unreachable."""
        ...

    def listen(self, address: str) -> socket.socket:
        """A listening socket on ``address``; ``ConfigError`` if it cannot be bound."""
        ...


def parse_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) into its parts; ``ConfigError`` if malformed."""
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"transfer address {address!r} must look like host:port")
    return host, int(port)


class TcpTransport:
    """Plain TCP: Nagle off, large socket buffers, a timeout for connecting only."""

    name = "tcp"

    def connect(self, address: str, timeout: float) -> socket.socket:
        sock = socket.create_connection(parse_address(address), timeout=timeout)
        _tune(sock)
        sock.settimeout(None)
        return sock

    def listen(self, address: str) -> socket.socket:
        host, port = parse_address(address)
        try:
            server = socket.create_server((host, port), backlog=64)
        except OSError as exc:
            raise ConfigError(f"the gateway cannot listen on {address}: {exc}") from exc
        return server


def tune_accepted(sock: socket.socket) -> None:
    """What an accepted stream needs (the same as a connected one)."""
    _tune(sock)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _BUFFER)


def choose_transport(name: str = "auto") -> Transport:
    """``tcp``; ``rdma`` (``ConfigError`` saying why when it cannot run); ``auto``: TCP.

    ``auto`` does not pick RDMA even where a device exists: its data path has not been run
    (see ``cdi.remote.rdma``), and a transport nobody ran must be asked for by name."""
    if name not in TRANSPORTS:
        raise ConfigError(f"transport {name!r}: choose one of {', '.join(TRANSPORTS)}")
    if name == "rdma":
        from cdi.remote.rdma import RdmaTransport

        return RdmaTransport()
    return TcpTransport()
