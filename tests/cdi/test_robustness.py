"""What must not take a minion down, or derail it: clients that misbehave, limits that bite.

Each test runs a minion of its own, so one that dies fails only its test."""

from __future__ import annotations

import os
import resource
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack

import cdi
from cdi.protocol import PAGE, Op
from tests.cdi.conftest import MinionProcess, start_minion, stop_minion

Unique = Callable[[str], str]


@contextmanager
def own_minion(shared_dir: Path, name: str, *extra: str) -> Iterator[MinionProcess]:
    directory = shared_dir / name
    directory.mkdir()
    running = start_minion(directory, *extra)
    try:
        yield running
        assert running.child.running, "the minion died"
    finally:
        stop_minion(running)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """The minion frozen (SIGSTOP): what clients do meanwhile reaches it as one batch of events,
    in the order they did it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 10
        while _state(pid) != "T":
            assert time.monotonic() < deadline, "the minion did not stop"
            time.sleep(0.001)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def reply_to(client: cdi.Client, request_id: int) -> dict[str, Any]:
    """The reply to ``request_id`` sent with ``client._session.conn._send``, checked for its
    id only."""
    body, fd = client._session.conn._next_reply(deadline=time.monotonic() + 10)
    if fd is not None:
        os.close(fd)
    assert body.get("id") == request_id, f"expected the reply to {request_id}, got {body}"
    return body


def owners(running: MinionProcess) -> dict[str, str]:
    with cdi.Client(running.socket_path) as probe:
        return {o["key"]: o["owner"] for o in probe.list_objects()}


# ---------------------------------------------------------------- 1. SIGBUS on strict segments
def test_a_strict_owner_that_truncates_its_segment_cannot_kill_the_minion(
    shared_dir: Path, unique: Unique
) -> None:
    """A strict segment is unsealed and its owner holds the fd: it may ftruncate it. The minion
    then reads it short (the rest is zeros) instead of faulting with SIGBUS on its own mapping,
    which would take every object of the host down with it."""
    with own_minion(shared_dir, "truncate", "--isolation", "strict") as running:
        a, b = running.client(unique("a")), running.client(unique("b"))
        key, copy_key = unique("k"), unique("copy")
        size = 10_000  # capacity 3 pages
        reply, fd = a._session.conn.call(Op.CREATE, key=key, size=size, isolation="strict")
        assert fd is not None and reply["capacity"] == 3 * PAGE
        try:
            os.pwrite(fd, b"A" * size, 0)
            os.ftruncate(fd, PAGE)  # the owner shrinks its own segment to one page

            # copy: the page that is left, then zeros
            _, copy_fd = a._session.conn.call(Op.COPY, key=key, new_key=copy_key)
            assert copy_fd is not None
            assert os.pread(copy_fd, size, 0) == b"A" * PAGE + bytes(size - PAGE)
            os.close(copy_fd)

            # resize within the capacity: the growth is zeroed past the file's end
            reply, _ = a._session.conn.call(Op.RESIZE, key=key, size=12_000)
            assert reply["size"] == 12_000
            assert os.pread(fd, 12_000, 0) == b"A" * PAGE + bytes(12_000 - PAGE)

            # resize beyond the capacity: copied into a bigger segment
            os.ftruncate(fd, 0)
            reply, _ = a._session.conn.call(Op.RESIZE, key=key, size=50_000)
            assert reply["size"] == 50_000
        finally:
            os.close(fd)
        reply, fd = a._session.conn.call(Op.ACCESS, key=key, wait=False)
        assert fd is not None
        try:
            assert os.pread(fd, 50_000, 0) == bytes(50_000)
            os.pwrite(fd, b"B" * 50_000, 0)
            os.ftruncate(fd, PAGE)
        finally:
            os.close(fd)

        # transfer: moved to a fresh segment for the new owner
        assert b.container_id is not None
        a._session.conn.call(Op.TRANSFER, key=key, to=b.container_id)
        _, fd = b._session.conn.call(Op.ACCESS, key=key, wait=False)
        assert fd is not None
        os.close(fd)

        # a copy of a truncated copy, and the minion still answers everyone
        _, copy_fd = a._session.conn.call(Op.ACCESS, key=copy_key, wait=False)
        assert copy_fd is not None
        os.ftruncate(copy_fd, 0)
        os.close(copy_fd)
        _, copy_fd = a._session.conn.call(Op.COPY, key=copy_key, new_key=unique("copy"))
        assert copy_fd is not None
        assert os.pread(copy_fd, size, 0) == bytes(size)
        os.close(copy_fd)
        assert running.stat()["objects"] == 3


# ---------------------------------------------------------------- 2. accept() errors
def _asks(path: str) -> bool:
    """Connect, ask for stat: True if answered, False if the minion closed the connection."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
        raw.settimeout(10)
        raw.connect(path)
        return _answered(raw)


def _answered(raw: socket.socket) -> bool:
    try:
        raw.send(msgpack.packb({"op": "stat", "id": 1}))
        data = raw.recv(65536)
    except (BrokenPipeError, ConnectionResetError):
        return False
    return bool(data) and msgpack.unpackb(data)["ok"] is True


