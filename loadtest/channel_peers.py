"""The three systems ``cdiflow bench channels`` compares, each as a publisher and a subscriber
of one topic: CDI channels (``cdi.channels``, a minion started for the run), Mosquitto (MQTT,
QoS 0, the paho client; a broker started for the run) and Redis pub/sub (a redis-server
started for the run). Each subscriber runs in a process of its own.

Across two hosts (``running(system, network)``, network namespaces): the publisher is on host
1 and the subscriber on host 2. CDI: a minion and gateway per host (``LocalCluster``), the topic
carried between them by the gateways. Mosquitto and Redis: the server on host 1, beside the
publisher; the subscriber connects to it across the link."""

from __future__ import annotations

import collections
import contextlib
import enum
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import click

from cdi.hosts import Host, HostNetwork

__all__ = [
    "Endpoint",
    "Publisher",
    "ServerUnavailable",
    "Subscriber",
    "System",
    "open_publisher",
    "open_subscriber",
    "running",
]

TOPIC = "bench"
CDI_WRITER, CDI_READER = "bench-writer", "bench-reader"


class ServerUnavailable(click.ClickException):
    """A system's server cannot run here (not installed, or it would not start)."""


class System(enum.StrEnum):
    CDI = "cdi"
    MOSQUITTO = "mosquitto"
    REDIS = "redis"


@dataclass(frozen=True)
class Endpoint:
    """Where a system listens: a minion's socket path, or a broker's address and TCP port;
    across hosts, where the subscriber connects and the hosts each side runs on."""

    system: System
    address: str
    port: int = 0
    subscriber_address: str | None = None  # another host's minion (CDI, two hosts)
    publisher_host: Host | None = None
    subscriber_host: Host | None = None

    @property
    def hosts(self) -> int:
        return 1 if self.subscriber_host is None else 2

    def on_publisher_host(self) -> contextlib.AbstractContextManager[None]:
        """The calling thread on the publisher's host while it connects."""
        if self.publisher_host is None:
            return contextlib.nullcontext()
        return self.publisher_host.visit()


class Publisher(Protocol):
    def publish(self, payload: bytes) -> None: ...
    def flush(self) -> None: ...
    def close(self) -> None: ...


