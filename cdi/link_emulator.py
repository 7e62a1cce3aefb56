"""An emulated link: a round trip (and, for one target, a bandwidth) added in user space.

    net.emulate_link(Link(mbit=1000, rtt_ms=0.5))    # between hosts: tbf for the bandwidth
    with LinkProxy("127.0.0.1:9000", Link(mbit=800, rtt_ms=10)) as proxy:   # to one server
        ...                                            # connect to proxy.url instead

*Between the hosts of a* ``HostNetwork``:

This kernel has ``tbf`` but no ``netem``, so the delay cannot be a qdisc. Instead every TCP
connection a host opens to another host, or to the services in the root namespace, is turned
(``nft ... redirect``, in the host's namespace) to this process, which listens on
``127.0.0.1:<port>`` inside each namespace. It reads where the connection was going
(``SO_ORIGINAL_DST``), opens it onward and carries each direction's bytes ``rtt/2`` after it
read them, in order: a request and its answer pay one round trip, a connect one more, and
every system's traffic between hosts pays the same (any port: Ray's too). The onward
connection to another host leaves from the host's namespace, marked so it is not turned
again, and so crosses the veths where ``tbf`` caps the bandwidth; one to a service in the
root namespace is opened there (at ``127.0.0.1:<port>``, then the bridge's address), which is
how a host reaches Postgres, Redis and S3 listening on loopback. Services count as being on
``near`` (host 1): its connections to them pay no delay. Connections between the processes
of one host, and those opened from the root namespace, are not touched.

*Known difference from a wire:* the caller's connect always succeeds (the kernel hands it to
this process); a connection the far end refuses reaches the caller as a reset right after.
Run by ``LinkEmulator`` as a child process: ``python -m cdi.link_emulator --spec FILE``.

*To one server* (``LinkProxy``: ``python -m cdi.link_emulator --target HOST:PORT``, no root
and no namespaces; the load tests' regional S3 link): a proxy on a local port. Each direction
of each connection is a link of ``rtt/2`` one way and ``mbit`` (no ``tbf`` here: the proxy
paces the bytes itself): a chunk read at ``t`` leaves the link at ``max(t, previous chunk
done) + len/rate`` and arrives ``rtt/2`` later, in order. A request and its answer pay one round
trip plus their bytes at that rate, as on a kept-alive connection; the connect pays nothing (an
endpoint that closes the connection after every response, as moto's server does, would
otherwise make each request pay two round trips).

Each connection costs four threads (a reader and a writer per direction): sleeps of a quarter
millisecond need ``nanosleep``, not an event loop's millisecond timer. What is read and not yet
delivered is bounded per direction, so a slow reader pushes back on the sender as TCP would.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

from cdi.child import ServiceChild, python_module

if TYPE_CHECKING:
    from cdi.hosts import HostNetwork

__all__ = [
    "DEFAULT_LINK",
    "MARK",
    "PORT",
    "SERVICES_ONLY",
    "Link",
    "LinkEmulator",
    "LinkProxy",
    "on_own_thread",
    "rules",
    "serve",
    "serve_proxy",
]

PORT: Final = 15001  # in each host's namespace, on loopback
MARK: Final = 0xCD1  # onward connections carry it, so the redirect lets them pass
_SO_ORIGINAL_DST: Final = 80
_CLONE_NEWNET: Final = 0x40000000
_PR_SET_TIMERSLACK: Final = 29
_CHUNK: Final = 256 * 1024
_IN_FLIGHT: Final = 8 * 2**20  # bytes read and not yet delivered, per direction
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


@dataclass(frozen=True)
class Link:
    """The link between two hosts: bandwidth (``tbf``; ``None``: the veth's own) and round
    trip (this module; 0: none added, and connections between hosts are left alone)."""

    mbit: float | None = 1000.0
    rtt_ms: float = 0.5

    def __post_init__(self) -> None:
        if (self.mbit is not None and self.mbit <= 0) or self.rtt_ms < 0:
            raise ValueError(f"a link needs a bandwidth > 0 and a round trip >= 0, not {self}")

    def describe(self) -> str:
        rate = "unshaped" if self.mbit is None else f"{self.mbit:g} Mbit/s"
        return f"{rate}, {self.rtt_ms:g} ms round trip"


DEFAULT_LINK: Final = Link()
# No link emulated: only the hosts' connections to the services on the root namespace's
# loopback are carried (``cdiflow up --hosts``, whose workers run on their hosts).
SERVICES_ONLY: Final = Link(mbit=None, rtt_ms=0.0)


def rules(own_address: str, subnet: str, gateway: str, link: Link, port: int = PORT) -> str:
    """The ``nft`` script for one host's namespace: its TCP to ``subnet`` (other hosts and
    the bridge), but not to itself, goes to the emulator on ``port``; with no round trip to
    add, only its TCP to the bridge's address (the services)."""
    to = subnet if link.rtt_ms > 0 else gateway
    return (
        "table ip cdilink {\n"
        " chain output {\n"
        "  type nat hook output priority -100; policy accept;\n"
        f"  meta mark {MARK} return\n"
        f"  ip daddr {own_address} return\n"
        f"  ip daddr {to} meta l4proto tcp redirect to :{port}\n"
        " }\n"
        "}\n"
    )


