"""The emulated regional link carries bytes intact, both ways, and its process goes away."""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from collections.abc import Iterator

import psutil
import pytest

from loadtest.netem_proxy import LinkSpec, NetemProxy


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


def test_bytes_cross_the_link_intact_on_several_connections(echo_server: str) -> None:
    payload = os.urandom(3_000_000)  # larger than the proxy's per-direction buffer
    with NetemProxy(echo_server, LinkSpec(rtt_s=0.004, bytes_per_s=200e6)) as proxy:
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


def test_a_link_needs_a_positive_bandwidth() -> None:
    with pytest.raises(ValueError):
        LinkSpec(rtt_s=0.01, bytes_per_s=0)
