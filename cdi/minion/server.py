"""The per-host minion: holds every object's memory and enforces single ownership.

One thread, one ``epoll`` loop: every operation runs to completion before the next starts, which is
what makes ``transfer`` atomic (the old owner loses the object in the same step the new owner gains
it) and two racing transfers of one object impossible to both succeed.

Who is calling is known from the socket (``SO_PEERCRED``: pid, uid), never from the message. Memory
is handed out only as a file descriptor over ``SCM_RIGHTS`` and only to the current owner, so a
process that never owned an object has nothing it could map; the kernel enforces that.

When a send fails (the peer is gone, or does not read its replies), the connection is not closed on
the spot, in the middle of whatever operation was sending (and walking a list of waiters): it is
marked doomed, gets nothing more, and is closed, with its objects recovered, once the request in
hand is answered. No operation ever runs inside another.
"""

from __future__ import annotations

import array
import contextlib
import errno
import logging
import os
import select
import signal
import socket
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cdi import protocol
from cdi.errors import (
    CDIError,
    ConfigError,
    ContainerExists,
    InvalidArgument,
    KeyExists,
    NotOwner,
    NotRegistered,
    ObjectNotFound,
    ProtocolError,
    UnknownContainer,
)
from cdi.minion.config import MinionConfig
from cdi.minion.objects import Connection, StoredObject
from cdi.minion.segments import SegmentPool
from cdi.protocol import Isolation, Op

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter

__all__ = ["Minion"]

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")
_OPEN_OPS = frozenset({Op.REGISTER, Op.STAT, Op.LIST})  # allowed before register
Reply = tuple[dict[str, Any], int | None] | None  # None: the reply is deferred (access)


