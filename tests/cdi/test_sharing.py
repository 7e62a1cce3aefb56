"""Concurrent read-only sharing: many readers, no writer, then back to one owner."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import cdi
from tests.cdi.conftest import INTRUDER_UID, MinionProcess, as_uid, start_minion, stop_minion
from tests.cdi.test_isolation import actor, finish, read_json
from tests.cdi.test_lifecycle import wait_for

# Every test with the client's hot path native, then in Python (``client_path``).
pytestmark = pytest.mark.usefixtures("client_path")

Unique = Callable[[str], str]


def test_readers_share_one_object_and_the_owner_waits(
    minion: MinionProcess, unique: Unique
) -> None:
    owner, r1, r2 = (minion.client(unique(n)) for n in ("owner", "r1", "r2"))
    obj = owner.create(unique("k"), 10_000)
    mine = obj.access()
    mine[:6] = b"shared"
    readers = obj.share([r1.container_id or "", r2.container_id or ""])
    assert readers == [r1.container_id, r2.container_id]
    with pytest.raises(ValueError, match="released"):
        mine[0]  # the owner's views are revoked when it shares
    assert not obj.owned
    views = [r.use(obj.key).read(timeout=5) for r in (r1, r2)]
    assert all(v.readonly and bytes(v[:6]) == b"shared" for v in views)
    with pytest.raises(TypeError):
        views[0][0] = 0  # a read-only view
    array = r1.use(obj.key).numpy(readonly=True)
    assert not array.flags.writeable and bytes(array[:6]) == b"shared"
    with pytest.raises(ValueError, match="read-only"):
        array[0] = 1
    del array
    # Nobody writes while they read: the owner included.
    with pytest.raises(cdi.ObjectShared):
        obj.write(b"x")
    for attempt in (lambda: obj.transfer(r1.container_id or ""), obj.destroy,
                    lambda: obj.resize(5), lambda: obj.access(timeout=0)):  # fmt: skip
        with pytest.raises(cdi.ObjectShared):
            attempt()
    with pytest.raises(cdi.AccessTimeout):
        obj.access(timeout=0.1)
    assert bytes(obj.read(timeout=0)[:6]) == b"shared"  # the owner may read
    with pytest.raises(cdi.NotOwner):
        r1.use(obj.key).write(b"x")
    # Back to one owner once every reader has released.
    for client, view in zip((r1, r2), views, strict=True):
        view.release()
        assert client.use(obj.key).release() is True
        assert client.use(obj.key).release() is False  # once only
    with obj.view(timeout=5) as buf:
        buf[:7] = b"mine!!!"
    assert obj.owned
    assert obj.release() is False  # the owner holds no share; its read mapping goes
    obj.destroy()


def test_a_read_waits_for_the_share(minion: MinionProcess, unique: Unique) -> None:
    owner, reader = minion.client(unique("owner")), minion.client(unique("reader"))
    obj = owner.create(unique("k"), 100)
    obj.write(b"later")
    got: list[bytes] = []
    waiting = threading.Thread(
        target=lambda: got.append(bytes(reader.use(obj.key, check=False).read(timeout=10)[:5]))
    )
    waiting.start()
    wait_for(lambda: minion.stat()["waiters"] == 1, "the read to wait")
    obj.share([reader.container_id or ""])
    waiting.join(10)
    assert got == [b"later"]
    with pytest.raises(cdi.AccessTimeout):
        minion.client(unique("other")).use(obj.key).read(timeout=0.05)  # never named
    with reader.use(obj.key).reading() as view:  # read, then release on exit
        assert bytes(view[:5]) == b"later"
    obj.destroy()


def test_the_owner_can_wait_for_its_readers(minion: MinionProcess, unique: Unique) -> None:
    owner, reader, next_owner = (minion.client(unique(n)) for n in ("o", "r", "n"))
    obj = owner.create(unique("k"), 100)
    obj.share([reader.container_id or ""])
    theirs = reader.use(obj.key)
    theirs.read(timeout=5).release()
    releasing = threading.Timer(0.2, theirs.release)
    releasing.start()
    started = time.monotonic()
    obj.transfer(next_owner.container_id or "", timeout=10)  # waits for the release
    assert time.monotonic() - started >= 0.15
    releasing.join()
    next_owner.use(obj.key).destroy()


def test_a_list_by_key_is_that_object_with_its_readers(
    minion: MinionProcess, unique: Unique
) -> None:
    """``list_objects(key)``: the one object, as the whole list shows it (its readers too), or
    nothing for a key no object has."""
    owner, reader = (minion.client(unique(n)) for n in ("o", "r"))
    obj, other = owner.create(unique("k"), 100), owner.create(unique("k"), 10)
    obj.share([reader.container_id or ""])
    (listed,) = owner.list_objects(obj.key)
    assert listed == {o["key"]: o for o in owner.list_objects()}[obj.key]
    assert listed["readers"] == [reader.container_id] and listed["size"] == 100
    assert owner.list_objects(unique("missing")) == []
    with pytest.raises(cdi.InvalidArgument):
        owner.list_objects("bad key with spaces")
    reader.use(obj.key).release()
    assert owner.list_objects(obj.key)[0]["readers"] == []
    obj.destroy()
    other.destroy()
    assert owner.list_objects(obj.key) == []


def test_a_readers_view_in_use_stops_its_release(minion: MinionProcess, unique: Unique) -> None:
    owner, reader = minion.client(unique("o")), minion.client(unique("r"))
    obj = owner.create(unique("k"), 64)
    obj.share([reader.container_id or ""])
    theirs = reader.use(obj.key)
    array = np.frombuffer(theirs.read(timeout=5), dtype=np.uint8)
    with pytest.raises(cdi.BufferInUse):
        theirs.release()
    assert minion.stat()["objects"] and owner.use(obj.key).size == 64
    with pytest.raises(cdi.ObjectShared):
        obj.destroy()  # the share is still held
    del array
    assert theirs.release() is True
    obj.destroy()


def test_a_dead_readers_share_ends_with_it(minion: MinionProcess, unique: Unique) -> None:
    owner = minion.client(unique("owner"))
    obj = owner.create(unique("k"), 4096)
    obj.write(b"secret")
    reader_id = unique("reader")
    reading = actor("reader", minion.socket_path, reader_id, obj.key, "0")
    try:
        assert read_json(reading)["ready"]
        wait_for(lambda: reader_id in minion.stat()["containers"], "the reader to register")
        obj.share([reader_id])
        seen = read_json(reading)
        assert bytes.fromhex(str(seen["seen"])) == b"secret"
        with pytest.raises(cdi.ObjectShared):
            obj.write(b"x")
        os.kill(reading.pid, signal.SIGKILL)  # dies holding its share
    finally:
        reading.communicate(timeout=30)
    with obj.view(timeout=10) as buf:  # the owner's alone again
        buf[:3] = b"new"
    obj.destroy()


def test_a_shared_object_outlives_its_owner_until_released(
    minion: MinionProcess, unique: Unique
) -> None:
    owner, reader = minion.client(unique("owner")), minion.client(unique("reader"))
    obj = owner.create(unique("k"), 4096)
    obj.write(b"orphan")
    obj.share([reader.container_id or ""])
    before = int(str(minion.stat()["objects"]))
    owner.close()  # the owner dies; nobody can recover the object, but a reader holds it
    theirs = reader.use(obj.key)
    view = theirs.read(timeout=5)
    time.sleep(0.1)
    assert bytes(view[:6]) == b"orphan" and minion.stat()["objects"] == before
    view.release()
    theirs.release()
    wait_for(lambda: minion.stat()["objects"] == before - 1, "the object to be reclaimed")


@pytest.mark.parametrize("mode", ["strict", "cooperative"])
def test_a_reader_never_writes_even_behind_the_librarys_back(
    shared_dir: Path, unique: Unique, mode: str
) -> None:
    """Under another uid, the fd a reader gets is read-only for the kernel: no writable
    mapping, no write, no truncation, no writable reopen through /proc/self/fd, no seal."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the reader under another uid")
    directory = shared_dir / unique(f"share-{mode}")
    directory.mkdir()
    running = start_minion(directory, "--isolation", mode)
    try:
        owner = running.client(unique("owner"))
        obj = owner.create(unique("k"), 8192)
        obj.write(b"secret")
        reader_id = as_uid(INTRUDER_UID, unique("reader"))
        reading = actor("reader", running.socket_path, reader_id, obj.key, str(INTRUDER_UID))
        assert read_json(reading)["ready"]
        wait_for(lambda: reader_id in running.stat()["containers"], "the reader to register")
        obj.share([reader_id])
        tried = read_json(reading)
        assert tried["uid"] == INTRUDER_UID
        assert bytes.fromhex(str(tried["seen"])) == b"secret"
        assert tried["view"] == "TypeError" and tried["numpy_writeable"] is False
        assert tried["mmap_write"] == "EACCES", tried
        assert tried["mprotect"] == "EACCES", tried
        assert tried["reopen"] == "EACCES", tried
        assert tried["write"] == "EBADF" and tried["truncate"] in ("EINVAL", "EBADF"), tried
        assert tried["seal"] == "EPERM", tried
        with pytest.raises(cdi.ObjectShared):
            obj.write(b"x")
        assert reading.stdin is not None
        reading.stdin.write("go\n")
        reading.stdin.flush()
        assert read_json(reading)["released"] is True
        assert bytes(obj.access(timeout=10)[:6]) == b"secret"  # untouched, and ours again
        assert finish(reading) == 0
        obj.destroy()
    finally:
        stop_minion(running)


def test_strict_sharing_revokes_the_owner_and_then_the_readers(
    shared_dir: Path, unique: Unique
) -> None:
    """Strict: the object moves to a fresh segment when its share starts (a mapping the
    owner kept faults) and again when it ends (so a reader's kept mapping faults)."""
    directory = shared_dir / unique("share-strict-moves")
    directory.mkdir()
    running = start_minion(directory, "--isolation", "strict")
    try:
        owner, reader = running.client(unique("owner")), running.client(unique("reader"))
        obj = owner.create(unique("k"), 4096)
        obj.write(b"v1")
        first = _segment_of(running, obj.key)
        obj.share([reader.container_id or ""])
        during = _segment_of(running, obj.key)
        theirs = reader.use(obj.key)
        assert bytes(theirs.read(timeout=5)[:2]) == b"v1"
        theirs.release()
        after = _segment_of(running, obj.key)
        assert len({first, during, after}) == 3
        obj.destroy()
    finally:
        stop_minion(running)


def _segment_of(running: MinionProcess, key: str) -> int:
    with cdi.Client(running.socket_path) as probe:
        objects = {o["key"]: o for o in probe.list_objects()}
    return int(objects[key]["segment"])
