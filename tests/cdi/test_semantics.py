"""The paper's CDI semantics, each against a real minion process."""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable

import msgpack
import numpy as np
import pytest

import cdi
from cdi import codes
from tests.cdi.conftest import MinionProcess

# Every test with the client's hot path native, then in Python (``client_path``).
pytestmark = pytest.mark.usefixtures("client_path")

Unique = Callable[[str], str]


def test_creator_owns_and_others_get_not_owner(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    key = unique("k")
    obj = a.create(key, 1000)
    obj.write(b"secret")
    assert obj.owned
    theirs = b.use(key)
    assert theirs.size == 1000
    for attempt in (
        lambda: theirs.read(timeout=0),
        lambda: theirs.write(b"x"),
        lambda: theirs.copy(unique("copy")),
        lambda: theirs.transfer(a.container_id or ""),
        lambda: theirs.resize(10),
        theirs.destroy,
    ):
        with pytest.raises(cdi.NotOwner):
            attempt()
    assert bytes(obj.read()[:6]) == b"secret"  # nothing the non-owner did changed the object
    obj.destroy()


def test_an_unchecked_handle_asks_the_minion_only_when_used(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    missing = b.use(unique("missing"), check=False)  # no round trip: nothing to refuse yet
    assert "size=None" in repr(missing)
    for attempt in (lambda: missing.size, lambda: missing.access(timeout=1), missing.destroy):
        with pytest.raises(cdi.ObjectNotFound):
            attempt()
    obj = a.create(unique("k"), 300)
    obj.write(b"handed over")
    mine = a.use(obj.key, check=False)
    mine.transfer(b.container_id or "")  # same rules as a checked handle: a's to give
    theirs = b.use(obj.key, check=False)
    assert theirs.size == 300
    with theirs.view(timeout=5) as buf:
        assert bytes(buf[:11]) == b"handed over"
    with pytest.raises(cdi.NotOwner):
        a.use(obj.key, check=False).transfer(a.container_id or "")  # no longer a's
    theirs.destroy()


def test_transfer_moves_ownership_and_revokes_the_old_owners_views(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    key = unique("k")
    obj = a.create(key, 4096)
    view = obj.access()
    view[:5] = b"hello"
    obj.transfer(b.container_id or "")
    with pytest.raises(ValueError, match="released"):
        view[0]  # the old owner's view is revoked in the same call
    with pytest.raises(cdi.NotOwner):
        obj.read(timeout=0)
    theirs = b.use(key)
    assert bytes(theirs.access(timeout=5)[:5]) == b"hello"  # zero-copy: the same bytes
    theirs.destroy()


def test_numpy_view_is_zero_copy_and_blocks_transfer_while_held(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 64)
    array = obj.numpy(np.uint32)
    array[:] = np.arange(16, dtype=np.uint32)
    with pytest.raises(cdi.BufferInUse):
        obj.transfer(b.container_id or "")
    assert obj.owned  # the refused transfer changed nothing
    del array
    obj.transfer(b.container_id or "")
    theirs = b.use(obj.key)
    assert list(theirs.numpy(np.uint32, timeout=5)) == list(range(16))
    theirs.destroy()


@pytest.mark.parametrize("holder", ["numpy", "slice", "buffer"])
def test_a_refused_transfer_leaves_every_view_usable(
    minion: MinionProcess, unique: Unique, holder: str
) -> None:
    """``BufferInUse`` refuses before any view is released: the caller's earlier views, and
    the one still held, go on working, and the transfer succeeds once the holder lets go."""
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 64)
    first = obj.access()
    first[0] = 7
    second = obj.access()
    held: object
    if holder == "numpy":
        held = np.frombuffer(second, dtype=np.uint8)
    elif holder == "slice":
        held = second[8:16]
    else:
        held = pickle.PickleBuffer(second)  # a buffer taken from the view itself
    operations: list[Callable[[], None]] = [
        lambda: obj.transfer(b.container_id or ""),
        obj.destroy,
        lambda: obj.resize(32),
    ]
    for operation in operations:
        with pytest.raises(cdi.BufferInUse):
            operation()
        assert obj.owned
        first[1] = 8  # still a live view of the object: nothing was revoked
        assert bytes(second[:2]) == b"\x07\x08"
    if isinstance(held, pickle.PickleBuffer):
        held.release()
    del held
    obj.transfer(b.container_id or "")
    with pytest.raises(ValueError, match="released"):
        first[0]
    assert bytes(b.use(obj.key).access(timeout=5)[:2]) == b"\x07\x08"
    b.use(obj.key).destroy()


def test_transfer_with_detach_leaves_a_held_view_mapped(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 64)
    array = obj.numpy()
    array[:4] = [1, 2, 3, 4]
    obj.transfer(
        b.container_id or "", detach=True
    )  # what a worker exiting with a stuck thread does
    assert not obj.owned
    theirs = b.use(obj.key)
    view = theirs.access(timeout=5)
    assert bytes(view[:4]) == b"\x01\x02\x03\x04"
    view[0] = 9
    assert array[0] == 9  # cooperative: the detached view still maps the same memory
    view.release()
    with pytest.raises(cdi.NotOwner):
        obj.read(timeout=0)
    del array
    theirs.destroy()


def test_strict_objects_cannot_be_detached(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 64, isolation="strict")
    array = obj.numpy()
    with pytest.raises(cdi.BufferInUse):
        obj.transfer(b.container_id or "", detach=True)  # its segment is about to be truncated
    assert obj.owned
    del array
    obj.destroy()


def test_access_blocks_until_ownership_arrives(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 100)
    obj.write(b"payload")
    theirs = b.use(obj.key)
    got: list[bytes] = []
    waiter = threading.Thread(target=lambda: got.append(bytes(theirs.access(timeout=30)[:7])))
    waiter.start()
    time.sleep(0.2)
    assert waiter.is_alive() and not got  # still blocked: it does not own the object yet
    obj.transfer(b.container_id or "")
    waiter.join(timeout=30)
    assert got == [b"payload"]
    theirs.destroy()


def test_access_honours_its_timeout_and_recovers(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 100)
    theirs = b.use(obj.key)
    started = time.monotonic()
    with pytest.raises(cdi.AccessTimeout):
        theirs.access(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert codes.access(theirs, timeout=0.05) == -1
    obj.transfer(b.container_id or "")  # a late transfer still lands
    assert theirs.access(timeout=5) is not None
    assert b.stat()["waiters"] == 0  # the cancelled waits left nothing behind
    theirs.destroy()


def test_create_of_an_existing_key(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    key = unique("k")
    obj = a.create(key, 10)
    with pytest.raises(cdi.KeyExists):
        b.create(key, 10)
    assert codes.create(b, key, 10) == (0, None)
    rc, made = codes.create(b, unique("new"), 10)
    assert rc == 1 and made is not None
    assert codes.use(a, unique("missing")) == (0, None)
    assert codes.transfer(b.use(key), a.container_id or "") == -1  # b is not the owner
    assert codes.transfer(b.use(key), b.container_id or "") == -1  # not even to itself
    assert codes.destroy(made) == 1
    obj.destroy()


def test_two_concurrent_transfers_cannot_both_succeed(
    minion: MinionProcess, unique: Unique
) -> None:
    """Two transfer requests of one object reach the minion back to back: one wins."""
    owner, b, c = (minion.client(unique(n)) for n in "abc")
    obj = owner.create(unique("k"), 10)
    # A container has one connection, so race from the owner's own socket by pipelining both
    # requests without waiting for the first reply: the minion must order them.
    sock = owner._session.conn._sock
    assert sock is not None
    mapping = owner._session.owned.revoke(obj.key)
    assert mapping is not None
    mapping.close(obj.key)
    for request_id, to in ((9001, b.container_id), (9002, c.container_id)):
        sock.send(msgpack.packb({"op": "transfer", "id": request_id, "key": obj.key, "to": to}))
    replies = [msgpack.unpackb(sock.recv(4096)) for _ in range(2)]
    outcomes = sorted(bool(r["ok"]) for r in replies)
    assert outcomes == [False, True]
    loser = next(r for r in replies if not r["ok"])
    assert loser["code"] == "not_owner"
    owners = [x for x in (b, c) if _owns(x, obj.key)]
    assert len(owners) == 1
    owners[0].use(obj.key).destroy()


def _owns(client: cdi.Client, key: str) -> bool:
    try:
        client.use(key).read(timeout=0)
    except cdi.NotOwner:
        return False
    return True


def test_racing_threads_transfer_exactly_once(minion: MinionProcess, unique: Unique) -> None:
    owner = minion.client(unique("owner"))
    targets = [minion.client(unique(f"t{i}")) for i in range(4)]
    obj = owner.create(unique("k"), 10)
    results: list[str] = []
    barrier = threading.Barrier(len(targets))

    def attempt(target: cdi.Client) -> None:
        barrier.wait()
        try:
            obj.transfer(target.container_id or "")
            results.append("ok")
        except cdi.NotOwner:
            results.append("not_owner")

    threads = [threading.Thread(target=attempt, args=(t,)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == ["not_owner"] * 3 + ["ok"]
    assert sum(_owns(t, obj.key) for t in targets) == 1
    next(t for t in targets if _owns(t, obj.key)).use(obj.key).destroy()


def test_copy_is_independent(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 8)
    obj.write(b"original")
    twin = obj.copy(unique("twin"))
    twin.write(b"changed!")
    assert bytes(obj.read()) == b"original"
    with pytest.raises(cdi.KeyExists):
        obj.copy(twin.key)
    twin.transfer(b.container_id or "")
    assert bytes(b.use(twin.key).read()) == b"changed!"
    b.use(twin.key).destroy()
    obj.destroy()


def test_resize_keeps_data_within_and_beyond_capacity(
    minion: MinionProcess, unique: Unique
) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 100)
    obj.write(b"keep me")
    obj.resize(3000)  # within the same size class
    assert obj.size == 3000 and bytes(obj.read()[:7]) == b"keep me"
    assert bytes(obj.read()[100:3000]) == bytes(2900)  # growth reads as zeros
    obj.resize(5_000_000)  # a bigger segment: the minion copies
    assert obj.size == 5_000_000 and bytes(obj.read()[:7]) == b"keep me"
    obj.resize(4)
    assert bytes(obj.read()) == b"keep"
    with pytest.raises(cdi.NotOwner):
        b.use(obj.key).resize(10)
    with pytest.raises(cdi.InvalidArgument):
        obj.resize(-1)
    obj.destroy()


def test_destroy_wakes_waiters_with_a_clear_error(minion: MinionProcess, unique: Unique) -> None:
    a, b = minion.client(unique("a")), minion.client(unique("b"))
    obj = a.create(unique("k"), 10)
    theirs = b.use(obj.key)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            theirs.access(timeout=30)
        except cdi.CDIError as exc:
            errors.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.1)
    obj.destroy()
    waiter.join(timeout=30)
    assert len(errors) == 1 and isinstance(errors[0], cdi.ObjectNotFound)
    with pytest.raises(cdi.ObjectNotFound):
        b.use(obj.key)