def test_running_out_of_fds_refuses_connections_and_keeps_serving(
    shared_dir: Path, unique: Unique
) -> None:
    """EMFILE on accept must not stop the minion: the connection it cannot take is closed (so
    the client hears about it and the listener does not spin), and the others are served."""
    with own_minion(shared_dir, "fds") as running:
        pid = running.pid
        keeper = running.client(unique("keeper"))
        key = unique("k")
        keeper._session.conn.call(Op.CREATE, key=key, size=10)
        limits = resource.prlimit(pid, resource.RLIMIT_NOFILE)
        top = max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (top + 3, limits[1]))  # 2 fds to spare
        crowd: list[socket.socket] = []
        try:
            for _ in range(40):
                raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                crowd.append(raw)
                raw.settimeout(10)
                raw.connect(running.socket_path)
            answered = [_answered(raw) for raw in crowd]
            assert any(answered), "no connection was served"
            assert not all(answered), "the fd limit did not bite"
            assert running.child.running, "the minion died"
            stat = keeper._session.conn.call(Op.STAT)[0]
            assert stat["objects"] == 1  # old connections still served
        finally:
            for raw in crowd:
                raw.close()
        # Once the crowd is gone, new connections are served again (under the same limit).
        wait_until(lambda: _asks(running.socket_path), "the minion to serve again")
        resource.prlimit(pid, resource.RLIMIT_NOFILE, limits)
        keeper._session.conn.call(Op.DESTROY, key=key)


# ---------------------------------------------------------------- 3. out of memory in recovery
def test_recovery_reclaims_an_object_it_cannot_move_and_recovers_the_rest(
    shared_dir: Path, unique: Unique
) -> None:
    """A strict object needs a fresh segment to change hands; if memory has run out, recovery
    reclaims it (and says so in the log) and goes on with the dead owner's other objects."""
    limit = str(16 * PAGE)
    with own_minion(shared_dir, "oom", "--memory-limit", limit, "--max-object", limit) as running:
        rescuer, doomed = running.client(unique("rescuer")), running.client(unique("doomed"))
        big, small, strict = unique("big"), unique("small"), unique("strict")
        for key, size, isolation in (
            (big, 10 * PAGE, "strict"),  # moving it needs 10 more pages: 22 > 16
            (small, 100, "cooperative"),
            (strict, 100, "strict"),  # one more page: fits once the big one is gone
        ):
            _, fd = doomed._session.conn.call(
                Op.CREATE, key=key, size=size, isolation=isolation, recovery=rescuer.container_id
            )
            assert fd is not None
            os.close(fd)
        doomed.close()
        wait_until(lambda: doomed.container_id not in running.stat()["containers"], "the death")
        assert owners(running) == {small: rescuer.container_id, strict: rescuer.container_id}
        for key in (small, strict):
            _, fd = rescuer._session.conn.call(Op.ACCESS, key=key, wait=False)
            assert fd is not None
            os.close(fd)
            rescuer._session.conn.call(Op.DESTROY, key=key)
        assert running.stat()["used_segments"] == 0


def test_recovery_that_runs_out_of_memory_does_not_answer_another_request(
    shared_dir: Path, unique: Unique
) -> None:
    """A transfer to a container that has just died recovers the dead one's objects; that
    recovery failing for want of memory is not the transfer's failure."""
    limit = str(16 * PAGE)
    with own_minion(shared_dir, "oom2", "--memory-limit", limit, "--max-object", limit) as running:
        giver, dead = running.client(unique("giver")), running.client(unique("dead"))
        assert dead.container_id is not None
        key, big = unique("k"), unique("big")
        _, fd = giver._session.conn.call(Op.CREATE, key=key, size=100)
        assert fd is not None
        os.close(fd)
        _, fd = dead._session.conn.call(
            Op.CREATE, key=big, size=10 * PAGE, isolation="strict", recovery=giver.container_id
        )
        assert fd is not None
        os.close(fd)
        dead._session.conn._send(Op.ACCESS, {"key": key})  # waits for the object
        wait_until(lambda: running.stat()["waiters"] == 1, "the access to wait")
        with stopped(running.pid):
            transfer = giver._session.conn._send(Op.TRANSFER, {"key": key, "to": dead.container_id})
            dead.close()  # gone before the minion sees the transfer: its grant cannot be sent
        reply = reply_to(giver, transfer)
        assert reply["ok"] is True, reply
        # The object came back to the giver, its recovery container.
        _, fd = giver._session.conn.call_blocking(Op.ACCESS, 10, key=key)
        if fd is not None:
            os.close(fd)
        giver._session.conn.call(Op.DESTROY, key=key)


# ---------------------------------------------------------------- 4. sends that fail mid-loop
def test_a_grant_that_fails_mid_loop_grants_every_waiter_once(
    shared_dir: Path, unique: Unique
) -> None:
    """Granting waiters one by one, a send to a dead waiter fails and its objects are recovered;
    that must not run inside the loop (where it granted the next waiter a second time)."""
    with own_minion(shared_dir, "waiters") as running:
        giver, dead, heir = (running.client(unique(n)) for n in ("giver", "dead", "heir"))
        assert dead.container_id is not None and heir.container_id is not None
        key = unique("k")
        _, fd = giver._session.conn.call(Op.CREATE, key=key, size=100, recovery=heir.container_id)
        assert fd is not None
        os.close(fd)
        dead._session.conn._send(Op.ACCESS, {"key": key})
        wait_until(lambda: running.stat()["waiters"] == 1, "the first waiter")
        waiting = heir._session.conn._send(Op.ACCESS, {"key": key})
        wait_until(lambda: running.stat()["waiters"] == 2, "the second waiter")
        with stopped(running.pid):
            transfer = giver._session.conn._send(Op.TRANSFER, {"key": key, "to": dead.container_id})
            dead.close()  # the grant to it fails; it owned the object: back to its recovery
        assert reply_to(giver, transfer)["ok"] is True
        grant = reply_to(heir, waiting)
        assert grant["ok"] is True and grant["generation"] == 3
        # The next message the heir gets is the answer to its next request: no second grant.
        stat = heir._session.conn._send(Op.STAT, {})
        assert reply_to(heir, stat)["waiters"] == 0
        assert owners(running) == {key: heir.container_id}
        heir._session.conn.call(Op.DESTROY, key=key)
