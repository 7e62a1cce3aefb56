"""Cross-host CDI: the same application code moves an object to a container on another host."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import cdi
from cdi.cluster import LocalCluster
from cdi.controller.client import ControllerClient
from cdi.protocol import Op

Unique = Callable[[str], str]


@pytest.fixture
def pair(cluster: LocalCluster, unique: Unique) -> Iterator[tuple[cdi.Client, cdi.Client]]:
    """A container on each host."""
    a = cdi.connect(cluster.minions[0].socket_path, unique("a"))
    b = cdi.connect(cluster.minions[1].socket_path, unique("b"))
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def cid(client: cdi.Client) -> str:
    assert client.container_id is not None
    return client.container_id


def _filled(client: cdi.Client, key: str, size: int) -> tuple[cdi.CDIObject, str]:
    data = os.urandom(size)
    obj = client.create(key, size)
    obj.write(data)
    return obj, hashlib.sha256(data).hexdigest()


def _digest(view: memoryview) -> str:
    return hashlib.sha256(view).hexdigest()


def test_an_object_crosses_and_comes_back_intact(
    cluster: LocalCluster, pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    assert a.host != b.host
    key = unique("k")
    obj, digest = _filled(a, key, 3_000_001)
    view = obj.access()
    obj.transfer(cid(b))  # the same call as on one host
    with pytest.raises(ValueError):
        view[0]  # the sender's views are revoked
    with pytest.raises(cdi.ObjectNotFound):
        obj.read()  # its home moved: nothing of it is left on the sender's host
    theirs = b.use(key)
    assert theirs.size == 3_000_001
    with theirs.view(timeout=10) as got:
        assert _digest(got) == digest
    theirs.transfer(cid(a))
    with a.use(key, check=False).view(timeout=10) as back:
        assert _digest(back) == digest
    a.use(key).destroy()


def test_the_receivers_access_blocks_until_the_bytes_have_landed(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    key = unique("k")
    obj, digest = _filled(a, key, 8_000_000)
    seen: list[str] = []

    def receive() -> None:
        handle = b.use(key)  # it lives on the other host: found through the directory
        with handle.view(timeout=20) as got:
            seen.append(_digest(got))

    waiter = threading.Thread(target=receive)
    waiter.start()
    time.sleep(0.5)
    assert not seen, "the receiver got the object before it was sent"
    obj.transfer(cid(b))
    waiter.join(20)
    assert seen == [digest]
    b.use(key).destroy()


def test_the_directory_moves_the_home(
    cluster: LocalCluster, pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    key = unique("k")
    obj, _ = _filled(a, key, 10_000)
    obj.transfer(cid(b))
    with cluster.controller.client() as directory:
        deadline = time.monotonic() + 10
        while (entry := _entry(directory, key)) is None or entry[:2] != (b.host, cid(b)):
            assert time.monotonic() < deadline, f"directory still says {entry}"
            time.sleep(0.05)
    b.use(key).destroy()


def test_once_a_client_has_a_slot_its_minion_hands_it_objects_for_elsewhere(
    cluster: LocalCluster,
    pair: tuple[cdi.Client, cdi.Client],
    unique: Unique,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first crossing learns the slot (a refused transfer, then the slot); later ones
    are one ``transfer ... via`` to the minion. The object's generation crosses with it."""
    a, b = pair
    first, _ = _filled(a, unique("k"), 1000)
    first.transfer(cid(b))
    slot = a._session.gateway.slot
    assert slot is not None
    calls: list[tuple[Op, dict[str, Any]]] = []
    real = a._session.conn.call

    def spy(op: Op, **args: Any) -> Any:
        calls.append((op, args))
        return real(op, **args)

    monkeypatch.setattr(a._session.conn, "call", spy)
    key = unique("k")
    obj, digest = _filled(a, key, 20_000)
    assert a.describe(key)["generation"] == 1
    obj.transfer(cid(b))
    assert [args for op, args in calls if op is Op.TRANSFER] == [
        {"key": key, "to": cid(b), "via": slot}
    ]
    with b.use(key).view(timeout=10) as got:
        assert _digest(got) == digest
    # 1 at creation, 2 in the slot; 3 as the other gateway's, 4 as b's.
    assert b.describe(key)["generation"] == 4
    with cluster.controller.client() as directory:
        deadline = time.monotonic() + 10
        while (seen := _entry(directory, key)) is None or seen[::2] != (b.host, 4):
            assert time.monotonic() < deadline, f"directory still says {seen}"
            time.sleep(0.05)
    # A container on the same host still gets it straight, slot or not.
    local = cdi.connect(cluster.minions[0].socket_path, unique("local"))
    with local:
        calls.clear()
        mine, _ = _filled(a, unique("k"), 100)
        mine.transfer(cid(local))
        assert local.describe(mine.key)["owner"] == cid(local)
        local.use(mine.key).destroy()
    b.use(key).destroy()
    b.use(first.key).destroy()


