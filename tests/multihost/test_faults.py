"""Faults between hosts, each caused for real: processes killed, a link taken down, the
controller restarted; and an observer that never sees an object with two owners."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import cdi
from cdi.cluster import LocalCluster
from cdi.controller.process import ControllerChild
from cdi.remote.gateway import container_prefix
from tests.cdi.conftest import require_native
from tests.multihost.test_cross_host import cid

Unique = Callable[[str], str]
BIG = 64_000_000


@pytest.fixture
def fresh(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of its own: these tests kill its parts."""
    require_native()
    folder = Path(f"/tmp/cdi-faults-{os.getpid()}-{time.monotonic_ns()}")
    os.environ["CDI_LINK_TIMEOUT_S"] = "2"
    try:
        with LocalCluster.start(2, folder) as running:
            yield running
    finally:
        del os.environ["CDI_LINK_TIMEOUT_S"]
        subprocess.run(["rm", "-rf", str(folder)], check=False)


def _filled(client: cdi.Client, key: str, size: int) -> tuple[cdi.CDIObject, str]:
    obj = client.create(key, size)
    chunk = os.urandom(1 << 20)
    with obj.view() as view:
        for offset in range(0, size, len(chunk)):
            view[offset : offset + len(chunk)] = chunk[: size - offset]
        digest = hashlib.sha256(view).hexdigest()
    return obj, digest


def _digest_of(obj: cdi.CDIObject, timeout: float = 10) -> str:
    with obj.view(timeout=timeout) as view:
        return hashlib.sha256(view).hexdigest()


def _transfer_in_thread(
    obj: cdi.CDIObject, to: str
) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            obj.transfer(to)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def _keys(socket_path: str) -> list[dict[str, Any]]:
    with cdi.Client(socket_path) as probe:
        return probe.list_objects()


def test_destination_minion_killed_mid_transfer(fresh: LocalCluster, unique: Unique) -> None:
    if fresh.network.kind != "netns":
        pytest.skip(f"slowing the link needs network namespaces ({fresh.network.reason})")
    fresh.network.shape(rate_mbit=200)  # 64 MB take ~2.6 s: time to kill mid-stream
    with cdi.connect(fresh.minions[0].socket_path, unique("a")) as a:
        victim = cdi.connect(fresh.minions[1].socket_path, "b-victim")  # dies with its minion
        obj, digest = _filled(a, unique("k"), BIG)
        thread, errors = _transfer_in_thread(obj, "b-victim")
        time.sleep(0.8)
        os.kill(fresh.minions[1].pid, signal.SIGKILL)
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], cdi.TransferFailed), errors
        assert not errors[0].in_doubt, errors[0]
        assert _digest_of(obj) == digest  # the object stayed with its owner, intact
        obj.destroy()
        victim.close()


def test_source_minion_killed_after_the_hand_off(fresh: LocalCluster, unique: Unique) -> None:
    with cdi.connect(fresh.minions[1].socket_path, unique("b")) as b:
        a = cdi.connect(fresh.minions[0].socket_path, unique("a"))
        key = unique("k")
        obj, digest = _filled(a, key, 8_000_000)
        obj.transfer(cid(b))
        os.kill(fresh.minions[0].pid, signal.SIGKILL)
        fresh.minions[0].wait(10)
        theirs = b.use(key, check=False)
        assert _digest_of(theirs) == digest  # the destination copy is intact
        with pytest.raises(cdi.TransferFailed):
            theirs.transfer(cid(a))  # its host is gone: B keeps it
        assert _digest_of(theirs) == digest
        theirs.destroy()
        a.close()


def test_a_link_that_drops_mid_stream(fresh: LocalCluster, unique: Unique) -> None:
    if fresh.network.kind != "netns":
        pytest.skip(f"dropping a link needs network namespaces ({fresh.network.reason})")
    fresh.network.shape(rate_mbit=200)
    namespace = fresh.network.hosts[1].namespace
    assert namespace is not None
    with (
        cdi.connect(fresh.minions[0].socket_path, unique("a")) as a,
        cdi.connect(fresh.minions[1].socket_path, unique("b")) as b,
    ):
        key = unique("k")
        obj, digest = _filled(a, key, BIG)
        thread, errors = _transfer_in_thread(obj, cid(b))
        time.sleep(0.8)
        subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "down"], check=True)
        try:
            thread.join(30)
            assert len(errors) == 1 and isinstance(errors[0], cdi.TransferFailed), errors
            assert "link" in str(errors[0]) and not errors[0].in_doubt, errors[0]
            assert _digest_of(obj) == digest
            # No half object on the other host: its side gave up and destroyed it.
            deadline = time.monotonic() + 10
            while any(o["key"] == key for o in _keys(fresh.minions[1].socket_path)):
                assert time.monotonic() < deadline, "a half object outlived the link"
                time.sleep(0.1)
        finally:
            subprocess.run(["ip", "-n", namespace, "link", "set", "eth0", "up"], check=True)
        obj.transfer(cid(b))  # the link is back: it goes through
        assert _digest_of(b.use(key)) == digest
        b.use(key).destroy()


