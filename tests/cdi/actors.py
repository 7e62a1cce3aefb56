"""Processes the CDI tests run as other containers: ``python -m tests.cdi.actors ROLE ...``.

Each role prints one JSON line per step on stdout and waits for a line on stdin where the test
needs it to stay alive. Roles that run under another uid import everything first and then drop
root, because the interpreter's own files are not readable by other uids on this machine.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import mmap
import os
import sys
from collections.abc import Callable
from typing import Any

import cdi
from cdi import channels
from cdi.protocol import Op
from tests.cdi.conftest import SOCKET_GROUP

PR_SET_DUMPABLE = 4


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def drop_to(uid: int, *, join_socket_group: bool = True) -> None:
    """Become ``uid`` for good (no way back to root), and stay an ordinary ptrace target; a
    member of the test minions' socket group unless told otherwise."""
    os.setgroups([SOCKET_GROUP] if join_socket_group else [])
    os.setgid(uid)
    os.setuid(uid)
    # A uid change makes the kernel hide /proc/<pid> behind root; undo that so the test shows
    # that a *different ordinary uid* is refused, not merely that root owns the files.
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)


def owner(socket_path: str, cid: str, key: str, secret: str, uid: int) -> None:
    drop_to(uid)
    client = cdi.connect(socket_path, cid)
    obj = client.create(key, 4096)
    obj.write(secret.encode())
    view = obj.access()  # keep the object mapped while the intruder tries
    emit(ready=True, pid=os.getpid(), uid=os.getuid(), mapped=len(view))
    sys.stdin.readline()
    view.release()
    obj.destroy()
    client.close()


def _try_open(directory: str) -> list[str]:
    """What happens when we list ``directory`` and open each entry."""
    try:
        names = sorted(os.listdir(directory))
    except PermissionError:
        return ["permission_denied"]
    outcomes = []
    for path in (os.path.join(directory, name) for name in names):
        try:
            with open(path, "rb") as handle:
                outcomes.append(f"read:{handle.read(64)!r}")
        except PermissionError:
            outcomes.append("permission_denied")
        except OSError as exc:
            outcomes.append(f"error:{exc.errno}")
    return outcomes


def intruder(
    socket_path: str, cid: str, key: str, owner_pid: str, minion_pid: str, uid: int
) -> None:
    drop_to(uid)
    result: dict[str, Any] = {"uid": os.getuid()}
    client = cdi.connect(socket_path, cid)
    handle = client.use(key, check=False)  # another uid's object: it does not see it
    attempts: dict[str, Callable[[], object]] = {
        "minion_read": lambda: handle.read(timeout=0),
        "minion_access": lambda: handle.access(timeout=0),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            result[what] = "allowed"
        except cdi.CDIError as exc:
            result[what] = exc.code
    # Reach for the memory behind the minion's back: the owner's and the minion's fds and maps.
    result["owner_fds"] = _try_open(f"/proc/{owner_pid}/fd")
    result["owner_maps"] = _try_open(f"/proc/{owner_pid}/map_files")
    result["minion_fds"] = _try_open(f"/proc/{minion_pid}/fd")
    try:
        with open(f"/proc/{owner_pid}/mem", "rb") as mem:
            mem.read(1)
        result["owner_mem"] = "opened"
    except OSError as exc:
        result["owner_mem"] = "permission_denied" if exc.errno in (1, 13) else str(exc.errno)
    emit(**result)
    client.close()


def stale_reader(socket_path: str, cid: str, key: str, back_to: str) -> None:
    """A former owner that cheats: it maps the object itself and keeps the mapping."""
    client = cdi.connect(socket_path, cid)
    client.use(key)
    reply, fd = client._session.conn.call_blocking(Op.ACCESS, 30, key=key)
    assert fd is not None
    kept = mmap.mmap(fd, reply["capacity"], mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(fd)
    client._session.conn.call(Op.TRANSFER, key=key, to=back_to)
    emit(ready=True)
    sys.stdin.readline()
    emit(stale=kept[:16].hex())  # faults (SIGBUS) if the segment was truncated
    kept.close()
    client.close()


def holder(socket_path: str, cid: str, key: str) -> None:
    """Waits for an object, writes to it, then stays alive until the test kills it."""
    client = cdi.connect(socket_path, cid)
    obj = client.use(key)
    obj.access(timeout=30).release()
    obj.write(b"touched")
    emit(ready=True, pid=os.getpid())
    sys.stdin.readline()


def _attempt(what: Callable[[], object]) -> str:
    """What happened when we tried: ``done``, or the error's errno name (``EACCES``...)."""
    try:
        what()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc))
    except (TypeError, ValueError) as exc:  # a read-only buffer refuses in Python first
        return type(exc).__name__
    return "done"


