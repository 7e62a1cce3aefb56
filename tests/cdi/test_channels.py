"""Channels (``cdi.channels``) between real processes, through a real minion (both kinds).

No timing thresholds: timeouts here only bound how long a test may hang."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

import cdi
from cdi import channels
from cdi.channels import BackPressure
from cdi.channels.subscription import STOP_S
from tests.cdi.conftest import INTRUDER_UID, ROOT, MinionProcess, as_uid
from tests.cdi.test_isolation import actor, read_json

Unique = Callable[[str], str]


@contextmanager
def reaped(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


def granted(topic: channels.Topic, reader: str, process: subprocess.Popen[str]) -> None:
    """Grant ``reader`` (an actor that registers as it starts) and wait until it joined."""
    while True:
        try:
            topic.grant([reader])
            break
        except cdi.UnknownContainer:
            assert process.poll() is None, "the reader exited before it registered"
            time.sleep(0.01)
    assert read_json(process)["joined"] is True
    assert reader in topic.readers


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def channel_objects(minion: MinionProcess) -> list[str]:
    with cdi.connect(minion.socket_path, f"probe-{os.getpid()}") as probe:
        return [o["key"] for o in probe.list_objects() if o["key"].startswith("channel/")]


def test_two_processes_exchange_messages_of_every_size(
    minion: MinionProcess, unique: Unique
) -> None:
    writer = minion.client(unique("writer"))
    name, reader = unique("topic"), unique("reader")
    messages = [b"", b"x", os.urandom(16), os.urandom(100_000), os.urandom(5_000_000)]
    messages += [f"m{i}".encode() for i in range(300)]  # several times round the ring
    topic = channels.open_topic(writer, name, slots=8, slot_bytes=64 << 10)
    with reaped(
        actor("channel_subscriber", minion.socket_path, reader, name, str(len(messages)), "-")
    ) as p:
        granted(topic, reader, p)
        for message in messages:
            topic.publish(message)
        report = read_json(p)
        topic.close()
        assert report["lengths"] == [len(m) for m in messages]
        assert report["digests"] == [sha(m) for m in messages]  # the 5 MB one came in chunks
        assert read_json(p)["after"] == "closed"
        assert p.wait(timeout=30) == 0
    assert channel_objects(minion) == []  # ring and cursor are freed, nothing else is left


def test_a_container_not_granted_cannot_map_the_ring(minion: MinionProcess, unique: Unique) -> None:
    writer = minion.client(unique("writer"))
    name = unique("topic")
    with channels.open_topic(writer, name, readers=[]) as topic:
        topic.publish(b"secret")
        same_uid = actor("channel_intruder", minion.socket_path, unique("intruder"), name, "0")
        with reaped(same_uid) as p:
            # It sees the object (same uid), but the minion hands its memory to no one else.
            assert read_json(p) == {"subscribe": "AccessTimeout", "read": "NotOwner"}
        if os.geteuid() == 0:
            cid = as_uid(INTRUDER_UID, unique("intruder"))
            other_uid = actor("channel_intruder", minion.socket_path, cid, name, str(INTRUDER_UID))
            with reaped(other_uid) as p:
                assert read_json(p) == {"subscribe": "AccessTimeout", "read": "ObjectNotFound"}


def test_a_slow_reader_holds_the_writer_back_per_its_policy(
    minion: MinionProcess, unique: Unique
) -> None:
    writer = minion.client(unique("writer"))
    name, reader = unique("topic"), unique("reader")
    topic = channels.open_topic(writer, name, slots=4, slot_bytes=64, policy=BackPressure.FAIL)
    with reaped(actor("channel_subscriber", minion.socket_path, reader, name, "6", "hold")) as p:
        granted(topic, reader, p)
        for i in range(4):
            topic.publish(b"early %d" % i)
        with pytest.raises(cdi.ChannelFull, match="has not read message 1"):
            topic.publish(b"one too many")
        topic.policy = BackPressure.BLOCK
        with pytest.raises(cdi.ChannelFull, match="4 messages behind"):
            topic.publish(b"waits, then gives up", timeout=0.05)
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
        topic.publish(b"late 0")  # waits for the reader, however long it takes
        topic.publish(b"late 1")
        report = read_json(p)
        topic.close()
    expected = [b"early %d" % i for i in range(4)] + [b"late 0", b"late 1"]
    assert report["digests"] == [sha(m) for m in expected]  # nothing lost, nothing torn


def test_a_reader_that_dies_stops_holding_the_writer_back(
    minion: MinionProcess, unique: Unique
) -> None:
    writer = minion.client(unique("writer"))
    name, reader = unique("topic"), unique("reader")
    topic = channels.open_topic(writer, name, slots=2, slot_bytes=64)
    with reaped(actor("channel_subscriber", minion.socket_path, reader, name, "100", "hold")) as p:
        granted(topic, reader, p)
        topic.publish(b"a")
        topic.publish(b"b")
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        topic.publish(b"c")  # blocks until the writer finds the reader gone
        assert topic.readers == []
    topic.close()
    assert channel_objects(minion) == []  # the dead reader's cursor went too


def test_readers_learn_when_the_writer_dies(minion: MinionProcess, unique: Unique) -> None:
    name, reader = unique("topic"), unique("reader")
    code = (
        "import sys, cdi; from cdi import channels\n"
        "c = cdi.connect(sys.argv[1], sys.argv[2])\n"
        "t = channels.open_topic(c, sys.argv[3], readers=[sys.argv[4]])\n"
        "t.wait_for_readers(1, timeout=30); t.publish(b'last words')\n"
        "print('published', flush=True); sys.stdin.readline()\n"
    )
    client = minion.client(reader)
    writer_cid = unique("writer")
    process = subprocess.Popen(
        [sys.executable, "-c", code, minion.socket_path, writer_cid, name, reader],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    with reaped(process) as p:
        sub = channels.subscribe(client, name, timeout=30)
        assert p.stdout is not None and p.stdout.readline() == "published\n"
        assert sub.receive(timeout=30) == b"last words"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        with pytest.raises(cdi.ChannelClosed, match="is gone"):
            sub.receive(timeout=30)
    assert channel_objects(minion) == []  # the dead writer's ring went with our share


def test_a_writer_closing_between_a_readers_two_looks_gives_the_reader_its_reason(
    minion: MinionProcess, unique: Unique
) -> None:
    """A waiting reader looks at the ring's closed word, then, now and then, at whether the
    writer still holds its cursor. A writer that closes in between (a gateway whose link broke)
    has let go of the cursor by the second look: the reader gets that reason (``ChannelBroken``),
    not that the writer is gone. The second look is made here by hand, after the close."""
    name, reader = unique("topic"), unique("reader")
    writer, listener = minion.client(unique("writer")), minion.client(reader)
    with channels.open_topic(writer, name, readers=[reader]) as topic:
        sub = channels.subscribe(listener, name, timeout=30)
        topic.wait_for_readers(1, timeout=30)
        topic.close(broken=True)
        with pytest.raises(cdi.ChannelBroken, match="broke"):
            sub._check_writer()
    writer.close()
    assert channel_objects(minion) == []  # the ring went with its writer's client


def test_a_stream_carries_messages_both_ways(minion: MinionProcess, unique: Unique) -> None:
    me, peer, name = unique("left"), unique("right"), unique("stream")
    client = minion.client(me)
    with reaped(actor("channel_echo", minion.socket_path, peer, name, me)) as p:
        stream = channels.open_stream(client, name, peer, timeout=30)
        assert read_json(p)["open"] is True
        for message in (b"ping", os.urandom(200_000), b""):
            stream.send(message)
            assert stream.receive(timeout=30) == message[::-1]
        stream.close()
        assert read_json(p)["done"] is True
        assert p.wait(timeout=30) == 0
    assert channel_objects(minion) == []


def test_a_stream_opens_only_once_the_peer_reads_it(minion: MinionProcess, unique: Unique) -> None:
    """``open_stream`` returns once the peer has joined our side too: a message sent at once
    reaches a peer that subscribes late (here: it grants, then waits before it subscribes)."""
    me, peer, name = unique("early"), unique("late"), unique("stream")
    ours, theirs = minion.client(me), minion.client(peer)
    sent = threading.Event()

    def open_and_send() -> None:
        with channels.open_stream(ours, name, peer, timeout=30) as stream:
            stream.send(b"hello")
            sent.set()
            assert stream.receive(timeout=30) == b"bye"

    opener = threading.Thread(target=open_and_send)
    opener.start()
    try:
        with channels.open_topic(theirs, f"{name}.{peer}") as back:
            while True:
                try:
                    back.grant([me])
                    break
                except cdi.UnknownContainer:
                    time.sleep(0.01)
            back.wait_for_readers(1, timeout=30)
            assert not sent.wait(0.5), "the stream opened before the peer read it"
            with channels.subscribe(theirs, f"{name}.{me}", timeout=30) as inbound:
                assert inbound.receive(timeout=30) == b"hello"
                back.publish(b"bye")
    finally:
        opener.join(timeout=60)
    assert sent.is_set() and not opener.is_alive()


def test_a_ring_its_reader_still_maps_goes_once_the_reader_leaves(
    minion: MinionProcess, unique: Unique
) -> None:
    """A writer that closes while a reader still maps the ring cannot free it then; it is freed
    once the reader leaves, though the writer's client stays open (a worker's does)."""
    name = unique("left")
    writer, reader = minion.client(unique("w")), minion.client(unique("r"))
    assert reader.container_id is not None
    topic = channels.open_topic(writer, name)
    topic.grant([reader.container_id])
    with channels.subscribe(reader, name, timeout=30) as sub:
        topic.wait_for_readers(1, timeout=30)
        topic.publish(b"last")
        topic.close(linger=0.1)
        assert any(key.startswith(f"channel/{name}") for key in channel_objects(minion))
        assert sub.receive(timeout=30) == b"last"
        with pytest.raises(cdi.ChannelClosed):
            sub.receive(timeout=30)
    deadline = time.monotonic() + 30
    while channel_objects(minion) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert channel_objects(minion) == []


def test_a_subscribe_with_a_stop_is_one_subscription_through_its_slices_until_stopped(
    minion: MinionProcess, unique: Unique
) -> None:
    """Given a ``stop``, a subscribe waits in slices to look at it, yet stays one subscription
    (one cursor, never left and joined anew): a writer that grants it several slices late and
    admits it later still gets this reader; once ``stop`` is set, it gives up."""
    name, never = unique("late"), unique("never")
    writer, reader = minion.client(unique("w")), minion.client(unique("r"))
    me = reader.container_id
    assert me is not None
    stop = threading.Event()
    topic = channels.open_topic(writer, name)

    def grant_late() -> None:
        time.sleep(3 * STOP_S)
        topic.grant([me])
        time.sleep(3 * STOP_S)
        assert topic.wait_for_readers(1, timeout=30) == [me]
        topic.publish(b"late")

    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(grant_late)
        with channels.subscribe(reader, name, timeout=60, stop=stop) as sub:
            later.result(timeout=60)
            assert sub.receive(timeout=30) == b"late"
    topic.close()
    with channels.open_topic(writer, never):  # never granted: only the stop ends the wait
        timer = threading.Timer(2 * STOP_S, stop.set)
        timer.start()
        try:
            with pytest.raises(cdi.AccessTimeout, match="stopped"):
                channels.subscribe(reader, never, timeout=600, stop=stop)
        finally:
            timer.cancel()


@pytest.mark.parametrize("isolation", ["cooperative", "strict"])
def test_a_live_share_lets_the_owner_write_on(
    minion: MinionProcess, unique: Unique, isolation: str
) -> None:
    owner, reader = minion.client(unique("owner")), minion.client(unique("reader"))
    assert owner.container_id is not None and reader.container_id is not None
    obj = owner.create(unique("ring"), 4096, isolation=isolation)
    view = obj.access()
    assert obj.share([reader.container_id], live=True) == [reader.container_id]
    if isolation == "strict":  # the share moved it to fresh memory: the minion grants that
        view.release()
        view = obj.access(timeout=0)
    view[:5] = b"hello"  # the owner writes on
    seen = reader.use(obj.key).read(timeout=0)
    assert bytes(seen[:5]) == b"hello"
    view[:5] = b"world"
    assert bytes(seen[:5]) == b"world"  # the reader sees each write as it happens
    view.release()
    third = minion.client(unique("third")).container_id
    assert third is not None
    with pytest.raises(cdi.InvalidArgument, match="same kind"):
        obj.share([third])  # a read-only share while a live one is held
    with pytest.raises(cdi.ObjectShared):
        obj.transfer(reader.container_id)
    seen.release()
    assert reader.use(obj.key).release() is True
    obj.destroy()


def test_bad_arguments_get_the_package_errors(minion: MinionProcess, unique: Unique) -> None:
    client = minion.client(unique("writer"))
    with pytest.raises(cdi.InvalidArgument, match="without '/'"):
        channels.open_topic(client, "a/b")
    with pytest.raises(cdi.InvalidArgument, match="slots"):
        channels.open_topic(client, unique("t"), slots=1)
    with (
        channels.open_topic(client, unique("t"), max_message=10) as topic,
        pytest.raises(cdi.InvalidArgument, match="max_message"),
    ):
        topic.publish(b"x" * 11)
    with pytest.raises(cdi.ObjectNotFound):
        channels.subscribe(client, unique("absent"), timeout=0)


def test_a_message_cut_short_is_dropped_and_a_refused_one_never_starts(
    minion: MinionProcess, unique: Unique
) -> None:
    writer, reader = minion.client(unique("writer")), minion.client(unique("reader"))
    assert reader.container_id is not None
    name = unique("topic")
    topic = channels.open_topic(
        writer, name, readers=[reader.container_id], slots=4, slot_bytes=64,
        policy=BackPressure.FAIL,
    )  # fmt: skip
    sub = channels.subscribe(reader, name, timeout=30)
    for i in range(3):
        topic.publish(b"small %d" % i)
    with pytest.raises(cdi.ChannelFull):
        topic.publish(bytes(200))  # four slots; one is free: nothing of it is written
    assert [sub.receive(timeout=30) for _ in range(3)] == [b"small %d" % i for i in range(3)]
    # Longer than the whole ring: it waits chunk by chunk, and gives up after its timeout.
    with pytest.raises(cdi.ChannelFull, match="behind"):
        topic.publish(os.urandom(64 * 10), timeout=0.05)
    topic.policy = BackPressure.BLOCK
    with ThreadPoolExecutor(1) as pool:
        received = pool.submit(sub.receive, 30)  # reads the four chunks that went out
        topic.publish(b"after", timeout=30)  # once the reader has made room
        assert received.result(timeout=30) == b"after"  # the cut message is dropped
    sub.close()
    topic.close()