def on_own_thread(step: Callable[[], T]) -> T:
    """``step`` run on a thread of its own (which may move to another namespace without
    moving the caller); its result, or its exception raised here."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(step())
        except BaseException as exc:  # raised in the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


class _Pipe:
    """One direction of one connection: bytes read at ``t`` are written at ``t + delay``;
    with a ``rate`` (bytes/s), no sooner than the link has carried the bytes before them."""

    def __init__(
        self, source: socket.socket, sink: socket.socket, delay: float, rate: float | None = None
    ) -> None:
        self.source, self.sink, self.delay, self.rate = source, sink, delay, rate
        self.queue: deque[tuple[float, bytes]] = deque()
        self.held = 0
        self.cond = threading.Condition()
        self.failed = False

    def read(self) -> None:
        link_free_at = 0.0  # when the link has carried what was read before
        try:
            while data := self.source.recv(_CHUNK):
                with self.cond:
                    while self.held > _IN_FLIGHT and not self.failed:
                        self.cond.wait()
                    if self.failed:
                        return
                    sent = time.monotonic()
                    if self.rate is not None:
                        link_free_at = max(sent, link_free_at) + len(data) / self.rate
                        sent = link_free_at
                    self.queue.append((sent + self.delay, data))
                    self.held += len(data)
                    self.cond.notify_all()
        except OSError:
            pass  # a reset ends this direction like an end of stream
        with self.cond:
            self.queue.append((0.0, b""))
            self.cond.notify_all()

    def write(self) -> None:
        while True:
            with self.cond:
                while not self.queue:
                    self.cond.wait()
                due, data = self.queue.popleft()
            if not data:
                with contextlib.suppress(OSError):
                    self.sink.shutdown(socket.SHUT_WR)
                return
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                self.sink.sendall(data)
            except OSError:
                with self.cond:
                    self.failed = True
                    self.cond.notify_all()
                with contextlib.suppress(OSError):
                    self.source.shutdown(socket.SHUT_RD)
                return
            with self.cond:
                self.held -= len(data)
                self.cond.notify_all()


def carry(
    client: socket.socket, onward: socket.socket, delay: float, rate: float | None = None
) -> None:
    """Carry both directions between ``client`` and ``onward`` until both end; close them."""
    for sock in (client, onward):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    pipes = [_Pipe(client, onward, delay, rate), _Pipe(onward, client, delay, rate)]
    steps = [step for pipe in pipes for step in (pipe.read, pipe.write)]
    threads = [threading.Thread(target=step, daemon=True) for step in steps]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    onward.close()


@dataclass(frozen=True)
class _Host:
    name: str
    address: str
    namespace_fd: int


class _Emulator:
    def __init__(self, spec: dict[str, object], root_fd: int) -> None:
        self.delay = float(spec["rtt_ms"]) / 2000  # type: ignore[arg-type]
        self.gateway = str(spec["gateway"])
        self.near = str(spec["near"])
        self.port = int(spec["port"])  # type: ignore[call-overload]
        self.root_fd = root_fd
        self.hosts = [
            _Host(str(h["name"]), str(h["address"]), os.open(str(h["netns"]), os.O_RDONLY))
            for h in spec["hosts"]  # type: ignore[attr-defined]
        ]

    def listen(self, host: _Host) -> socket.socket:
        """A listening socket in ``host``'s namespace (made from a thread moved there)."""

        def make() -> socket.socket:
            _setns(host.namespace_fd)
            server = socket.create_server(("127.0.0.1", self.port), backlog=512)
            threading.Thread(target=self.accept, args=(host, server), daemon=True).start()
            return server

        return on_own_thread(make)

    def accept(self, host: _Host, server: socket.socket) -> None:
        # Threads started here are in the host's namespace too: they inherit this one's.
        while True:
            client, _ = server.accept()
            threading.Thread(target=self.connect, args=(host, client), daemon=True).start()

    def connect(self, host: _Host, client: socket.socket) -> None:
        try:
            raw = client.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
            port, packed = struct.unpack_from("!2xH4s", raw)
            address = socket.inet_ntoa(packed)
            to_services = address == self.gateway
            delay = 0.0 if to_services and host.name == self.near else self.delay
            if delay:
                time.sleep(2 * delay)  # the handshake's round trip
            onward = self._dial(address, port) if to_services else self._dial_host(address, port)
        except OSError:
            # Reset, not closed: the nearest this side of an accepted connect comes to the
            # refusal the caller would have had without the emulator.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        carry(client, onward, delay)

    def _dial_host(self, address: str, port: int) -> socket.socket:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, MARK)
        try:
            sock.connect((address, port))
        except OSError:
            sock.close()
            raise
        return sock

    def _dial(self, address: str, port: int) -> socket.socket:
        """To a service in the root namespace: on loopback, else on the bridge's address."""
        for target in (("127.0.0.1", port), (address, port)):
            sock = self._root_socket()
            try:
                sock.connect(target)
                return sock
            except ConnectionRefusedError:
                sock.close()
        raise ConnectionRefusedError(f"nothing listens on {address}:{port} nor on loopback")

    def _root_socket(self) -> socket.socket:
        """A socket of the root namespace, made by this thread on a short visit there."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(self.root_fd)
            try:
                return socket.socket()
            finally:
                _setns(own)
        finally:
            os.close(own)


class LinkEmulator:
    """This module run as a child process for the hosts of ``network`` (``HostNetwork``
    makes the rules and ``tbf`` first: see ``HostNetwork.emulate_link``)."""

    def __init__(self, network: HostNetwork, link: Link, folder: str, near: str) -> None:
        self.link = link
        base = Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        self._spec = base / "link-emulator.json"
        self._ready = base / "link-emulator.ready"
        self._spec.write_text(json.dumps({
            "rtt_ms": link.rtt_ms, "gateway": network.gateway, "near": near, "port": PORT,
            "hosts": [{"name": h.name, "address": h.address, "netns": f"/run/netns/{h.namespace}"}
                      for h in network.hosts],
        }))  # fmt: skip
        self._ready.unlink(missing_ok=True)
        argv = python_module("cdi.link_emulator", "--spec", str(self._spec),
                             "--ready-file", str(self._ready))  # fmt: skip
        self.child = ServiceChild("link emulator", argv, base / "link-emulator.log",
                                  self._answers)  # fmt: skip

    def _answers(self) -> bool:
        """Serving: its ready file names it (not a former life that was killed)."""
        try:
            return self._ready.read_text() == str(self.child.pid)
        except OSError:
            return False

    @property
    def pid(self) -> int:
        return self.child.pid

    def start(self) -> LinkEmulator:
        self.child.start()
        return self

    def stop(self) -> None:
        self.child.stop(5.0)
        self._ready.unlink(missing_ok=True)


class LinkProxy:
    """A proxy to ``target`` (``host:port`` or ``http://host:port``) over ``link``, as a child
    process (its own core time, not the caller's): ``with LinkProxy(...) as proxy:``, then
    connect to ``proxy.port`` (``proxy.url`` for HTTP).

    ``port``: where to listen (0: any free port, known once started); a fixed one lets a
    proxy stopped and started again stand in the same place."""

    def __init__(
        self, target: str, link: Link, folder: str | Path, timeout: float = 10.0, port: int = 0
    ) -> None:
        if link.mbit is None and link.rtt_ms == 0:
            raise ValueError("a link proxy needs a bandwidth or a round trip to add")
        self.target, self.link, self.timeout = target, link, timeout
        base = Path(folder)
        base.mkdir(parents=True, exist_ok=True)
        self._port_file = base / "link-proxy.port"
        self._port_file.unlink(missing_ok=True)
        argv = python_module("cdi.link_emulator", "--target", target, "--rtt-ms", f"{link.rtt_ms}",
                             "--port-file", str(self._port_file))  # fmt: skip
        if link.mbit is not None:
            argv += ["--mbit", f"{link.mbit}"]
        if port:
            argv += ["--port", str(port)]
        self.child = ServiceChild("link proxy", argv, base / "link-proxy.log", self._answers)
        self.port = port

    def _answers(self) -> bool:
        try:
            pid, _, port = self._port_file.read_text().partition(":")
        except OSError:
            return False
        if pid != str(self.child.pid):
            return False  # a former life's
        self.port = int(port)
        return True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child.running else None

    def start(self) -> str:
        """Start it; its URL once it listens."""
        self.child.start(self.timeout)
        return self.url

    def stop(self) -> None:
        self.child.stop(5.0)

    def __enter__(self) -> LinkProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.removeprefix("http://").rstrip("/").rpartition(":")
    return host or "127.0.0.1", int(port)


def serve_proxy(target: str, link: Link, port_file: Path | None = None, port: int = 0) -> None:
    """Listen on ``port`` of ``127.0.0.1`` (0: a free one) and carry connections to ``target``
    until killed."""
    _libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)
    to = _host_port(target)
    delay = link.rtt_ms / 2000
    rate = None if link.mbit is None else link.mbit * 1e6 / 8
    server = socket.create_server(("127.0.0.1", port), backlog=512)

    def connect(client: socket.socket) -> None:
        try:
            onward = socket.create_connection(to)
        except OSError:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            return
        carry(client, onward, delay, rate)

    def accept() -> None:
        while True:
            client, _ = server.accept()
            threading.Thread(target=connect, args=(client,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    if port_file is not None:
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(f"{os.getpid()}:{server.getsockname()[1]}")
        tmp.replace(port_file)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.close()


def serve(spec: dict[str, object], ready_file: Path | None = None) -> None:
    """Listen in every host's namespace and carry connections until killed."""
    _libc.prctl(_PR_SET_TIMERSLACK, 1, 0, 0, 0)  # sleeps end within a microsecond or so
    root_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    emulator = _Emulator(spec, root_fd)
    servers = [emulator.listen(host) for host in emulator.hosts]
    if ready_file is not None:
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(str(os.getpid()))
        tmp.replace(ready_file)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m cdi.link_emulator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--spec", type=Path, help="between hosts: JSON of hosts, gateway, ...")
    mode.add_argument("--target", help="to one server: HOST:PORT (or http://HOST:PORT)")
    parser.add_argument("--ready-file", type=Path, help="--spec: written once every host is served")
    parser.add_argument("--rtt-ms", type=float, default=10.0, help="--target: the round trip")
    parser.add_argument("--mbit", type=float, help="--target: the bandwidth (default: unpaced)")
    parser.add_argument("--port-file", type=Path, help="--target: PID:PORT written once listening")
    parser.add_argument(
        "--port", type=int, default=0, help="--target: where (default: a free port)"
    )
    args = parser.parse_args(argv)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if args.target:
        try:
            link = Link(mbit=args.mbit, rtt_ms=args.rtt_ms)
        except ValueError as exc:
            parser.error(str(exc))
        serve_proxy(args.target, link, args.port_file, args.port)
    else:
        serve(json.loads(args.spec.read_text()), args.ready_file)
    sys.exit(0)


if __name__ == "__main__":
    main()