def reader(socket_path: str, cid: str, key: str, uid: int) -> None:
    """A reader of a share that tries every way to write: through the library's view and
    NumPy array, and behind its back with the fd the minion sent."""
    if uid:
        drop_to(uid)
    client = cdi.connect(socket_path, cid)
    emit(ready=True, pid=os.getpid())
    obj = client.use(key, check=False)
    view = obj.read(timeout=30)
    result: dict[str, Any] = {"uid": os.getuid(), "seen": bytes(view[:6]).hex()}

    def into_view() -> None:
        view[0] = 0x58

    result["view"] = _attempt(into_view)
    array = obj.numpy(readonly=True)
    result["numpy_writeable"] = bool(array.flags.writeable)
    del array
    reply, fd = client._session.conn.call(Op.READ, key=key)  # the fd itself, as a cheat would
    assert fd is not None
    size = reply["capacity"]
    result["mmap_write"] = _attempt(
        lambda: mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    )
    result["write"] = _attempt(lambda: os.pwrite(fd, b"X", 0))
    result["truncate"] = _attempt(lambda: os.ftruncate(fd, 0))
    result["reopen"] = _attempt(lambda: os.close(os.open(f"/proc/self/fd/{fd}", os.O_RDWR)))
    result["seal"] = _attempt(lambda: fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = (
        ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long
    )  # fmt: skip
    address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    protected = libc.mprotect(ctypes.c_void_p(address), size, mmap.PROT_READ | mmap.PROT_WRITE)
    result["mprotect"] = "done" if protected == 0 else errno.errorcode[ctypes.get_errno()]
    libc.munmap(ctypes.c_void_p(address), size)
    os.close(fd)
    emit(**result)
    sys.stdin.readline()
    view.release()
    emit(released=obj.release())
    sys.stdin.readline()
    client.close()


def squatter(socket_path: str, uid: int, *names: str) -> None:
    """Tries to register each of ``names``: the code of each refusal, or ``registered``."""
    drop_to(uid)
    outcomes = {}
    for name in names:
        try:
            cdi.connect(socket_path, name).close()
            outcomes[name] = "registered"
        except cdi.CDIError as exc:
            outcomes[name] = exc.code
    emit(uid=os.getuid(), outcomes=outcomes)


def outsider(socket_path: str, uid: int) -> None:
    """A uid outside the socket's group tries to connect."""
    drop_to(uid, join_socket_group=False)
    try:
        cdi.Client(socket_path).close()
        emit(uid=os.getuid(), connect="connected")
    except cdi.MinionUnavailable as exc:
        emit(uid=os.getuid(), connect="refused", why=str(exc))


def snoop(socket_path: str, cid: str, key: str, uid: int) -> None:
    """Another uid looks for an object that is not its own, and at the containers."""
    drop_to(uid)
    client = cdi.connect(socket_path, cid)
    mine = client.create(f"{cid}-own", 16)
    result: dict[str, Any] = {"listed": [o["key"] for o in client.list_objects()]}
    result["listed_by_key"] = [o["key"] for o in client.list_objects(key)]
    try:
        client.use(key)
        result["use"] = "found"
    except cdi.ObjectNotFound:
        result["use"] = "not_found"
    try:
        client.use(key, check=False).destroy()
        result["destroy"] = "done"
    except cdi.CDIError as exc:
        result["destroy"] = exc.code
    result["containers"] = client.stat()["containers"]
    mine.destroy()
    emit(**result)
    client.close()


def fd_keeper(socket_path: str, cid: str, key: str, uid: int) -> None:
    """Creates an object behind the library's back, keeps the fd it was given (mapped),
    destroys the object, and later reads what that memory holds."""
    drop_to(uid)
    client = cdi.connect(socket_path, cid)
    reply, fd = client._session.conn.call(Op.CREATE, key=key, size=4096)
    assert fd is not None
    kept = mmap.mmap(fd, reply["capacity"], mmap.MAP_SHARED, mmap.PROT_READ)
    os.close(fd)
    client._session.conn.call(Op.DESTROY, key=key)
    emit(segment=reply["segment"])
    sys.stdin.readline()
    emit(kept=kept[:64].hex())
    kept.close()
    client.close()


def cache_keeper(socket_path: str, cid: str, key: str, to: str, uid: int) -> None:
    """Through the library: destroys one object (its mapping may stay cached: the memory can
    only serve this uid again), transfers another to a container of another uid (its mapping
    must go), then shows what every mapping it still caches holds."""
    drop_to(uid)
    client = cdi.connect(socket_path, cid)
    first = client.create(f"{key}-a", 4096)
    second = client.create(f"{key}-b", 4096)
    first.write(b"first")
    second.write(b"second")
    first.destroy()
    emit(cached_after_destroy=list(client._session.owned.cache))
    second.transfer(to)
    emit(cached_after_transfer=list(client._session.owned.cache))
    sys.stdin.readline()
    cache = client._session.owned.cache
    emit(seen=[cache.get(k).mm[:64].hex() for k in cache])  # type: ignore[union-attr]
    client.close()


def forking_owner(socket_path: str, cid: str, key: str) -> None:
    """Waits for an object, then forks a child without exec (which keeps the socket open and
    sleeps) and dies: the minion must notice the death of the process, not of the socket."""
    client = cdi.connect(socket_path, cid)
    client.use(key, check=False).access(timeout=30).release()
    child = os.fork()
    if child == 0:
        sys.stdin.readline()  # the child holds the socket until the test lets it go
        os._exit(0)
    emit(child=child)
    os._exit(0)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def channel_subscriber(socket_path: str, cid: str, topic: str, count: int, hold: str) -> None:
    """Join ``topic``, say so; if ``hold`` is "hold", read nothing until told; then read
    ``count`` messages and report their lengths and digests."""
    client = cdi.connect(socket_path, cid)
    sub = channels.subscribe(client, topic, timeout=30)
    emit(joined=True, pid=os.getpid())
    if hold == "hold":
        sys.stdin.readline()
    got = [sub.receive(timeout=30) for _ in range(count)]
    emit(lengths=[len(m) for m in got], digests=[digest(m) for m in got])
    try:
        sub.receive(timeout=30)
        emit(after="a message")
    except cdi.ChannelClosed as exc:
        emit(after="closed", message=str(exc))
    sub.close()
    client.close()


def channel_intruder(socket_path: str, cid: str, topic: str, uid: int) -> None:
    """Try to join and to map ``topic``'s ring without a grant; report what each attempt got."""
    if uid:
        drop_to(uid)
    client = cdi.connect(socket_path, cid)
    outcomes: dict[str, str] = {}
    try:
        channels.subscribe(client, topic, timeout=0.5)
        outcomes["subscribe"] = "joined"
    except cdi.CDIError as exc:
        outcomes["subscribe"] = type(exc).__name__
    try:
        client.use(f"channel/{topic}", check=False).read(timeout=0)
        outcomes["read"] = "mapped"
    except cdi.CDIError as exc:
        outcomes["read"] = type(exc).__name__
    emit(**outcomes)
    client.close()


def channel_echo(socket_path: str, cid: str, name: str, peer: str) -> None:
    """One end of stream ``name``: send back each message reversed until the peer closes."""
    client = cdi.connect(socket_path, cid)
    with channels.open_stream(client, name, peer, timeout=30) as stream:
        emit(open=True)
        while True:
            try:
                message = stream.receive(timeout=30)
            except cdi.ChannelClosed:
                break
            stream.send(message[::-1])
    emit(done=True)
    client.close()


ROLES: dict[str, Callable[..., None]] = {
    "owner": owner,
    "intruder": intruder,
    "stale_reader": stale_reader,
    "holder": holder,
    "reader": reader,
    "squatter": squatter,
    "outsider": outsider,
    "snoop": snoop,
    "fd_keeper": fd_keeper,
    "cache_keeper": cache_keeper,
    "forking_owner": forking_owner,
    "channel_subscriber": channel_subscriber,
    "channel_intruder": channel_intruder,
    "channel_echo": channel_echo,
}

if __name__ == "__main__":
    role, *args = sys.argv[1:]
    typed: list[Any] = [int(a) if a.isdigit() and len(a) < 7 else a for a in args]
    ROLES[role](*typed)
