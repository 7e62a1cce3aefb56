"""Channels between hosts: a topic written on host 1 is read on host 2 through the gateways
(real minions and gateways on two emulated hosts); streams both ways, back-pressure across
the link, and a link that breaks."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cdi
from cdi import channels
from cdi.auth import new_key
from cdi.channels.ring import Geometry
from cdi.cluster import LocalCluster
from cdi.controller.models import Route
from cdi.remote import handshake
from cdi.remote.channels import Bridges
from cdi.remote.routes import RouteCache
from cdi.remote.transport import TcpTransport
from cdi.remote.wire import receive_header, send_frame
from tests.cdi.conftest import require_native
from tests.multihost.test_cross_host import cid

Unique = Callable[[str], str]

# Channel links stay in the gateway's Python process whoever sends objects: the receiving
# side (which answers a link's handshake and passes a channel on) is what varies here.
CLUSTER_GATEWAYS = ["native", "python"]


@pytest.fixture
def pair(cluster: LocalCluster, unique: Unique) -> Iterator[tuple[cdi.Client, cdi.Client]]:
    """A container on each host."""
    with (
        cdi.connect(cluster.minions[0].socket_path, unique("w")) as a,
        cdi.connect(cluster.minions[1].socket_path, unique("r")) as b,
    ):
        yield a, b


def _message(number: int, size: int) -> bytes:
    """Message ``number`` of ``size`` bytes: its number, then bytes derived from it."""
    head = number.to_bytes(8, "little")
    return head + (hashlib.sha256(head).digest() * (size // 32 + 1))[: size - 8]


def _check(message: bytes, number: int, size: int) -> None:
    assert len(message) == size, (number, len(message))
    assert int.from_bytes(message[:8], "little") == number, "out of order"
    assert message == _message(number, size), "altered"


def _reading(
    client: cdi.Client, name: str, count: int, *, delay: float = 0.0
) -> tuple[threading.Thread, list[Any], threading.Event]:
    """A reader of ``name`` in a thread: what it received (or the error that ended it)."""
    got: list[Any] = []
    joined = threading.Event()

    def read() -> None:
        try:
            with channels.subscribe(client, name, timeout=30) as sub:
                joined.set()
                time.sleep(delay)
                for _ in range(count):
                    got.append(sub.receive(timeout=30))
        except BaseException as exc:
            got.append(exc)
        finally:
            joined.set()

    thread = threading.Thread(target=read)
    thread.start()
    return thread, got, joined


@pytest.mark.parametrize(("size", "count"), [(16, 3000), (1 << 20, 40)])
def test_a_topic_written_on_one_host_is_read_on_the_other_in_order_and_intact(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique, size: int, count: int
) -> None:
    a, b = pair
    name = unique("t")
    with channels.open_topic(a, name) as topic:
        topic.grant([cid(b)])  # b is not on this host: the gateway carries the topic there
        thread, got, _ = _reading(b, name, count)
        topic.wait_for_readers(1, timeout=30)  # the reader has joined on its host
        assert topic.readers[0].startswith(f"cdi-gateway.{a.host}.relay")
        for number in range(count):
            topic.publish(_message(number, size), timeout=30)
        thread.join(60)
    assert len(got) == count, got[-1:]
    for number, message in enumerate(got):
        _check(message, number, size)


def test_a_stream_carries_both_ways_between_hosts(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    name = unique("s")
    ends: dict[str, channels.Stream] = {}

    def open_b() -> None:
        ends["b"] = channels.open_stream(b, name, cid(a), timeout=30)

    opener = threading.Thread(target=open_b)
    opener.start()
    ends["a"] = channels.open_stream(a, name, cid(b), timeout=30)
    opener.join(30)
    with ends["a"] as ours, ends["b"] as theirs:
        ours.outbound.wait_for_readers(1, timeout=30)
        theirs.outbound.wait_for_readers(1, timeout=30)
        for number in range(200):
            ours.send(_message(number, 100))
            request = theirs.receive(timeout=30)
            _check(request, number, 100)
            theirs.send(_message(number, 70_000))  # two chunks
            _check(ours.receive(timeout=30), number, 70_000)


@pytest.mark.parametrize("policy", list(channels.BackPressure))
def test_a_slow_reader_on_the_other_host_holds_the_writer_back_and_loses_nothing(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique, policy: channels.BackPressure
) -> None:
    """Once the reader's ring, the link's buffers and the writer's ring are full, the topic's
    policy applies as for a reader on the writer's host: ``block`` waits (here until the
    publish's timeout), ``fail`` refuses at once; either way ``ChannelFull``, and nothing
    published before is lost."""
    a, b = pair
    name, size = unique("t"), 64 << 10
    with channels.open_topic(a, name, slots=8, slot_bytes=size, policy=policy) as topic:
        topic.grant([cid(b)])
        sub = channels.subscribe(b, name, timeout=30)
        topic.wait_for_readers(1, timeout=30)
        sent, refused_since = 0, None
        while sent < 5000:  # 320 MB: far more than any buffer between the two rings
            started = time.monotonic()
            try:
                topic.publish(_message(sent, size), timeout=3)
            except cdi.ChannelFull:
                waited = time.monotonic() - started
                if policy is channels.BackPressure.BLOCK:
                    assert waited >= 2.9
                    break
                assert waited < 1  # ``fail`` refuses at once: it may refuse while the relay
                refused_since = refused_since or started  # catches up, so it tries again
                if time.monotonic() - refused_since > 3:  # until refused for 3 s
                    break
                time.sleep(0.001)
                continue
            sent, refused_since = sent + 1, None
        assert 16 <= sent < 5000, sent
        for number in range(sent):
            _check(sub.receive(timeout=30), number, size)
        deadline = time.monotonic() + 30
        while True:  # room again once the relay has caught up
            try:
                topic.publish(_message(sent, size), timeout=30)
                break
            except cdi.ChannelFull:
                assert time.monotonic() < deadline
                time.sleep(0.01)
        _check(sub.receive(timeout=30), sent, size)
        sub.close()


def test_a_second_reader_on_the_other_host_shares_the_link(
    pair: tuple[cdi.Client, cdi.Client], cluster: LocalCluster, unique: Unique
) -> None:
    a, b = pair
    name = unique("t")
    with (
        cdi.connect(cluster.minions[1].socket_path, unique("r")) as c,
        channels.open_topic(a, name) as topic,
    ):
        topic.grant([cid(b), cid(c)])
        first, got_b, _ = _reading(b, name, 50)
        second, got_c, _ = _reading(c, name, 50)
        topic.wait_for_readers(2, timeout=30)
        assert len(topic.readers) == 1  # one relay for both
        for number in range(50):
            topic.publish(_message(number, 1000))
        first.join(30)
        second.join(30)
    for got in (got_b, got_c):
        assert len(got) == 50, got[-1:]
        for number, message in enumerate(got):
            _check(message, number, 1000)


def test_a_stream_with_a_peer_that_registers_late_on_the_same_host_opens_at_once(
    a_only: cdi.Client, cluster: LocalCluster, unique: Unique
) -> None:
    """Where a gateway runs, a grant to a container not registered yet asks the gateway; a
    peer that then registers on this host is granted here as soon as the directory has it."""
    peer, name = unique("late"), unique("s")
    opened: list[float] = []
    failed: list[BaseException] = []

    def open_ours() -> None:
        try:
            with channels.open_stream(a_only, name, peer, timeout=30) as ours:
                opened.append(time.monotonic())
                ours.send(b"hello")
        except BaseException as exc:  # said by the test below, not lost with the thread
            failed.append(exc)
            raise

    thread = threading.Thread(target=open_ours)
    thread.start()
    time.sleep(0.3)
    with cdi.connect(cluster.minions[0].socket_path, peer) as late:
        registered = time.monotonic()
        try:
            with channels.open_stream(late, name, cid(a_only), timeout=30) as theirs:
                assert theirs.receive(timeout=30) == b"hello"
        finally:
            thread.join(30)
            assert not failed, f"our end failed: {failed[0]!r}"
    assert opened and opened[0] - registered < 3, opened


def test_granting_a_reader_no_host_has_fails(a_only: cdi.Client, unique: Unique) -> None:
    with channels.open_topic(a_only, unique("t")) as topic, pytest.raises(cdi.UnknownContainer):
        topic.grant([unique("nobody")])


def test_only_the_writer_may_carry_its_topic_to_another_host(
    pair: tuple[cdi.Client, cdi.Client], cluster: LocalCluster, unique: Unique
) -> None:
    a, b = pair
    with (
        cdi.connect(cluster.minions[0].socket_path, unique("x")) as other,
        channels.open_topic(a, unique("t")) as topic,
        pytest.raises(cdi.NotOwner),
    ):
        other.bridge_channel(topic.name, cid(b), slots=8, slot_bytes=64, max_message=64)


@pytest.fixture
def a_only(cluster: LocalCluster, unique: Unique) -> Iterator[cdi.Client]:
    with cdi.connect(cluster.minions[0].socket_path, unique("w")) as a:
        yield a


def test_a_gateway_of_protocol_1_is_refused_clearly(
    cluster: LocalCluster, a_only: cdi.Client, unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway that says no version (or 1) carries no channels: the writer's gateway says so
    before it asks for one, and the older gateway is sent nothing it does not know."""
    assert handshake.version_of({"ok": True}) == 1
    key, heard = new_key(), []
    server = socket.create_server(("127.0.0.1", 0))

    def older_gateway() -> None:
        conn, _ = server.accept()
        with conn:
            handshake.answer(conn, key)
            heard.append(receive_header(conn))  # None: the link closed, nothing asked

    monkeypatch.setattr(handshake, "VERSION", 1)
    thread = threading.Thread(target=older_gateway)
    thread.start()
    routes = RouteCache(cluster.controller_url, "host1")
    bridges = Bridges(TcpTransport(), key, "host1", cluster.minions[0].socket_path,
                      unique("test-relay"), routes)  # fmt: skip
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with (
            channels.open_topic(a_only, unique("t")) as topic,
            pytest.raises(cdi.ChannelBroken, match="speaks protocol 1"),
        ):
            bridges._connect(topic.name, "old", address, cid(a_only), "r", Geometry(8, 64, 64))
        thread.join(10)
        assert heard == [None]
    finally:
        server.close()
        routes.close()


