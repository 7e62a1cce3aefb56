"""The per-host minion's loop: accepts containers, reads requests, sends replies and fds.

One thread, one ``epoll`` loop: every operation runs to completion before the next starts, which is
what makes ``transfer`` atomic (the old owner loses the object in the same step the new owner gains
it) and two racing transfers of one object impossible to both succeed. The operations are in
``operations.py``, the state they change in ``registry.py``; the protocol is ``cdi/PROTOCOL.md``.

Who is calling is known from the socket (``SO_PEERCRED``: pid, uid), never from the message. Memory
is handed out only as a file descriptor over ``SCM_RIGHTS`` and only to the current owner, so a
process that never owned an object has nothing it could map; the kernel enforces that.

When a send fails (the peer is gone, or does not read its replies), the connection is not closed on
the spot, in the middle of whatever operation was sending: it is marked doomed, gets nothing more,
and is closed, with its objects recovered, once the request in hand is answered. No operation ever
runs inside another.
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
from typing import TYPE_CHECKING, Any

from cdi import protocol
from cdi.errors import CDIError, ConfigError, NotRegistered, ProtocolError
from cdi.minion.config import MinionConfig
from cdi.minion.objects import Connection
from cdi.minion.operations import OPEN_OPS, Operations
from cdi.minion.registry import Registry

if TYPE_CHECKING:
    from cdi.controller.reporter import DirectoryReporter

__all__ = ["Minion"]

log = logging.getLogger(__name__)

_PEERCRED = struct.Struct("3i")
_SO_PEERPIDFD = 77  # Linux 6.5; Python 3.11's socket module has no name for it


class Minion:
    """Serve CDI objects to the containers of one host over a Unix socket."""

    def __init__(self, config: MinionConfig, reporter: DirectoryReporter | None = None) -> None:
        self.config = config
        self.registry = Registry(config, reporter)
        self.operations = Operations(self.registry)
        self._epoll = select.epoll()
        self._by_fd: dict[int, Connection] = {}
        self._by_pidfd: dict[int, Connection] = {}  # the registered processes, by pidfd
        self._doomed: list[Connection] = []  # to close once the request in hand is answered
        self._spare_fd = _open_spare()  # given up to shed a connection when out of fds
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stopping = False
        self._buffer = memoryview(bytearray(protocol.MAX_MESSAGE))  # reused for every request
        self._pack = protocol.packer()  # the loop is the only thread that packs
        self.ready = threading.Event()

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
        # Created 0600 (no moment when anyone else may connect), then given its group and mode.
        umask = os.umask(0o177)
        try:
            listener.bind(path)
        finally:
            os.umask(umask)
        if self.config.socket_group is not None:
            os.chown(path, -1, self.config.socket_group)
        os.chmod(path, self.config.socket_mode)
        listener.listen(256)
        listener.setblocking(False)
        self._listener = listener
        for size, count in self.config.prewarm.items():
            self.registry.pool.prewarm(size, count)
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
        registry = self.registry
        poll = self._epoll.poll
        clock = time.perf_counter_ns
        try:
            while not self._stopping:
                # While a container waits in access(), poll instead of sleeping for a short
                # budget: waking a sleeping process costs ~40 us on a VM, the hand-off ~10.
                spinning = registry.waiters and clock() < registry.spin_until
                events = poll(0 if spinning else -1)
                if not events:
                    os.sched_yield()  # polling: let a runnable container on this core go first
                for fd, _ in events:
                    conn = by_fd.get(fd)
                    if conn is not None:
                        self._on_readable(conn)
                    elif fd in self._by_pidfd:
                        self._on_exit(self._by_pidfd[fd])
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
        for conn in list(self.registry.containers.values()):
            self._close(conn, reclaim=False)
        self.registry.close()
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
                given = request.get("id")
                if type(given) is int:
                    request_id = given
                elif given is not None:  # nil counts as absent: id 0
                    raise ProtocolError("request id must be an integer")
                op = request.get("op")
                handler = self.operations.handlers.get(op) if type(op) is str else None
                if handler is None:
                    raise ProtocolError(f"unknown operation {op!r}")
                if conn.container is None and op not in OPEN_OPS:
                    raise NotRegistered("register(container_id) before using objects")
                reply = handler(conn, request)
                if op == "register" and conn.container is not None:
                    self._watch_process(conn)
        except CDIError as exc:
            reply = ({"ok": False, "code": exc.code, "msg": str(exc)}, None)
        except Exception as exc:  # a bug must not take the whole host's objects down
            log.exception("minion failed on a request from pid %d", conn.pid)
            reply = (
                {"ok": False, "code": "cdi_error", "msg": f"internal minion error: {exc}"},
                None,
            )
        if self.registry.outbox:
            self._flush()  # first: a new owner waits for its grant; the caller's ack can follow
        if reply is not None:
            self._send(conn, request_id, *reply)
        if self._doomed:
            self._settle()

    def _flush(self) -> None:
        """Send what the registry owes waiting containers (grants, refusals)."""
        outbox = self.registry.outbox
        granted = False
        while outbox:
            sending = outbox[:]
            outbox.clear()
            for conn, request_id, body, fd in sending:
                self._send(conn, request_id, body, fd)
                granted = granted or body.get("ok") is True
        if granted:
            # If the new owner runs on this core (polling, or just woken by the grant), let it
            # take the object now rather than after our ack and epoll round: p50 ~138 -> ~105 us
            # in alternating bench runs; the sender's ack waits those microseconds instead.
            os.sched_yield()

    def _watch_process(self, conn: Connection) -> None:
        """Watch the registered process itself (a pidfd), not only its socket: an owner that
        forked a child without exec and died has its objects recovered at once, although the
        child still holds the socket. The pidfd comes from the socket (``SO_PEERPIDFD``: the
        connecting process, with no pid reuse race), else from its pid; with neither (a peer
        in another pid namespace has pid 0), the socket's closing is what tells."""
        try:
            pidfd = conn.sock.getsockopt(socket.SOL_SOCKET, _SO_PEERPIDFD)
        except OSError:
            try:
                pidfd = os.pidfd_open(conn.pid) if conn.pid > 0 else -1
            except OSError:
                pidfd = -1
        if pidfd < 0:
            log.info("%s: no pidfd for pid %d; its socket tells", conn.container, conn.pid)
            return
        os.set_inheritable(pidfd, False)
        self._epoll.register(pidfd, select.EPOLLIN)
        self._by_pidfd[pidfd] = conn
        conn.pidfd = pidfd

    def _on_exit(self, conn: Connection) -> None:
        """The registered process exited: its connection closes, its objects are recovered."""
        log.info("container %s: its process %d exited", conn.container, conn.pid)
        self._doom(conn)
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
            if self.registry.outbox:
                self._flush()  # grants to recovery containers; a failed one dooms more
        doomed.clear()

    def _close(self, conn: Connection, *, reclaim: bool) -> None:
        conn.doomed = True
        fd = conn.sock.fileno()
        if fd >= 0 and self._by_fd.get(fd) is conn:
            del self._by_fd[fd]
            with contextlib.suppress(OSError):
                self._epoll.unregister(fd)
        conn.sock.close()
        if conn.pidfd is not None:
            self._by_pidfd.pop(conn.pidfd, None)
            with contextlib.suppress(OSError):
                self._epoll.unregister(conn.pidfd)
            os.close(conn.pidfd)
            conn.pidfd = None
        self.registry.forget(conn, reclaim=reclaim)


def _open_spare() -> int | None:
    """An fd kept open to give up when the process runs out of them (see ``_shed_connection``)."""
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
