"""Hand-off latency of a payload from one process to another: TCP, gRPC, CDI-SHM and CDI-RPC.

With ``hosts`` set (``cdiflow bench cdi --hosts 2``) the sender runs on the first host and the
receiver on the second (``cdi.hosts``: two network namespaces), and the receivers listen on the
second host's address: TCP and gRPC then cross a real (virtual) link.

The clock starts when the sender has the bytes in its buffer (or object) and stops when the
receiver can read them: for TCP, when the last byte is in the receiver's buffer; for gRPC, when
the server handler has the request; for CDI, when the new owner holds a usable view after
``transfer`` + ``access``. Both ends stamp ``time.perf_counter_ns()`` (CLOCK_MONOTONIC, one clock
for all processes on the host). With ``read_all`` the receiver also reads every byte before it
stamps, so nobody mistakes a zero-copy hand-off for a free read.

Each backend runs its receiver in a spawned process; the sender is this process. Between
iterations the sender waits ``gap_s`` so every hand-off starts from the same idle state.

``relay`` is not a way to move data but the floor of any brokered hand-off on this machine: a
64-byte message from the sender through a third process to the receiver, which polls as a CDI
receiver does. CDI-SHM makes the same two hops (sender -> minion -> new owner) and adds only its
own work, so ``cdi-shm - relay`` is what the CDI code costs.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from cdi.hosts import Host

__all__ = ["BACKENDS", "DEFAULT_BACKENDS", "HandoffConfig", "measure", "recv_exact"]

_STAMP = struct.Struct("!q")
_GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 256 << 20),
    ("grpc.max_receive_message_length", 256 << 20),
]
GRPC_CHUNK = 1 << 20  # grpc-stream: one message per MiB (the largest that measured fastest)


@dataclass(frozen=True)
class HandoffConfig:
    size: int
    repeat: int = 200
    warmup: int = 20
    gap_s: float = 0.001
    read_all: bool = False
    minion_socket: str = ""
    receiver_minion_socket: str = ""
    """CDI-RPC: the receiver's host's minion (the sender's is ``minion_socket``)."""
    spin_us: int = 2000
    sender_host: Host | None = None
    receiver_host: Host | None = None
    """Both set: run each end on its host; the receiver listens on its host's address."""

    @property
    def listen_address(self) -> str:
        return self.receiver_host.address if self.receiver_host else "127.0.0.1"


def touch_all(buffer: memoryview | bytes | bytearray) -> int:
    """Read every byte (a sum over 8-byte words; the tail byte by byte)."""
    view = memoryview(buffer).cast("B")
    words = len(view) // 8
    total = int(np.frombuffer(view[: words * 8], dtype=np.uint64).sum()) if words else 0
    return total + sum(view[words * 8 :])


def _payload(size: int) -> bytes:
    return os.urandom(min(size, 1 << 16)) * (size // (1 << 16) + 1)


# ---------------------------------------------------------------------------------- TCP
def _tcp_receiver(config: HandoffConfig, control: Connection) -> None:
    server = socket.create_server((config.listen_address, 0))
    control.send(server.getsockname()[1])
    conn, _ = server.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buffer = bytearray(config.size)
    view = memoryview(buffer)
    for _ in range(config.warmup + config.repeat):
        got = 0
        while got < config.size:
            n = conn.recv_into(view[got:])
            if not n:
                return
            got += n
        if config.read_all:
            touch_all(view)
        conn.sendall(_STAMP.pack(time.perf_counter_ns()))
    conn.close()
    server.close()


def _tcp_sender(config: HandoffConfig, control: Connection) -> list[int]:
    port = control.recv()
    conn = socket.create_connection((config.listen_address, port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = _payload(config.size)[: config.size]
    samples = []
    for i in range(config.warmup + config.repeat):
        time.sleep(config.gap_s)
        start = time.perf_counter_ns()
        conn.sendall(payload)
        (stamp,) = _STAMP.unpack(recv_exact(conn, _STAMP.size))
        if i >= config.warmup:
            samples.append(stamp - start)
    conn.close()
    return samples


def recv_exact(conn: socket.socket, n: int) -> bytes:
    """``n`` bytes from ``conn`` (``ConnectionError`` if it closes first)."""
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the receiver closed the connection")
        data += chunk
    return data


# ---------------------------------------------------------------------------------- gRPC
def _grpc_serve(config: HandoffConfig, control: Connection, method: str, handler: Any) -> None:
    """Serve ``bench.Handoff/<method>`` until the sender says it is done."""
    from concurrent import futures

    import grpc

    handlers = grpc.method_handlers_generic_handler("bench.Handoff", {method: handler})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1), options=_GRPC_OPTIONS)
    server.add_generic_rpc_handlers((handlers,))
    port = server.add_insecure_port(f"{config.listen_address}:0")
    server.start()
    control.send(port)
    control.recv()  # the sender says when it is done
    server.stop(grace=None)


def _grpc_rounds(
    config: HandoffConfig, control: Connection, method: str, message: Callable[[bytes], Any]
) -> list[int]:
    """Time ``bench.Handoff/<method>`` calls carrying ``message(payload)``."""
    import grpc

    port = control.recv()
    channel = grpc.insecure_channel(f"{config.listen_address}:{port}", options=_GRPC_OPTIONS)
    path = f"/bench.Handoff/{method}"
    send = channel.unary_unary(path) if method == "Send" else channel.stream_unary(path)
    payload = _payload(config.size)[: config.size]
    samples = []
    for i in range(config.warmup + config.repeat):
        time.sleep(config.gap_s)
        start = time.perf_counter_ns()
        (stamp,) = _STAMP.unpack(send(message(payload), timeout=30))
        if i >= config.warmup:
            samples.append(stamp - start)
    channel.close()
    control.send("done")
    return samples


def _grpc_receiver(config: HandoffConfig, control: Connection) -> None:
    import grpc

    def handoff(request: bytes, context: Any) -> bytes:
        if config.read_all:
            touch_all(request)
        return _STAMP.pack(time.perf_counter_ns())

    # bytes in, bytes out
    _grpc_serve(config, control, "Send", grpc.unary_unary_rpc_method_handler(handoff))


def _grpc_sender(config: HandoffConfig, control: Connection) -> list[int]:
    return _grpc_rounds(config, control, "Send", lambda payload: payload)


def _grpc_stream_receiver(config: HandoffConfig, control: Connection) -> None:
    import grpc

    buffer = bytearray(config.size)

    def handoff(chunks: Any, context: Any) -> bytes:
        got = 0
        for chunk in chunks:  # bytes, GRPC_CHUNK at most: land them in one buffer
            buffer[got : got + len(chunk)] = chunk
            got += len(chunk)
        if config.read_all:
            touch_all(buffer)
        return _STAMP.pack(time.perf_counter_ns())

    _grpc_serve(config, control, "Stream", grpc.stream_unary_rpc_method_handler(handoff))


def _chunks(payload: bytes) -> Any:
    view = memoryview(payload)
    for offset in range(0, len(payload), GRPC_CHUNK):
        yield bytes(view[offset : offset + GRPC_CHUNK])  # gRPC sends bytes, not views


def _grpc_stream_sender(config: HandoffConfig, control: Connection) -> list[int]:
    return _grpc_rounds(config, control, "Stream", _chunks)


# ---------------------------------------------------------------------------------- CDI-SHM
def _cdi_receiver(config: HandoffConfig, control: Connection) -> None:
    import cdi

    socket_path = config.receiver_minion_socket or config.minion_socket
    client = cdi.connect(socket_path, "bench-receiver", spin_us=config.spin_us)
    control.send("registered")
    obj = client.use(control.recv(), check=False)  # on another host: access waits for it
    stamps = []
    for _ in range(config.warmup + config.repeat):
        view = obj.access(timeout=30)
        if config.read_all:
            touch_all(view)
        stamps.append(time.perf_counter_ns())
        view.release()
        obj.transfer("bench-sender")
    control.send(stamps)
    client.close()


def _cdi_sender(config: HandoffConfig, control: Connection) -> list[int]:
    import cdi

    client = cdi.connect(config.minion_socket, "bench-sender", spin_us=config.spin_us)
    key = f"bench-{os.getpid()}-{config.size}"
    obj = client.create(key, config.size)
    obj.write(_payload(config.size)[: config.size])
    assert control.recv() == "registered"
    control.send(key)
    starts = []
    for _ in range(config.warmup + config.repeat):
        time.sleep(config.gap_s)
        starts.append(time.perf_counter_ns())
        obj.transfer("bench-receiver")
        obj.access(timeout=30).release()  # wait for it to come back before the next round
    stamps = control.recv()
    obj.destroy()
    client.close()
    return [end - start for start, end in zip(starts, stamps, strict=True)][config.warmup :]


# ---------------------------------------------------------------------------------- relay
_RELAY_MESSAGE = b"x" * 64


def _relay_broker(inbound: socket.socket, outbound: socket.socket, count: int) -> None:
    for _ in range(count):
        outbound.send(inbound.recv(256))


def _relay_receiver(config: HandoffConfig, control: Connection) -> None:
    import select

    inbound: socket.socket = control.recv()
    poller = select.poll()
    poller.register(inbound.fileno(), select.POLLIN)
    spin_ns = config.spin_us * 1000
    stamps = []
    for _ in range(config.warmup + config.repeat):
        stop = time.perf_counter_ns() + spin_ns  # poll, then sleep: as a CDI receiver waits
        while not poller.poll(0) and time.perf_counter_ns() < stop:
            os.sched_yield()
        inbound.recv(256)
        stamps.append(time.perf_counter_ns())
        control.send("next")
    control.send(stamps)


def _relay_sender(config: HandoffConfig, control: Connection) -> list[int]:
    rounds = config.warmup + config.repeat
    to_broker, broker_in = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    broker_out, to_receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    context = multiprocessing.get_context("spawn")
    broker = context.Process(target=_relay_broker, args=(broker_in, broker_out, rounds))
    broker.start()
    try:
        control.send(to_receiver)
        starts = []
        for _ in range(rounds):
            time.sleep(config.gap_s)
            starts.append(time.perf_counter_ns())
            to_broker.send(_RELAY_MESSAGE)
            control.recv()  # the receiver has it: next round
        stamps = control.recv()
    finally:
        broker.join(timeout=30)
        if broker.is_alive():
            broker.kill()
            broker.join()
        for sock in (to_broker, broker_in, broker_out, to_receiver):
            sock.close()
    return [end - start for start, end in zip(starts, stamps, strict=True)][config.warmup :]


Sender = Callable[[HandoffConfig, Connection], list[int]]
Receiver = Callable[[HandoffConfig, Connection], None]
BACKENDS: dict[str, tuple[Sender, Receiver]] = {
    "tcp": (_tcp_sender, _tcp_receiver),
    "grpc": (_grpc_sender, _grpc_receiver),
    "grpc-stream": (_grpc_stream_sender, _grpc_stream_receiver),
    "cdi-shm": (_cdi_sender, _cdi_receiver),
    # The same code between two hosts: the minions' gateways carry the object across.
    "cdi-rpc": (_cdi_sender, _cdi_receiver),
    "relay": (_relay_sender, _relay_receiver),
}
DEFAULT_BACKENDS = ("tcp", "grpc", "cdi-shm")  # the paper's table; add relay for the floor


def _on_host(
    end: Callable[[HandoffConfig, Connection], Any],
    host: Host,
    config: HandoffConfig,
    control: Connection,
    result: Connection | None,
) -> None:
    """Run one end of a hand-off on ``host`` (a spawned process enters its namespace first)."""
    host.enter()
    value = end(config, control)
    if result is not None:
        result.send(value)


def measure(backend: str, config: HandoffConfig) -> list[int]:
    """Hand-off samples in nanoseconds for one backend and size."""
    sender, receiver = BACKENDS[backend]
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    if config.receiver_host is not None:
        args: tuple[Any, ...] = (receiver, config.receiver_host, config, theirs, None)
        process = context.Process(target=_on_host, args=args, daemon=True)
    else:
        process = context.Process(target=receiver, args=(config, theirs), daemon=True)
    process.start()
    try:
        if config.sender_host is None:
            return sender(config, mine)
        # The sender leaves this process too, for its own host: it sends its samples back.
        samples, out = context.Pipe()
        args = (sender, config.sender_host, config, mine, out)
        remote = context.Process(target=_on_host, args=args, daemon=True)
        remote.start()
        try:
            while not samples.poll(1.0):
                if not remote.is_alive():
                    raise RuntimeError(f"the {backend} sender died (exit {remote.exitcode})")
            got: list[int] = samples.recv()
            return got
        finally:
            remote.join(timeout=30)
            if remote.is_alive():
                remote.kill()
                remote.join()
            samples.close()
            out.close()
    finally:
        process.join(timeout=30)
        if process.is_alive():
            process.kill()
            process.join()
        mine.close()
        theirs.close()