def test_a_grant_that_crosses_the_end_of_a_stream_opens_a_new_one(
    cluster: LocalCluster, a_only: cdi.Client, unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other host says ``E`` (no reader there holds the mirror) just as the writer grants
    one more reader there: that ``G`` is never answered, and the writer's gateway grants the
    reader over a new stream instead of failing the grant."""
    key, asked = new_key(), []
    server = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{server.getsockname()[1]}"

    def other_gateway() -> None:
        for ends in (True, False):
            conn, _ = server.accept()
            with conn:
                handshake.answer(conn, key)
                asked.append(receive_header(conn))
                send_frame(conn, {"ok": True})
                conn.settimeout(None)
                with conn.makefile("rb") as frames:  # kind, u32 length, body
                    while head := frames.read(5):
                        frames.read(int.from_bytes(head[1:], "big"))
                        if ends and head[:1] == b"G":
                            conn.sendall(b"E" + (0).to_bytes(4, "big"))
                            break

    thread = threading.Thread(target=other_gateway, daemon=True)
    thread.start()
    routes = RouteCache(cluster.controller_url, "host1")
    monkeypatch.setattr(routes, "route", lambda c, here=False: Route(c, "fake", address, True))
    bridges = Bridges(TcpTransport(), key, "host1", cluster.minions[0].socket_path,
                      unique("test-relay"), routes)  # fmt: skip
    try:
        with channels.open_topic(a_only, unique("t")) as topic:
            geometry = {"slots": 8, "slot_bytes": 64, "max_message": 64}
            request = {"name": topic.name, "from": cid(a_only), **geometry}
            first = bridges.open(request | {"to": "r-first"})["relay"]
            topic.grant([first])
            second = bridges.open(request | {"to": "r-second"})["relay"]
            topic.grant([second])
            assert first != second
            assert [a and a["readers"] for a in asked] == [["r-first"], ["r-second"]]
    finally:
        bridges.close()
        server.close()
        routes.close()
        thread.join(10)


def test_a_link_that_breaks_ends_the_reader_with_channel_broken(
    unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """host 2 goes off the network while the writer is held back by its reader there: the
    writer's blocked ``publish`` goes on once the link timeout has passed (the relay leaves),
    and the reader gets, in order, what had crossed, then ``ChannelBroken``: no hang."""
    require_native()
    folder = Path(f"/tmp/cdi-chan-{os.getpid()}-{time.monotonic_ns()}")
    monkeypatch.setenv("CDI_LINK_TIMEOUT_S", "2")  # the gateways' (the cluster's own)
    size, total = 64 << 10, 2000
    try:
        with LocalCluster.start(2, folder) as fresh:
            if fresh.network.kind != "netns":
                pytest.skip(f"dropping a link needs network namespaces ({fresh.network.reason})")
            namespace = fresh.network.hosts[1].namespace
            assert namespace is not None
            with (
                cdi.connect(fresh.minions[0].socket_path, unique("w")) as a,
                cdi.connect(fresh.minions[1].socket_path, unique("r")) as b,
                channels.open_topic(a, unique("t"), slots=8, slot_bytes=size) as topic,
            ):
                topic.grant([cid(b)])
                sub = channels.subscribe(b, topic.name, timeout=30)
                topic.wait_for_readers(1, timeout=30)
                published: list[int] = []
                done = threading.Event()

                def write() -> None:  # no timeout: only the relay leaving lets it go on
                    for number in range(total):
                        topic.publish(_message(number, size))
                        published.append(number)
                    done.set()

                writer = threading.Thread(target=write, daemon=True)
                writer.start()
                deadline = time.monotonic() + 30
                while True:  # until the writer is held back: its count stops growing
                    seen = len(published)
                    time.sleep(0.5)
                    assert time.monotonic() < deadline and not done.is_set(), seen
                    if len(published) == seen:
                        break
                subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
                try:
                    assert done.wait(20), f"the writer is still held back after {len(published)}"
                    got = 0
                    with pytest.raises(cdi.ChannelBroken):
                        while True:
                            _check(sub.receive(timeout=20), got, size)
                            got += 1
                    assert 0 < got < total
                    assert topic.readers == []
                finally:
                    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)
                writer.join(5)
                sub.close()
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _objects_left(cluster: LocalCluster) -> list[str]:
    """The keys of every object on either host, once a closed client's are reclaimed."""
    left: list[str] = []

    def none_left() -> bool:
        left.clear()
        for minion in cluster.minions:
            with cdi.Client(minion.socket_path) as probe:
                left.extend(o["key"] for o in probe.list_objects())
        return not left

    with contextlib.suppress(AssertionError):
        _wait_for(none_left, "objects left", timeout=5)
    return left


def _mirrors(socket_path: str, host: str) -> list[str]:
    """The gateway's mirror containers registered on ``host`` now."""
    with cdi.Client(socket_path) as probe:
        prefix = f"cdi-gateway.{host}.mirror"
        return [c for c in probe.stat()["containers"] if c.startswith(prefix)]


def _ring_readers(socket_path: str, name: str) -> list[str] | None:
    """Who holds a share of topic ``name``'s ring on that host (None: no ring there)."""
    with cdi.Client(socket_path) as probe:
        for listed in probe.list_objects():
            if listed["key"] == f"channel/{name}":
                return sorted(listed["readers"])
    return None


def _subscribed(
    topic: channels.Topic, reader: cdi.Client, *, published: int, read: int
) -> channels.Subscription:
    """``reader`` subscribes to ``topic``, which then publishes messages 0.. ``published`` - 1;
    it reads the first ``read`` of them."""
    sub = channels.subscribe(reader, topic.name, timeout=30)
    topic.wait_for_reader(cid(reader), timeout=30)
    for number in range(published):
        topic.publish(_message(number, 1000), timeout=30)
    for number in range(read):
        _check(sub.receive(timeout=30), number, 1000)
    return sub


def _read_new_stream(topic: channels.Topic, readers: list[cdi.Client], first: int) -> None:
    """Each of ``readers`` subscribes again and receives messages ``first``... of the topic,
    all of them, in order: nothing of an earlier stream."""
    with contextlib.ExitStack() as stack:
        subs = [stack.enter_context(channels.subscribe(c, topic.name, timeout=30)) for c in readers]
        topic.wait_for_readers(len(readers), timeout=30)
        for number in range(first, first + 50):
            topic.publish(_message(number, 1000), timeout=30)
        topic.close()
        for sub in subs:
            for number in range(first, first + 50):
                _check(sub.receive(timeout=30), number, 1000)
            with pytest.raises(cdi.ChannelClosed):
                sub.receive(timeout=30)


def test_readers_are_granted_again_after_the_link_broke(
    unique: Unique, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link breaks while a reader on host 2 has not read to the end of the mirror, and
    another one there is granted but has not subscribed: both still hold the mirror's ring,
    whose name a new mirror needs. Granting them again works all the same: the first reads
    what had arrived, then ``ChannelBroken``; the second's subscription to the old mirror says
    ``ChannelBroken``; then both subscribe again and receive the new stream, all of it and
    nothing of the old; no ring is left behind."""
    require_native()
    folder = Path(f"/tmp/cdi-chan-{os.getpid()}-{time.monotonic_ns()}")
    monkeypatch.setenv("CDI_LINK_TIMEOUT_S", "2")  # the gateways' (the cluster's own)
    try:
        with LocalCluster.start(2, folder) as fresh:
            if fresh.network.kind != "netns":
                pytest.skip(f"dropping a link needs network namespaces ({fresh.network.reason})")
            namespace, host = fresh.network.hosts[1].namespace, fresh.network.hosts[1].name
            assert namespace is not None
            there = fresh.minions[1]
            with (
                cdi.connect(fresh.minions[0].socket_path, unique("w")) as a,
                cdi.connect(there.socket_path, unique("r")) as b,
                cdi.connect(there.socket_path, unique("r")) as c,
                channels.open_topic(a, unique("t")) as topic,
            ):
                topic.grant([cid(b), cid(c)])
                old = _subscribed(topic, b, published=3, read=2)
                _wait_for(old.available, "message 2 never arrived")
                subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
                try:
                    _wait_for(lambda: topic.readers == [], "the relay did not leave")
                    _wait_for(lambda: not _mirrors(there.socket_path, host), "mirror kept")
                finally:
                    subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)
                # The broken mirror's ring is still there: its readers hold it, b until it has
                # read to its end, c until it subscribes (its grant is a share of it).
                assert _ring_readers(there.socket_path, topic.name) == sorted([cid(b), cid(c)])
                topic.grant([cid(b), cid(c)])
                _check(old.receive(timeout=30), 2, 1000)
                with pytest.raises(cdi.ChannelBroken):
                    old.receive(timeout=30)
                with pytest.raises(cdi.ChannelBroken):
                    channels.subscribe(c, topic.name, timeout=30)
                _read_new_stream(topic, [b, c], 100)
            assert _objects_left(fresh) == []  # the old ring too
    finally:
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def test_a_new_writer_of_the_name_grants_a_reader_that_holds_the_old_mirror(
    pair: tuple[cdi.Client, cdi.Client], cluster: LocalCluster, unique: Unique
) -> None:
    """The writer closes while the reader on host 2 has not read to the end, and a new writer
    of that name grants it again: the reader reads the rest of the first stream, then
    ``ChannelClosed``, and then the whole second stream through a new mirror."""
    a, b = pair
    name = unique("t")
    with channels.open_topic(a, name) as first:
        first.grant([cid(b)])
        old = channels.subscribe(b, name, timeout=30)
        first.wait_for_readers(1, timeout=30)
        for number in range(3):
            first.publish(_message(number, 1000), timeout=30)
        _check(old.receive(timeout=30), 0, 1000)
    with (
        cdi.connect(cluster.minions[0].socket_path, unique("w")) as a2,
        channels.open_topic(a2, name) as second,
    ):
        second.grant([cid(b)])  # while the reader holds the old mirror
        for number in range(1, 3):
            _check(old.receive(timeout=30), number, 1000)
        with pytest.raises(cdi.ChannelClosed):
            old.receive(timeout=30)
        _read_new_stream(second, [b], 100)


def test_a_stream_ends_once_no_reader_on_the_other_host_holds_it(
    a_only: cdi.Client, cluster: LocalCluster, unique: Unique
) -> None:
    """A reader on host 2 leaves while another there is granted but has not subscribed: the
    stream goes on (that one may still subscribe and read). Once it too has read and left,
    nobody there can read the mirror without a new grant: the stream ends (the relay leaves
    the writer's topic, the mirror and its ring go), and a reader granted there afterwards gets
    a new stream, all of it."""
    there = cluster.minions[1]
    with channels.open_topic(a_only, unique("t")) as topic:
        with (
            cdi.connect(there.socket_path, unique("r")) as b,
            cdi.connect(there.socket_path, unique("r")) as c,
        ):
            host = str(b.host)
            topic.grant([cid(b), cid(c)])
            _subscribed(topic, b, published=5, read=5)
            b.close()  # gone without closing its subscription
            _wait_for(lambda: _ring_readers(there.socket_path, topic.name) == [cid(c)], "b held")
            time.sleep(3)  # several of the mirror's checks: c's grant keeps the stream
            assert len(topic.readers) == 1 and _mirrors(there.socket_path, host)
            with channels.subscribe(c, topic.name, timeout=30) as second:
                topic.wait_for_readers(1, timeout=30)
                for number in range(5, 10):
                    topic.publish(_message(number, 1000), timeout=30)
                for number in range(5, 10):
                    _check(second.receive(timeout=30), number, 1000)
        _wait_for(lambda: topic.readers == [], "the relay stayed in the writer's topic")
        _wait_for(lambda: not _mirrors(there.socket_path, host), "the mirror stayed")
        assert _ring_readers(there.socket_path, topic.name) is None
        with cdi.connect(there.socket_path, unique("r")) as d:
            topic.grant([cid(d)])
            _read_new_stream(topic, [d], 100)
    assert _objects_left(cluster) == []
