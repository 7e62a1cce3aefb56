"""An emulated regional link: a TCP proxy adding delay and capping bandwidth per connection.

    python -m loadtest.netem_proxy --target 127.0.0.1:9000 --rtt-ms 10 --mbytes-per-s 100

Each direction of each connection is a link with a one-way delay of ``rtt/2`` and a
serialisation rate of ``mbytes-per-s``: a chunk read at ``t`` leaves the link at
``max(t, previous chunk done) + len/rate`` and arrives ``rtt/2`` later, in order. An HTTP
request-response therefore pays one ``rtt`` (~10 ms) plus its bytes at the capped rate, as
it would on a kept-alive connection to an object store in a nearby region. No ``tc``/root needed.
The buffer per direction is bounded, so a slow reader pushes back on the sender as TCP would.

``NetemProxy`` runs it as a child process (its own core time, not the benchmark's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Self

from loadtest import harness_env
from orchestrator.child_process import ChildProcess

__all__ = ["LinkSpec", "NetemProxy", "serve"]

_CHUNK: Final = 64 * 1024
_QUEUED_CHUNKS: Final = 64  # ~4 MB in flight per direction, about 40 ms at 100 MB/s


class LinkSpec:
    """Round-trip delay (seconds) and bandwidth (bytes/s) of the emulated link."""

    def __init__(self, rtt_s: float = 0.010, bytes_per_s: float = 100e6) -> None:
        if rtt_s < 0 or bytes_per_s <= 0:
            raise ValueError("rtt must be >= 0 and bandwidth > 0")
        self.rtt_s = rtt_s
        self.bytes_per_s = bytes_per_s


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, link: LinkSpec) -> None:
    """One direction: read, stamp each chunk with its arrival time, deliver it then."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_QUEUED_CHUNKS)

    async def receive() -> None:
        link_free_at = 0.0
        try:
            while data := await reader.read(_CHUNK):
                now = loop.time()
                link_free_at = max(now, link_free_at) + len(data) / link.bytes_per_s
                await queue.put((link_free_at + link.rtt_s / 2, data))
        except OSError:
            pass  # a reset ends this direction like an EOF
        await queue.put((0.0, b""))

    async def deliver() -> None:
        while True:
            arrive_at, data = await queue.get()
            if not data:
                break
            delay = arrive_at - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            if writer.can_write_eof():
                writer.write_eof()

    receiving = asyncio.ensure_future(receive())
    try:
        await deliver()
    finally:
        receiving.cancel()


async def _handle(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    target: tuple[str, int],
    link: LinkSpec,
) -> None:
    try:
        server_r, server_w = await asyncio.open_connection(*target)
    except OSError:
        client_w.close()
        return
    # No delay for the TCP handshake: an S3 endpoint that closes the connection after every
    # response (moto's werkzeug server does) would make each request pay two round trips,
    # where a kept-alive client of a real regional endpoint pays one.
    pumps = [_pump(client_r, server_w, link), _pump(server_r, client_w, link)]
    with contextlib.suppress(OSError, asyncio.IncompleteReadError):
        await asyncio.gather(*pumps)
    for w in (client_w, server_w):
        w.close()


async def serve(
    host: str, port: int, target: tuple[str, int], link: LinkSpec, port_file: Path | None = None
) -> None:
    """Accept on ``host:port`` (0: any free port) and forward to ``target`` until cancelled."""
    server = await asyncio.start_server(lambda r, w: _handle(r, w, target, link), host, port)
    bound = server.sockets[0].getsockname()[1]
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(bound))
        tmp.replace(port_file)
    async with server:
        await server.serve_forever()


class NetemProxy:
    """``with NetemProxy("127.0.0.1:9000") as proxy:``, then connect to ``proxy.url``.

    ``port``: where to listen (0: any free port, known once started); a fixed one lets a
    proxy stopped and started again stand in the same place."""

    def __init__(
        self, target: str, link: LinkSpec | None = None, timeout: float = 10.0, port: int = 0
    ) -> None:
        self.target = target
        self.link = link or LinkSpec()
        self.timeout = timeout
        self._proc: ChildProcess | None = None
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> str:
        with tempfile.TemporaryDirectory(prefix="netem-") as folder:
            port_file = Path(folder) / "port"
            self._proc = ChildProcess(
                "netem proxy",
                [
                    sys.executable,
                    "-m",
                    "loadtest.netem_proxy",
                    "--target",
                    self.target,
                    "--rtt-ms",
                    str(self.link.rtt_s * 1000),
                    "--mbytes-per-s",
                    str(self.link.bytes_per_s / 1e6),
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--port-file",
                    str(port_file),
                ],
                env=harness_env(os.environ),
            ).start()
            deadline = time.monotonic() + self.timeout
            while not port_file.exists():
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"the netem proxy to {self.target} did not start")
                time.sleep(0.02)
            self.port = int(port_file.read_text())
        return self.url

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.stop(5.0)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.removeprefix("http://").rstrip("/").rpartition(":")
    return host or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m loadtest.netem_proxy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--target", required=True, help="host:port (or http://host:port)")
    parser.add_argument("--listen", default="127.0.0.1:0", help="host:port; port 0 = any")
    parser.add_argument("--rtt-ms", type=float, default=10.0)
    parser.add_argument("--mbytes-per-s", type=float, default=100.0)
    parser.add_argument("--port-file", type=Path, help="write the bound port here")
    args = parser.parse_args(argv)
    host, port = _host_port(args.listen)
    link = LinkSpec(args.rtt_ms / 1000, args.mbytes_per_s * 1e6)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # nothing to flush: a proxy
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, port, _host_port(args.target), link, args.port_file))


if __name__ == "__main__":
    main()