def _entry(directory: ControllerClient, key: str) -> tuple[str, str, int] | None:
    try:
        info = directory.lookup_object(key)
    except cdi.ObjectNotFound:
        return None
    return info.host, info.owner, info.generation


def test_copy_resize_and_destroy_on_the_objects_new_host(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    key = unique("k")
    obj, digest = _filled(a, key, 200_000)
    obj.transfer(cid(b))
    theirs = b.use(key)
    theirs.access(timeout=10).release()
    copy = theirs.copy(unique("copy"))
    assert _digest(copy.access()) == digest
    theirs.resize(100)
    assert theirs.size == 100
    copy.destroy()
    theirs.destroy()
    with pytest.raises(cdi.ObjectNotFound):
        b.use(key)


def test_an_object_destroyed_on_its_new_host_is_gone_there_at_once(
    cluster: LocalCluster, pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    """The directory hears that an object left its first host a moment later (a minion lets
    its objects' events linger); the host it came to, having destroyed it, says at once that
    no object has the key instead of naming the first host."""
    a, b = pair
    stale = 0
    with cluster.controller.client() as directory:
        for _ in range(3):
            key = unique("k")
            obj, _ = _filled(a, key, 1_000)
            deadline = time.monotonic() + 10
            while _entry(directory, key) is None:  # listed on a's host first
                assert time.monotonic() < deadline, "the directory never listed the object"
                time.sleep(0.05)
            obj.transfer(cid(b))
            b.use(key).destroy()
            seen = _entry(directory, key)
            stale += seen is not None and seen[0] == a.host
            with pytest.raises(cdi.ObjectNotFound):
                b.use(key)
    assert stale, "the directory caught up every time: the lagging entry was never met"


def test_a_transfer_to_nobody_fails_and_the_sender_keeps_the_object(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, _ = pair
    key = unique("k")
    obj, digest = _filled(a, key, 50_000)
    with pytest.raises(cdi.UnknownContainer, match="on any host"):
        obj.transfer(unique("ghost"))
    assert _digest(obj.access()) == digest
    obj.destroy()


def test_a_refusal_on_the_other_host_leaves_the_object_with_its_owner(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    key = unique("k")
    b.create(key, 10)  # the other host already has that key
    obj, digest = _filled(a, key, 70_000)
    with pytest.raises(cdi.KeyExists):
        obj.transfer(cid(b))
    assert _digest(obj.access()) == digest
    obj.destroy()
    b.use(key).destroy()


def test_a_non_owner_cannot_send_an_object_across(
    cluster: LocalCluster, pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    a, b = pair
    key = unique("k")
    obj, _ = _filled(a, key, 1000)
    intruder = cdi.connect(cluster.minions[0].socket_path, unique("intruder"))
    with intruder, pytest.raises(cdi.NotOwner):
        intruder.use(key).transfer(cid(b))
    obj.destroy()


def test_an_object_sent_straight_back_while_its_sender_finishes(
    pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    """The receiver bounces the object back at once: it may reach the sender's host before
    the sender's gateway has dropped its outgoing copy (same key), and must wait for it."""
    a, b = pair
    key = unique("k")
    obj, digest = _filled(a, key, 20_000)
    rounds = 100
    failures: list[BaseException] = []

    def bounce() -> None:
        theirs = b.use(key, check=False)
        try:
            for _ in range(rounds):
                theirs.access(timeout=20).release()
                theirs.transfer(cid(a))
        except BaseException as exc:
            failures.append(exc)

    bouncer = threading.Thread(target=bounce)
    bouncer.start()
    for _ in range(rounds):
        obj.transfer(cid(b))
        obj.access(timeout=20).release()
    bouncer.join(30)
    assert not failures, failures
    assert _digest(obj.access()) == digest
    obj.destroy()


def test_an_object_whose_new_owner_dies_goes_back_to_its_recovery_container(
    cluster: LocalCluster, pair: tuple[cdi.Client, cdi.Client], unique: Unique
) -> None:
    """The receiving host remembers the recovery container the object had where it came
    from: when its new owner goes, the object is sent back there, intact."""
    a, _ = pair
    doomed = cdi.connect(cluster.minions[1].socket_path, unique("doomed"))
    key = unique("k")
    obj, digest = _filled(a, key, 30_000)  # a is its recovery container
    obj.transfer(cid(doomed))
    with doomed.use(key).view(timeout=10) as got:
        assert _digest(got) == digest
    doomed.close()  # its objects go to their recovery container: a, on the other host
    with a.use(key, check=False).view(timeout=20) as back:
        assert _digest(back) == digest
    a.use(key).destroy()
