"""Objects outlive neither their usefulness nor their owners: recovery and reclamation."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest

import cdi
from cdi.protocol import Op
from tests.cdi.conftest import MinionProcess
from tests.cdi.test_isolation import actor, read_json

Unique = Callable[[str], str]


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def test_object_of_a_killed_owner_returns_to_its_recovery_container(
    minion: MinionProcess, unique: Unique
) -> None:
    creator = minion.client(unique("creator"))
    obj = creator.create(unique("k"), 1000)
    obj.write(b"intact input")
    worker_id = unique("worker")
    holder = actor("holder", minion.socket_path, worker_id, obj.key)
    try:
        wait_for(lambda: worker_id in minion.stat()["containers"], "the worker to register")
        obj.transfer(worker_id)
        ready = read_json(holder)
        assert ready["ready"]
        os.kill(int(str(ready["pid"])), signal.SIGKILL)  # dies while owning the object
    finally:
        holder.communicate(timeout=30)
    data = obj.access(timeout=10)  # ownership comes back to the creator
    assert bytes(data[:7]) == b"touched"  # what the worker wrote before dying is kept
    data.release()
    obj.destroy()


def test_an_owner_that_forked_and_died_is_noticed_by_its_process(
    minion: MinionProcess, unique: Unique
) -> None:
    """The owner forks a child without exec (which keeps the socket open) and dies: its object
    comes back to the recovery container at once, while the child still lives."""
    creator = minion.client(unique("creator"))
    obj = creator.create(unique("k"), 100)
    owner_id = unique("forker")
    forker = actor("forking_owner", minion.socket_path, owner_id, obj.key)
    child = 0
    try:
        wait_for(lambda: owner_id in minion.stat()["containers"], "the owner to register")
        obj.transfer(owner_id)
        child = int(str(read_json(forker)["child"]))
        assert forker.wait(10) == 0  # the owner is gone; its child holds the socket
        obj.access(timeout=10).release()  # recovered although the socket is still open
        assert os.path.exists(f"/proc/{child}"), "the child should still be alive"
        assert owner_id not in minion.stat()["containers"]
    finally:
        if child:
            os.kill(child, signal.SIGKILL)
        forker.communicate(timeout=30)
    obj.destroy()


def test_recovery_can_name_another_container(minion: MinionProcess, unique: Unique) -> None:
    creator, rescuer = minion.client(unique("creator")), minion.client(unique("rescuer"))
    obj = creator.create(unique("k"), 10, recovery=rescuer.container_id)
    doomed = minion.client(unique("doomed"))
    obj.transfer(doomed.container_id or "")
    doomed.close()  # the owner goes away
    assert bytes(rescuer.use(obj.key).read()) == bytes(10)
    rescuer.use(obj.key).destroy()


def test_objects_nobody_can_hold_are_reclaimed(minion: MinionProcess, unique: Unique) -> None:
    before = minion.stat()
    lonely = minion.client(unique("lonely"))
    for i in range(3):
        lonely.create(unique(f"k{i}"), 100_000)
    assert minion.stat()["objects"] == int(str(before["objects"])) + 3
    lonely.close()  # creator and owner gone: nobody can recover these objects
    wait_for(lambda: minion.stat()["objects"] == before["objects"], "reclamation")
    assert minion.stat()["used_segments"] == before["used_segments"]


def test_released_memory_is_zeroed_and_reused(minion: MinionProcess, unique: Unique) -> None:
    a = minion.client(unique("a"))
    first = a.create(unique("k"), 300_000)
    first.write(b"old data of someone else")
    first.destroy()
    reuses = int(str(minion.stat()["reuses"]))
    second = a.create(unique("k"), 300_000)  # same size class: a warm segment, no allocation
    assert int(str(minion.stat()["reuses"])) == reuses + 1
    assert bytes(second.read()[:24]) == bytes(24)
    second.destroy()


def test_a_creator_that_overwrites_skips_zeroing_its_own_uids_bytes(
    minion: MinionProcess, unique: Unique
) -> None:
    """``zeroed=False``: recycled memory only our uid has used is handed out as it is."""
    a = minion.client(unique("a"))
    size = 40 * 4096  # its size class (33 to 40 pages) is used by no other test
    first = a.create(unique("k"), size)
    first.write(b"our own old bytes")
    first.destroy()
    zeroed = int(str(minion.stat()["zeroed_bytes"]))
    second = a.create(unique("k"), size, zeroed=False)
    assert int(str(minion.stat()["zeroed_bytes"])) == zeroed  # no pass over the memory
    assert bytes(second.read()[:17]) == b"our own old bytes"
    second.write(b"x" * size)
    second.destroy()
    # A smaller object of the same class: the old bytes beyond its size are zeroed anyway, or
    # they would travel with the object to whoever gets it next.
    smaller = a.create(unique("k"), 34 * 4096, zeroed=False)
    assert a._session.owned.maps[smaller.key].capacity == size
    raw = a._session.owned.maps[
        smaller.key
    ].mm  # the whole capacity, as a reader bypassing views maps it
    assert raw[: 34 * 4096] == b"x" * (34 * 4096)
    assert raw[34 * 4096 : size] == bytes(6 * 4096)
    smaller.destroy()
    third = a.create(unique("k"), size)  # the default: zeros, whoever wrote before
    assert bytes(third.read()) == bytes(size)
    third.destroy()
    with pytest.raises(cdi.InvalidArgument, match="zeroed must be true or false"):
        a._session.conn.call(Op.CREATE, key=unique("k"), size=10, zeroed="no")


def test_a_dead_waiter_leaves_nothing_behind(minion: MinionProcess, unique: Unique) -> None:
    a = minion.client(unique("a"))
    obj = a.create(unique("k"), 10)
    waiter = minion.client(unique("w"))
    with pytest.raises(cdi.AccessTimeout):
        waiter.use(obj.key).access(timeout=0.05)
    waiter.close()
    assert minion.stat()["waiters"] == 0
    obj.destroy()