def test_controller_restarted_mid_run(fresh: LocalCluster, unique: Unique) -> None:
    with (
        cdi.connect(fresh.minions[0].socket_path, unique("a")) as a,
        cdi.connect(fresh.minions[1].socket_path, unique("b")) as b,
    ):
        key = unique("k")
        obj, digest = _filled(a, key, 100_000)
        stop = threading.Event()
        done: list[int] = []
        failures: list[BaseException] = []

        def ping_pong() -> None:
            here, there = obj, b.use(key, check=False)
            try:
                while not stop.is_set():
                    here.transfer(cid(b))
                    there.access(timeout=10).release()
                    there.transfer(cid(a))
                    here.access(timeout=10).release()
                    done.append(1)
            except BaseException as exc:
                failures.append(exc)

        runner = threading.Thread(target=ping_pong)
        runner.start()
        time.sleep(1.0)
        before = len(done)
        fresh.controller.stop()  # SIGTERM: its directory is gone
        time.sleep(1.0)
        fresh.controller = ControllerChild(
            fresh.controller.url, fresh.controller.log_path, fresh.controller.credentials
        )
        fresh.controller.start()
        fresh.wait_for_gateways()  # the minions re-announced themselves
        late = cdi.connect(fresh.minions[1].socket_path, unique("late"))  # after the restart
        time.sleep(1.5)
        stop.set()
        runner.join(30)
        assert not failures, failures
        assert len(done) > before, "no transfer went on across the restart"
        obj.transfer(cid(late))  # routed by the new controller
        assert _digest_of(late.use(key)) == digest
        late.use(key).destroy()
        late.close()
        with fresh.controller.client() as directory:
            assert {m.host for m in directory.list_minions()} == {"host1", "host2"}


def _owner(probe: cdi.Client, key: str, gateways: tuple[str, ...]) -> tuple[Any, ...] | None:
    """The object's application owner on one host, and which incarnation of it: a key that
    leaves a host and comes back is a new object there (its generation starts again)."""
    for entry in probe.list_objects():
        if entry["key"] == key and not entry["owner"].startswith(gateways):
            return entry["owner"], entry["generation"], entry["created_at"]
    return None


def _two_owners(probes: list[cdi.Client], key: str, gateways: tuple[str, ...]) -> list[str]:
    """Look at the first host, the second, the first again (and the other way round): if the
    first host's owner did not change in between, it held the object all the while the second
    host was looked at, so an owner there is a second owner."""
    found = []
    for first, second in ((0, 1), (1, 0)):
        before = _owner(probes[first], key, gateways)
        middle = _owner(probes[second], key, gateways)
        after = _owner(probes[first], key, gateways)
        if before is not None and before == after and middle is not None:
            found.append(f"{key}: {before} on host {first + 1}, {middle} on host {second + 1}")
    return found


def test_no_object_ever_has_two_owners(fresh: LocalCluster, unique: Unique) -> None:
    """Two thousand cross-host hand-offs while an observer lists both minions; an owner that is
    not the gateway's (which carries the bytes across) may exist on one host at a time."""
    gateways = tuple(container_prefix(h.name) for h in fresh.network.hosts)
    sockets = [m.socket_path for m in fresh.minions]
    violations: list[str] = []
    looks = [0]
    stop = threading.Event()

    def observe(key: str) -> None:
        probes = [cdi.Client(s) for s in sockets]
        try:
            while not stop.is_set():
                violations.extend(_two_owners(probes, key, gateways))
                looks[0] += 1
        finally:
            for probe in probes:
                probe.close()

    with (
        cdi.connect(sockets[0], unique("a")) as a,
        cdi.connect(sockets[1], unique("b")) as b,
    ):
        key = unique("k")
        obj, digest = _filled(a, key, 10_000)
        watcher = threading.Thread(target=observe, args=(key,))
        watcher.start()
        there = b.use(key, check=False)
        try:
            for _ in range(1000):  # 2000 hand-offs
                obj.transfer(cid(b))
                there.access(timeout=10).release()
                there.transfer(cid(a))
                obj.access(timeout=10).release()
        finally:
            stop.set()
            watcher.join(30)
        assert not violations, violations[:5]
        assert looks[0] > 50, "the observer hardly looked"
        assert _digest_of(obj) == digest
        # Never none either: exactly one copy, on host 1, owned by a.
        assert [o["owner"] for o in _keys(sockets[0]) if o["key"] == key] == [cid(a)]
        assert not [o for o in _keys(sockets[1]) if o["key"] == key]
        # The observer does see two owners when there are two (the same key made on each host).
        twin = b.create(key, 10)
        probes = [cdi.Client(s) for s in sockets]
        try:
            assert len(_two_owners(probes, key, gateways)) == 2
        finally:
            for probe in probes:
                probe.close()
        twin.destroy()
        obj.destroy()


def test_destination_minion_killed_after_the_offer(fresh: LocalCluster, unique: Unique) -> None:
    """The whole offer went out, but the other host's minion stopped before answering, then
    died: ``resolve`` finds nothing listening there any more (nothing there holds the object),
    so the transfer failed, not in doubt, and the object is back with its sender, intact."""
    from tests.multihost.test_sending import _binary_pid

    there = fresh.minions[1].socket_path
    with cdi.connect(fresh.minions[0].socket_path, unique("a")) as a:
        victim = cdi.connect(there, "b-victim")  # dies with its minion
        warm, _ = _filled(a, unique("warm"), 100)
        warm.transfer("b-victim")  # the slot and the route are known: the next offer goes at once
        victim.use(warm.key).destroy()
        obj, digest = _filled(a, unique("k"), 10_000)
        stopped = _binary_pid(there)
        os.kill(stopped, signal.SIGSTOP)
        thread, errors = _transfer_in_thread(obj, "b-victim")
        time.sleep(0.5)
        os.kill(stopped, signal.SIGKILL)
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], cdi.TransferFailed), errors
        assert "in doubt" not in str(errors[0]), errors[0]
        assert _digest_of(obj) == digest
        obj.destroy()
        victim.close()
