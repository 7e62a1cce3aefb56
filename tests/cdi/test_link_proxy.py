"""The emulated link to one server (``cdi.link_emulator.LinkProxy``): bytes cross it intact,
both ways, on several connections, each direction pays its delay and its rate, and its
process goes away."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from cdi.link_emulator import Link, LinkProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _round_trip(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sender = threading.Thread(target=sock.sendall, args=(payload,))
        sender.start()  # send and receive at once: the echo would fill both buffers otherwise
        received = bytearray()
        while len(received) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        sender.join()
    return bytes(received)


def test_bytes_cross_the_link_intact_on_several_connections(
    echo_server: str, tmp_path: Path
) -> None:
    payload = os.urandom(12_000_000)  # larger than what the proxy holds per direction
    with LinkProxy(echo_server, Link(mbit=1600, rtt_ms=4), tmp_path) as proxy:
        assert _round_trip(proxy.port, payload) == payload
        results: list[bytes] = []

        def small() -> None:
            results.append(_round_trip(proxy.port, b"x" * 1000))

        threads = [threading.Thread(target=small) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [b"x" * 1000] * 4
        pid = proxy.pid
    assert pid is not None and not psutil.pid_exists(pid)  # stopped and reaped


def test_each_direction_pays_its_delay_and_its_rate(echo_server: str, tmp_path: Path) -> None:
    """A byte and its echo take at least the link's round trip; 400 KB through a link of
    32 Mbit/s (4 MB/s) at least 0.1 s more. Lower bounds only: what the emulator adds (its
    sleeps), never how fast this machine is."""
    with LinkProxy(echo_server, Link(mbit=32, rtt_ms=60), tmp_path) as proxy:
        began = time.monotonic()
        assert _round_trip(proxy.port, b"x") == b"x"
        assert time.monotonic() - began >= 0.060
        began = time.monotonic()
        assert len(_round_trip(proxy.port, b"y" * 400_000)) == 400_000
        assert time.monotonic() - began >= 0.060 + 0.1


def test_a_link_proxy_adds_something(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bandwidth or a round trip"):
        LinkProxy("127.0.0.1:1", Link(mbit=None, rtt_ms=0), tmp_path)
    with pytest.raises(ValueError, match="bandwidth > 0"):
        Link(mbit=0, rtt_ms=10)