class Minion:
    """Serve CDI objects to the containers of one host over a Unix socket."""

    def __init__(self, config: MinionConfig, reporter: DirectoryReporter | None = None) -> None:
        self.config = config
        self.reporter = reporter
        assert config.idle_limit is not None
        self.pool = SegmentPool(config.memory_limit, config.idle_limit)
        self.objects: dict[str, StoredObject] = {}
        self.containers: dict[str, Connection] = {}
        self._bound_uid: dict[str, int] = {}
        self._waiters: dict[str, list[tuple[Connection, int]]] = defaultdict(list)
        self._epoll = select.epoll()
        self._by_fd: dict[int, Connection] = {}
        self._doomed: list[Connection] = []  # to close once the request in hand is answered
        self._spare_fd = _open_spare()  # given up to shed a connection when out of fds
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._spin_until = 0
        self._buffer = memoryview(bytearray(protocol.MAX_MESSAGE))  # reused for every request
        self._pack = protocol.packer()  # the loop is the only thread that packs
        self.ready = threading.Event()
        self._handlers: dict[str, Callable[[Connection, dict[str, Any]], Reply]] = {
            Op.REGISTER: self._register,
            Op.CREATE: self._create,
            Op.USE: self._use,
            Op.COPY: self._copy,
            Op.ACCESS: self._access,
            Op.CANCEL: self._cancel,
            Op.TRANSFER: self._transfer,
            Op.RESIZE: self._resize,
            Op.DESTROY: self._destroy,
            Op.SET_RECOVERY: self._set_recovery,
            Op.STAT: self._stat,
            Op.LIST: self._list,
        }

    # ----------------------------------------------------------------- lifecycle
    def bind(self) -> None:
        path = self.config.socket_path
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)  # a stale socket left by a minion that died
            else:
                raise ConfigError(f"another minion is already listening on {path}")
            finally:
                probe.close()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        listener.bind(path)
        os.chmod(path, self.config.socket_mode)
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        for size, count in self.config.prewarm.items():
            self.pool.prewarm(size, count)
        self._epoll.register(listener.fileno(), select.EPOLLIN)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        log.info("minion for host %s listening on %s", self.config.host, path)

    def serve_forever(self) -> None:
        if self._listener is None:
            self.bind()
        self.ready.set()
        assert self._listener is not None
        listener = self._listener.fileno()
        by_fd = self._by_fd
        poll = self._epoll.poll
        clock = time.perf_counter_ns
        try:
            while not self._stopping:
                # While a container waits in access(), poll instead of sleeping for a short
                # budget: waking a sleeping process costs ~40 us on a VM, the hand-off ~10.
                spinning = self._waiters and clock() < self._spin_until
                events = poll(0 if spinning else -1)
                if not events:
                    os.sched_yield()  # polling: let a runnable container on this core go first
                for fd, _ in events:
                    conn = by_fd.get(fd)
                    if conn is not None:
                        self._on_readable(conn)
                    elif fd == listener:
                        self._accept()
                    elif fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 64)
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Ask the loop to stop; safe from signal handlers and other threads."""
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop())

    def _shutdown(self) -> None:
        for conn in list(self.containers.values()):
            self._close(conn, reclaim=False)
        for obj in self.objects.values():
            obj.segment.close()
        self.objects.clear()
        self.pool.close()
        if self._listener is not None:
            self._epoll.unregister(self._listener.fileno())
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.config.socket_path)
        self._epoll.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        if self._spare_fd is not None:
            os.close(self._spare_fd)
            self._spare_fd = None
        if self.reporter is not None:
            self.reporter.close()
        log.info("minion stopped")

    # ----------------------------------------------------------------- I/O
    def _accept(self) -> None:
        assert self._listener is not None
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as exc:
            # Out of fds (or another failure): keep serving the connections we have.
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self._shed_connection(exc)
            else:
                log.warning("accept failed: %s", exc)
            return
        try:
            pid, uid, gid = _PEERCRED.unpack(
                sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            )
            sock.setblocking(False)
            self._epoll.register(sock.fileno(), select.EPOLLIN)
        except OSError:
            sock.close()
            return
        self._by_fd[sock.fileno()] = Connection(sock=sock, pid=pid, uid=uid, gid=gid)

    def _shed_connection(self, exc: OSError) -> None:
        """Out of fds: accept the waiting connection with a spare fd and close it at once, so
        the client hears about it and the listener stops reporting readable."""
        log.warning("refusing a connection: %s (one fd per connection and per segment)", exc)
        if self._spare_fd is None or self._listener is None:
            return
        os.close(self._spare_fd)
        self._spare_fd = None
        try:
            sock, _ = self._listener.accept()
        except OSError:
            pass
        else:
            sock.close()
        self._spare_fd = _open_spare()

    def _on_readable(self, conn: Connection) -> None:
        request_id = 0
        try:
            try:
                request = protocol.receive_request(conn.sock, self._buffer)
            except BlockingIOError:
                return
            except OSError:
                request = None
            if request is None:
                # The peer hung up (or the socket failed): its objects go to their recovery.
                self._doom(conn)
                reply = None
            else:
                request_id = request.get("id", 0)
                if not isinstance(request_id, int):
                    raise ProtocolError("request id must be an integer")
                op = request.get("op", "")
                handler = self._handlers.get(op) if type(op) is str else None
                if handler is None:
                    raise ProtocolError(f"unknown operation {op!r}")
                if conn.container is None and op not in _OPEN_OPS:
                    raise NotRegistered("register(container_id) before using objects")
                reply = handler(conn, request)
        except CDIError as exc:
            reply = ({"ok": False, "code": exc.code, "msg": str(exc)}, None)
        except Exception as exc:  # a bug must not take the whole host's objects down
            log.exception("minion failed on a request from pid %d", conn.pid)
            reply = (
                {"ok": False, "code": "cdi_error", "msg": f"internal minion error: {exc}"},
                None,
            )
        if reply is not None:
            self._send(conn, request_id, *reply)
        if self._doomed:
            self._settle()

    def _send(
        self, conn: Connection, request_id: int, body: dict[str, Any], fd: int | None
    ) -> None:
        if conn.doomed:
            return
        body["id"] = request_id
        body.setdefault("ok", True)
        data = self._pack(body)
        try:
            if fd is None:
                conn.sock.send(data)
            else:
                fds = array.array("i", [fd])
                conn.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        except OSError as exc:
            # A client that does not read its replies (or is gone) loses its connection.
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.EAGAIN):
                log.warning("dropping pid %d: %s", conn.pid, exc)
            self._doom(conn)

    def _doom(self, conn: Connection) -> None:
        """Send ``conn`` nothing more; close it (recovering its objects) in ``_settle``."""
        if not conn.doomed:
            conn.doomed = True
            self._doomed.append(conn)

    def _settle(self) -> None:
        """Close the doomed connections, recovering their objects (which may doom more); runs
        after each request, once its reply is out."""
        doomed = self._doomed
        index = 0
        while index < len(doomed):
            conn = doomed[index]
            index += 1
            try:
                self._close(conn, reclaim=True)
            except Exception:
                log.exception("recovering the objects of a closed connection failed")
        doomed.clear()

    def _close(self, conn: Connection, *, reclaim: bool) -> None:
        conn.doomed = True
        fd = conn.sock.fileno()
        if fd >= 0 and self._by_fd.get(fd) is conn:
            del self._by_fd[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
        conn.sock.close()
        for request_id, key in conn.waiting.items():
            waiters = self._waiters.get(key, [])
            with contextlib.suppress(ValueError):
                waiters.remove((conn, request_id))
        conn.waiting.clear()
        conn.have.clear()
        cid = conn.container
        if cid is None or self.containers.get(cid) is not conn:
            return
        del self.containers[cid]
        conn.container = None
        if self.reporter is not None:
            self.reporter.container_gone(cid)
        if reclaim:
            self._recover_objects_of(cid)

    def _recover_objects_of(self, dead: str) -> None:
        """Objects of a dead owner go back to their recovery container, else are reclaimed.

        One object at a time: one that cannot be moved (a strict object needs a fresh segment,
        and memory may have run out) is reclaimed, and the others are still recovered."""
        for obj in [o for o in self.objects.values() if o.owner == dead]:
            if self.objects.get(obj.key) is not obj or obj.owner != dead:
                continue
            if obj.recovery != dead and obj.recovery in self.containers:
                log.info("owner %s of %s died; returning it to %s", dead, obj.key, obj.recovery)
                try:
                    self._set_owner(obj, obj.recovery)
                    continue
                except CDIError as exc:
                    log.warning(
                        "cannot return %s to %s (%s); reclaiming it", obj.key, obj.recovery, exc
                    )
                except Exception:
                    log.exception("cannot return %s to %s; reclaiming it", obj.key, obj.recovery)
                if self.objects.get(obj.key) is not obj or obj.owner != dead:
                    continue  # it failed after the hand-over: the new owner keeps it
            else:
                log.info("owner %s of %s died and nobody can recover it; reclaiming", dead, obj.key)
            self._remove(obj)

    # ----------------------------------------------------------------- helpers
    def _owned(self, conn: Connection, request: dict[str, Any]) -> StoredObject:
        obj = self._get(request)
        if obj.owner != conn.container:
            raise NotOwner(f"container {conn.container} does not own {obj.key!r}")
        return obj

    def _get(self, request: dict[str, Any]) -> StoredObject:
        key = request.get("key")
        # Every stored key passed check_key when it was created: a hit needs no validation.
        obj = self.objects.get(key) if type(key) is str else None
        if obj is None:
            key = protocol.check_key(key)
            raise ObjectNotFound(f"no object with key {key!r}")
        return obj

    def _set_owner(self, obj: StoredObject, owner: str) -> None:
        if obj.isolation is Isolation.STRICT and owner != obj.owner:
            self._move_to_fresh_segment(obj)
        obj.owner = owner
        owner_conn = self.containers.get(owner)
        if owner_conn is not None:
            obj.writers.add(owner_conn.uid)
        obj.generation += 1
        self._grant_waiters(obj)  # first: the new owner is waiting; bookkeeping can follow
        obj.updated_at = time.time()
        self._changed(obj)

    def _move_to_fresh_segment(self, obj: StoredObject) -> None:
        """Strict isolation: copy into a new segment and truncate the one the old owner mapped."""
        fresh = self.pool.acquire(obj.size, sealed=False)
        if obj.segment.intact(obj.size):
            fresh.copy_from(obj.segment, obj.size)
        else:
            log.warning("segment of %s was shrunk by its owner; its data is lost", obj.key)
        self.pool.discard(obj.segment)
        obj.segment = fresh

    def _grant_waiters(self, obj: StoredObject) -> None:
        waiters = self._waiters.get(obj.key)
        if not waiters:
            return
        # Settle the list first, send after: a failed send only dooms its connection (closed
        # after the request), so nothing below changes the waiters of this key.
        keep = []
        grants = []
        for conn, request_id in waiters:
            if conn.container == obj.owner and not conn.doomed:
                conn.waiting.pop(request_id, None)
                grants.append((conn, request_id, conn.have.pop(request_id, None)))
            else:
                keep.append((conn, request_id))
        if keep:
            self._waiters[obj.key] = keep
        else:
            del self._waiters[obj.key]
        if not grants:
            return
        for conn, request_id, have in grants:
            self._send(conn, request_id, obj.grant_fields(), obj.grant_fd(have))
        # If the new owner runs on this core (polling, or just woken by the grant), let it take
        # the object now rather than after our ack and epoll round: p50 ~138 -> ~105 us in
        # alternating bench runs; the sender's ack waits those microseconds instead.
        os.sched_yield()

    def _remove(self, obj: StoredObject) -> None:
        del self.objects[obj.key]
        if obj.isolation is Isolation.STRICT:
            self.pool.discard(obj.segment)
        else:
            self.pool.release(obj.segment, obj.size, obj.writers)
        # A failed send only dooms its connection: nothing here closes one or recovers objects.
        for conn, request_id in self._waiters.pop(obj.key, []):
            conn.waiting.pop(request_id, None)
            conn.have.pop(request_id, None)
            msg = {"ok": False, "code": ObjectNotFound.code, "msg": f"{obj.key!r} was destroyed"}
            self._send(conn, request_id, msg, None)
        if self.reporter is not None:
            self.reporter.object_removed(obj.key)

    def _changed(self, obj: StoredObject) -> None:
        if self.reporter is not None:
            self.reporter.object_changed(obj.key, obj.size, obj.owner, obj.generation)

    def _new_object(
        self,
        conn: Connection,
        key: str,
        size: int,
        isolation: Isolation,
        recovery: str,
        prefer: frozenset[int] = frozenset(),
        zeroed: bool = True,
    ) -> StoredObject:
        assert conn.container is not None
        cooperative = isolation is Isolation.COOPERATIVE
        segment = self.pool.acquire(
            size,
            sealed=cooperative,
            prefer=prefer if cooperative else frozenset(),
            uid=conn.uid,
            zeroed=zeroed,
        )
        obj = StoredObject(
            key=key,
            size=size,
            segment=segment,
            owner=conn.container,
            creator=conn.container,
            recovery=recovery,
            isolation=isolation,
            writers={conn.uid},
        )
        self.objects[key] = obj
        self._changed(obj)
        return obj

    # ----------------------------------------------------------------- operations
    def _register(self, conn: Connection, request: dict[str, Any]) -> Reply:
        cid = protocol.check_container_id(request.get("container"))
        if conn.container is not None:
            raise ProtocolError(f"this connection is already registered as {conn.container!r}")
        if cid in self.containers:
            raise ContainerExists(
                f"container id {cid!r} is in use by a live process (pid {self.containers[cid].pid})"
            )
        bound = self._bound_uid.get(cid)
        if bound is not None and bound != conn.uid and conn.uid != 0:
            raise ContainerExists(f"container id {cid!r} belongs to uid {bound}, not {conn.uid}")
        self._bound_uid.setdefault(cid, conn.uid)
        conn.container = cid
        self.containers[cid] = conn
        if self.reporter is not None:
            self.reporter.container_registered(cid, conn.pid, conn.uid)
        return (
            {
                "host": self.config.host,
                "minion_pid": os.getpid(),
                "max_object": self.config.max_object,
                "isolation": str(self.config.isolation),
            },
            None,
        )

    def _create(self, conn: Connection, request: dict[str, Any]) -> Reply:
        key = protocol.check_key(request.get("key"))
        size = protocol.check_size(request.get("size"), self.config.max_object)
        isolation = self._isolation(request.get("isolation"))
        recovery = protocol.check_container_id(request.get("recovery") or conn.container)
        have = protocol.check_segment_ids(request.get("have"))
        zeroed = request.get("zeroed", True)
        if type(zeroed) is not bool:
            raise InvalidArgument(f"zeroed must be true or false, got {zeroed!r}")
        if key in self.objects:
            raise KeyExists(f"an object with key {key!r} already exists")
        obj = self._new_object(conn, key, size, isolation, recovery, prefer=have, zeroed=zeroed)
        # No fd if the creator still maps the segment it got (a pooled one it used before).
        return (
            obj.grant_fields(),
            obj.grant_fd(obj.segment.id if obj.segment.id in have else None),
        )

    def _isolation(self, value: object) -> Isolation:
        if value is None:
            return self.config.isolation
        try:
            return Isolation(str(value))
        except ValueError as exc:
            raise InvalidArgument(
                f"isolation must be 'cooperative' or 'strict', got {value!r}"
            ) from exc

    def _use(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._get(request)
        return ({"size": obj.size, "owner": obj.owner, "isolation": str(obj.isolation)}, None)

    def _access(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._get(request)
        have = request.get("have")
        if obj.owner == conn.container:
            return (obj.grant_fields(), obj.grant_fd(have))
        if request.get("wait") is False:
            raise NotOwner(f"container {conn.container} does not own {obj.key!r}")
        request_id = request.get("id")
        if request_id is None:
            raise ProtocolError("an access that waits needs a request id to answer it by")
        self._spin_until = time.perf_counter_ns() + self.config.busy_poll_us * 1000
        conn.waiting[request_id] = obj.key
        if type(have) is int:
            conn.have[request_id] = have
        self._waiters[obj.key].append((conn, request_id))
        return None

    def _cancel(self, conn: Connection, request: dict[str, Any]) -> Reply:
        ref = request.get("ref")
        key = conn.waiting.pop(ref, None) if isinstance(ref, int) else None
        if key is not None and isinstance(ref, int):
            conn.have.pop(ref, None)
            waiters = self._waiters.get(key, [])
            with contextlib.suppress(ValueError):
                waiters.remove((conn, ref))
        return ({"cancelled": key is not None}, None)

    def _transfer(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._owned(conn, request)
        to = request.get("to")
        # Registered ids passed check_container_id: a hit needs no validation.
        if type(to) is not str or to not in self.containers:
            to = protocol.check_container_id(to)
        if to not in self.containers:
            raise UnknownContainer(f"no live container {to!r} is registered with this minion")
        if to != obj.owner:
            self._set_owner(obj, to)
        return ({"generation": obj.generation}, None)

    def _copy(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._owned(conn, request)
        new_key = protocol.check_key(request.get("new_key"))
        if new_key in self.objects:
            raise KeyExists(f"an object with key {new_key!r} already exists")
        assert conn.container is not None
        # Not zeroed: the copy overwrites its bytes (another uid's old bytes are zeroed anyway).
        new = self._new_object(conn, new_key, obj.size, obj.isolation, conn.container, zeroed=False)
        new.segment.copy_from(obj.segment, obj.size)
        return (new.grant_fields(), new.segment.fd)

    def _resize(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._owned(conn, request)
        size = protocol.check_size(request.get("size"), self.config.max_object)
        if size > obj.segment.capacity:
            bigger = self.pool.acquire(size, sealed=obj.isolation is Isolation.COOPERATIVE)
            bigger.copy_from(obj.segment, obj.size)
            if obj.isolation is Isolation.STRICT:
                self.pool.discard(obj.segment)
            else:
                self.pool.release(obj.segment, obj.size, obj.writers)
            obj.segment = bigger
        elif size > obj.size:
            obj.segment.zero(size, start=obj.size)  # growth reads as zeros, not old bytes
        obj.size = size
        obj.generation += 1
        obj.updated_at = time.time()
        self._changed(obj)
        return (obj.grant_fields(), None)

    def _destroy(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._owned(conn, request)
        self._remove(obj)
        return ({}, None)

    def _set_recovery(self, conn: Connection, request: dict[str, Any]) -> Reply:
        obj = self._owned(conn, request)
        obj.recovery = protocol.check_container_id(request.get("container"))
        return ({"recovery": obj.recovery}, None)

    def _stat(self, conn: Connection, request: dict[str, Any]) -> Reply:
        pool = self.pool
        return (
            {
                "host": self.config.host,
                "objects": len(self.objects),
                "containers": sorted(self.containers),
                "used_bytes": pool.used_bytes,
                "used_segments": pool.used_segments,
                "idle_bytes": pool.idle_bytes,
                "allocations": pool.allocations,
                "reuses": pool.reuses,
                "zeroed_bytes": pool.zeroed_bytes,
                "waiters": sum(len(w) for w in self._waiters.values()),
                "memory_limit": pool.memory_limit,
            },
            None,
        )

    def _list(self, conn: Connection, request: dict[str, Any]) -> Reply:
        return ({"objects": [o.describe(self.config.host) for o in self.objects.values()]}, None)


def _open_spare() -> int | None:
    """An fd kept open to give up when the process runs out of them (see ``_shed_connection``)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