class Subscriber(Protocol):
    def receive(self, timeout: float) -> bytes | None: ...
    def close(self) -> None: ...


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_port(address: str, port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServerUnavailable(f"{what} exited with {process.returncode} as it started")
        with contextlib.suppress(OSError), socket.create_connection((address, port), 0.2):
            return
        time.sleep(0.05)
    raise ServerUnavailable(f"{what} did not listen on {address}:{port} within 15 s")


@contextlib.contextmanager
def _child(argv: list[str], address: str, port: int, what: str) -> Iterator[None]:
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_port(address, port, process, what)
        yield
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def running(system: System, network: HostNetwork | None = None) -> Iterator[Endpoint]:
    """Start ``system``'s server for the run (minion, broker or redis-server); stop it after.
    With ``network`` (two hosts), the publisher's side on its first host, the subscriber's on
    its second."""
    with tempfile.TemporaryDirectory(prefix=f"bench-{system}-") as folder:
        os.chmod(folder, 0o755)
        near, far = (network.hosts[0], network.hosts[1]) if network else (None, None)
        if system is System.CDI:
            if network is not None:
                from cdi.cluster import LocalCluster

                # The network outlives the cluster: the other systems run on it next.
                with LocalCluster.start(2, folder, network=network) as cluster:
                    yield Endpoint(
                        system, cluster.minions[0].socket_path,
                        subscriber_address=cluster.minions[1].socket_path,
                        publisher_host=near, subscriber_host=far,
                    )  # fmt: skip
                return
            from cdi.minion.process import MinionChild

            path = str(Path(folder) / "minion.sock")
            with MinionChild(path):
                yield Endpoint(system, path)
            return
        port = _free_port()
        address = near.address if near is not None else "127.0.0.1"

        def on_host(argv: list[str]) -> list[str]:
            return near.wrap(argv) if near is not None else argv

        if system is System.MOSQUITTO:
            binary = shutil.which("mosquitto") or shutil.which("mosquitto", path="/usr/sbin")
            if binary is None:
                raise ServerUnavailable(
                    "mosquitto is not installed: apt-get install -y mosquitto (Debian's broker)"
                )
            config = Path(folder) / "mosquitto.conf"
            # One address only; no persistence; Nagle off (its best latency); no cap on queued
            # messages, so a burst is not thinned (delivered counts say if any were lost).
            config.write_text(
                f"listener {port} {address}\nallow_anonymous true\npersistence false\n"
                "set_tcp_nodelay true\nmax_queued_messages 0\nlog_dest none\n"
            )
            with _child(on_host([binary, "-c", str(config)]), address, port, "mosquitto"):
                yield Endpoint(system, address, port, None, near, far)
            return
        from orchestrator.errors import ServiceError
        from orchestrator.services.redis_server import find_redis_server

        try:
            redis_server = find_redis_server()
        except ServiceError as exc:
            raise ServerUnavailable(str(exc)) from exc
        argv = [
            str(redis_server), "--port", str(port), "--bind", address,
            "--save", "", "--appendonly", "no", "--dir", folder,
            # A subscriber is never cut off for being behind (the default caps it at 32 MB).
            "--client-output-buffer-limit", "pubsub", "0", "0", "0",
        ]  # fmt: skip
        with _child(on_host(argv), address, port, "redis-server"):
            yield Endpoint(system, address, port, None, near, far)


# ------------------------------------------------------------------ CDI channels
class _CdiPublisher:
    def __init__(self, endpoint: Endpoint) -> None:
        import cdi
        from cdi import channels

        self.client = cdi.connect(endpoint.address, CDI_WRITER)
        self.topic = channels.open_topic(self.client, TOPIC)
        while True:  # the subscriber's process registers as it starts
            try:
                self.topic.grant([CDI_READER])
                break
            except cdi.UnknownContainer:
                time.sleep(0.01)
        self.topic.wait_for_readers(1, timeout=60)

    def publish(self, payload: bytes) -> None:
        self.topic.publish(payload)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.topic.close()
        self.client.close()


class _CdiSubscriber:
    def __init__(self, endpoint: Endpoint, spin_us: int) -> None:
        import cdi
        from cdi import channels

        self.client = cdi.connect(endpoint.subscriber_address or endpoint.address, CDI_READER)
        self.sub = channels.subscribe(self.client, TOPIC, timeout=60, spin_us=spin_us)
        self._timeout_error = cdi.AccessTimeout

    def receive(self, timeout: float) -> bytes | None:
        try:
            return self.sub.receive(timeout)
        except self._timeout_error:
            return None

    def close(self) -> None:
        self.sub.close()
        self.client.close()


# ------------------------------------------------------------------ Mosquitto (MQTT QoS 0)
def _mqtt_client(endpoint: Endpoint) -> Any:
    from paho.mqtt import client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    client = mqtt.Client(CallbackAPIVersion.VERSION2)
    client.connect(endpoint.address, endpoint.port)
    deadline = time.monotonic() + 15
    while not client.is_connected():
        if time.monotonic() > deadline:
            raise click.ClickException("the MQTT client did not connect to mosquitto in 15 s")
        client.loop(timeout=0.1)
    # paho leaves Nagle's algorithm on: a small publish then waits for the previous one's
    # ACK (milliseconds). Mosquitto at its best, as Redis's client does by default.
    sock = client.socket()
    if isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return client


class _MqttPublisher:
    """paho without its network thread: ``publish`` writes to the socket in the calling
    thread (the quickest way paho offers)."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.client = _mqtt_client(endpoint)

    def publish(self, payload: bytes) -> None:
        self.client.publish(TOPIC, payload, qos=0)

    def flush(self) -> None:
        while self.client.want_write():
            self.client.loop_write()
            self.client.loop(timeout=0.01)

    def close(self) -> None:
        self.client.disconnect()


class _MqttSubscriber:
    def __init__(self, endpoint: Endpoint) -> None:
        self.client = _mqtt_client(endpoint)
        self.inbox: collections.deque[bytes] = collections.deque()
        self.client.on_message = lambda _c, _u, message: self.inbox.append(message.payload)
        subscribed: list[bool] = []
        self.client.on_subscribe = lambda *_args: subscribed.append(True)
        self.client.subscribe(TOPIC, qos=0)
        while not subscribed:
            self.client.loop(timeout=0.1)

    def receive(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while not self.inbox:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.client.loop(timeout=remaining)
        return self.inbox.popleft()

    def close(self) -> None:
        self.client.disconnect()


# ------------------------------------------------------------------ Redis pub/sub
class _RedisPublisher:
    def __init__(self, endpoint: Endpoint) -> None:
        import redis

        self.client = redis.Redis(host=endpoint.address, port=endpoint.port)
        deadline = time.monotonic() + 15
        while self.client.pubsub_numsub(TOPIC)[0][1] < 1:  # the subscriber is in
            if time.monotonic() > deadline:
                raise click.ClickException("the Redis subscriber did not subscribe in 15 s")
            time.sleep(0.01)

    def publish(self, payload: bytes) -> None:
        self.client.publish(TOPIC, payload)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.client.close()


class _RedisSubscriber:
    def __init__(self, endpoint: Endpoint) -> None:
        import redis

        self.client = redis.Redis(host=endpoint.address, port=endpoint.port)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(TOPIC)
        while self.pubsub.get_message(timeout=1.0) is None and not self.pubsub.subscribed:
            pass

    def receive(self, timeout: float) -> bytes | None:
        deadline = time.monotonic() + timeout
        while True:
            message = self.pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
            if message is not None and message["type"] == "message":
                data: bytes = message["data"]
                return data
            if time.monotonic() >= deadline:
                return None

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


def open_publisher(endpoint: Endpoint) -> Publisher:
    if endpoint.system is System.CDI:
        return _CdiPublisher(endpoint)
    if endpoint.system is System.MOSQUITTO:
        return _MqttPublisher(endpoint)
    return _RedisPublisher(endpoint)


def open_subscriber(endpoint: Endpoint, spin_us: int) -> Subscriber:
    if endpoint.system is System.CDI:
        return _CdiSubscriber(endpoint, spin_us)
    if endpoint.system is System.MOSQUITTO:
        return _MqttSubscriber(endpoint)
    return _RedisSubscriber(endpoint)
