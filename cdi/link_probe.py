"""What the link between two emulated hosts does: its round trip and bandwidth, measured.

    figures = probe(network, network.hosts[0], network.hosts[1])
    figures.rtt_ms, figures.mbit

A small server (``python -m cdi.link_probe --listen ADDR``) runs on the far host and echoes
one byte per byte for the round trip, then takes a bulk stream and answers when all of it
has come; the near end runs in a thread moved onto the near host. The figures are what every
connection between those hosts gets (TCP over the veths, through ``cdi.link_emulator`` when
one runs), so a benchmark can print them beside its results.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any, Final

from cdi.bench.handoff import recv_exact
from cdi.child import python_module
from cdi.errors import ConnectionFailed
from cdi.hosts import Host, HostNetwork
from cdi.link_emulator import on_own_thread

__all__ = ["LinkFigures", "probe"]

_PINGS: Final = 200
_BULK: Final = 32 * 2**20
_CHUNK: Final = 1 << 20


@dataclass(frozen=True)
class LinkFigures:
    rtt_ms: float  # median of small request-answer pairs on one connection
    connect_ms: float  # a connect plus the first request-answer
    mbit: float  # a bulk stream, its own round trip taken off

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _serve(address: str) -> None:
    server = socket.create_server((address, 0))
    print(server.getsockname()[1], flush=True)
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        kind = conn.recv(1)
        if kind == b"p":  # ping: echo each byte until the end
            while data := conn.recv(1):
                conn.sendall(data)
        elif kind == b"b":  # bulk: 8-byte length, then that many bytes, then b"k"
            want = int.from_bytes(recv_exact(conn, 8), "big")
            while want > 0:
                got = conn.recv(min(want, _CHUNK))
                if not got:
                    break
                want -= len(got)
            conn.sendall(b"k")
        conn.close()


def _measure(address: str, port: int) -> LinkFigures:
    began = time.perf_counter()
    with socket.create_connection((address, port), timeout=30) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"p")
        conn.sendall(b"x")
        recv_exact(conn, 1)
        connect_ms = (time.perf_counter() - began) * 1000
        rtts = []
        for _ in range(_PINGS):
            t = time.perf_counter()
            conn.sendall(b"x")
            recv_exact(conn, 1)
            rtts.append(time.perf_counter() - t)
    rtt = statistics.median(rtts)
    payload = bytes(_CHUNK)
    with socket.create_connection((address, port), timeout=60) as conn:
        conn.sendall(b"b" + _BULK.to_bytes(8, "big"))
        t = time.perf_counter()
        for _ in range(_BULK // _CHUNK):
            conn.sendall(payload)
        recv_exact(conn, 1)
        took = max(time.perf_counter() - t - rtt, 1e-9)
    return LinkFigures(round(rtt * 1000, 3), round(connect_ms, 3), round(_BULK * 8 / took / 1e6, 1))


def probe(network: HostNetwork, near: Host, far: Host) -> LinkFigures:
    """Round trip and bandwidth from ``near`` to ``far`` (two hosts of ``network``)."""
    argv = far.wrap(python_module("cdi.link_probe", "--listen", far.address))
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().strip()
        if not line.isdigit():
            raise ConnectionFailed(f"the link probe on {far.name} did not start")

        def near_end() -> LinkFigures:
            near.enter()
            return _measure(far.address, int(line))

        return on_own_thread(near_end)
    finally:
        server.terminate()
        server.wait(10)
        if server.stdout is not None:
            server.stdout.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m cdi.link_probe", description=__doc__)
    parser.add_argument("--listen", required=True, help="the address to serve on (port: any)")
    _serve(parser.parse_args(argv).listen)


if __name__ == "__main__":
    main()
