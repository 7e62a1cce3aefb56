"""A blocking request/reply channel to the local minion.

The two operations on every hand-off's path, ``transfer`` and ``access``, go through the
native extension ``cdi._hotpath`` when it is built and the minion takes the compact form: one
call that sends the request and reads the reply, with no Python in between. Everything else,
and every reply it does not expect (errors, replies to other requests), is read here as before.
``$CDI_CLIENT_NATIVE=0`` (or ``native=False``) keeps a connection on the Python path.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from cdi import compact, protocol
from cdi.errors import (
    AccessTimeout,
    CDIError,
    ConfigError,
    InvalidArgument,
    KeyExists,
    MinionUnavailable,
    NotOwner,
    ObjectNotFound,
    error_from_code,
)

try:
    from cdi._hotpath import Wire
except ImportError:  # installed without Rust: the Python path only
    Wire = None  # type: ignore[assignment,misc]

__all__ = ["NATIVE_ENV", "MinionConnection", "native_built"]

NATIVE_ENV = "CDI_CLIENT_NATIVE"
_I64 = range(-(1 << 63), 1 << 63)


def native_built() -> bool:
    """Whether the native hot path (``cdi._hotpath``) is installed."""
    return Wire is not None


def _use_native(native: bool | None) -> bool:
    if native is None:
        return Wire is not None and os.environ.get(NATIVE_ENV, "1") != "0"
    if native and Wire is None:
        raise ConfigError(
            "the client's native hot path (cdi._hotpath) is not built: install cdiflow with "
            "a Rust toolchain on PATH, or use native=False"
        )
    return native


class MinionConnection:
    """One socket, one request in flight at a time (a lock serialises callers).

    Replies are matched by request id; a stray reply (a grant that raced a cancelled ``access``)
    has its file descriptor closed so nothing leaks.
    """

    def __init__(
        self,
        path: str,
        timeout: float,
        spin_us: int = 0,
        reconnect_s: float = 10.0,
        native: bool | None = None,
    ) -> None:
        """``reconnect_s``: how long a registered connection that loses its minion tries to
        register again with the minion's successor, when that one kept the objects.
        ``native``: the hot path in ``cdi._hotpath`` (``None``: when built, unless
        ``$CDI_CLIENT_NATIVE`` is 0; ``True`` without it is a ``ConfigError``)."""
        self.native = _use_native(native)
        self.path = path
        self.timeout = timeout
        self.spin_ns = max(0, spin_us) * 1000
        self._spin_s = self.spin_ns / 1e9
        self.reconnect_s = reconnect_s
        self._receiver = protocol.Receiver()
        self._pack = protocol.packer()  # used under self._lock only
        self._lock = threading.Lock()
        self._next_id = 1
        # (container id, the minion's store) once registered: what a reconnection needs.
        self._registration: tuple[str, str] | None = None
        # The container's resume token (``register``'s ``resume``): a secret, kept only here
        # and sent only in ``register``; it never goes into a message, log or ``repr``.
        self._resume_token = ""
        # Whether the minion takes ``access`` and ``transfer`` in the compact form (``register``
        # says so); a minion of before it gets maps.
        self._compact = False

        self.reconnections = 0
        self._poller = select.poll()
        self._sock: socket.socket | None = None
        self._wire: Wire | None = None  # the native hot path over ``_sock``, if used
        self._open()

    def _open(self) -> None:
        path = self.path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(self.timeout)
            sock.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            raise MinionUnavailable(
                f"no CDI minion is listening on {path}; start one with "
                f"`cdiflow cdi minion --socket {path}`"
            ) from exc
        except OSError as exc:
            sock.close()
            raise MinionUnavailable(f"cannot connect to the CDI minion at {path}: {exc}") from exc
        # The socket stays blocking for good; waits with a deadline poll() first and polls use
        # MSG_DONTWAIT. Python's settimeout() costs two fcntl calls per switch and makes every
        # send and receive poll() first: five syscalls where one does.
        sock.settimeout(None)
        self._poller = select.poll()
        self._poller.register(sock.fileno(), select.POLLIN)
        self._receiver = protocol.Receiver()
        self._sock = sock
        if self.native:
            self._wire = Wire(sock.fileno())

    def register(self, container_id: str) -> dict[str, Any]:
        """Register as ``container_id``; the reply. Remembered: if the minion restarts and
        its successor holds the same objects (the same ``store``), the connection registers
        again on its own and carries on."""
        reply, _ = self.call(protocol.Op.REGISTER, container=container_id)
        self._compact = reply.get("compact") == compact.VERSION
        store = reply.get("store")
        self._registration = (container_id, store) if isinstance(store, str) and store else None
        self._resume_token = ""
        self._take_token(reply)
        return reply

    def _take_token(self, reply: dict[str, Any]) -> None:
        """Keep the resume token the reply carries (a new one), and take it out of the reply
        so that nothing the caller keeps or prints holds it."""
        token = reply.pop("resume", None)
        if isinstance(token, str) and token:
            self._resume_token = token

    def close(self) -> None:
        with self._lock:
            self._wire = None  # it holds the fd's number: never use it past the close
            if self._sock is not None:
                self._sock.close()
                self._sock = None

    @property
    def closed(self) -> bool:
        return self._sock is None

    def call(
        self, op: protocol.Op, after_send: Callable[[], None] | None = None, **args: Any
    ) -> tuple[dict[str, Any], int | None]:
        """Send one request and wait for its reply; raise the error the minion reports.

        ``after_send`` runs between sending and waiting, for work that overlaps the minion's."""
        with self._lock:
            request_id = self._next_id
            self._next_id += 1
            try:
                exchanged = None
                if self._wire is not None and after_send is None:
                    exchanged = self._exchange(op, args, request_id, None, spin=False)
                if exchanged is None:
                    self._send(op, args, request_id)
                    if after_send is not None:
                        after_send()
                    exchanged = self._receive(request_id, deadline=None)
            except MinionUnavailable:
                if not self._resume():
                    raise
                return self._again(op, args)
            return _checked(exchanged[0]), exchanged[1]

    def call_blocking(
        self, op: protocol.Op, timeout: float | None, **args: Any
    ) -> tuple[dict[str, Any], int | None]:
        """Like ``call`` for a request the minion may defer (``access``); honours ``timeout``."""
        with self._lock:
            deadline = None if timeout is None else time.monotonic() + timeout
            request_id = self._next_id
            self._next_id += 1
            try:
                exchanged = None
                if self._wire is not None:
                    exchanged = self._exchange(op, args, request_id, deadline, spin=True)
                if exchanged is None:
                    self._send(op, args, request_id)
                    exchanged = self._receive(request_id, deadline=deadline, spin=True)
                reply, fd = exchanged
            except MinionUnavailable:
                if not self._resume():
                    raise
                # A deferred request is not carried over: ask the successor, as long as is left.
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                return self._blocking_again(op, left, args)
            except AccessTimeout:
                granted = self._withdraw(request_id)
                if granted is None:
                    raise
                reply, fd = granted
            return _checked(reply), fd

    def _withdraw(self, request_id: int) -> tuple[dict[str, Any], int | None] | None:
        """Cancel a deferred request that timed out: the grant that crossed the cancel (it
        still counts), else ``None``."""
        cancel_id = self._send(protocol.Op.CANCEL, {"ref": request_id})
        granted: tuple[dict[str, Any], int | None] | None = None
        while True:
            body, fd = self._next_reply(deadline=None)
            if body.get("id") == request_id:
                granted = (body, fd)
            elif body.get("id") == cancel_id:
                return granted
            elif fd is not None:
                os.close(fd)

    # ---------------------------------------------------------------- reconnection
    def _resume(self) -> bool:
        """The minion went away: register again with its successor (``reconnect_s`` long at
        most). True if that one holds our objects still (the same ``store``); else the
        connection stays closed, as it would without a successor."""
        if self._registration is None:
            return False
        container_id, store = self._registration
        self.close_quietly()
        deadline = time.monotonic() + self.reconnect_s
        while True:
            try:
                self._open()
                request: dict[str, Any] = {"container": container_id}
                if self._resume_token:
                    # Proves we are the container it expects when it cannot see our process
                    # (another pid namespace); a minion of before tokens ignores it.
                    request["resume"] = self._resume_token
                request_id = self._send(protocol.Op.REGISTER, request)
                reply = _checked(self._receive(request_id, deadline=None)[0])
                break
            except MinionUnavailable:
                self.close_quietly()
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
            except CDIError:  # the successor refuses us the name: we are not who it expects
                self.close_quietly()
                self._registration = None
                self._resume_token = ""
                return False
        self._take_token(reply)
        self._compact = reply.get("compact") == compact.VERSION
        if reply.get("store") != store:
            # A minion that started afresh: our objects are gone with the one before.
            self.close_quietly()
            self._registration = None
            self._resume_token = ""
            return False
        self.reconnections += 1
        return True

    def _again(self, op: protocol.Op, args: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
        """Ask the successor what we asked its predecessor, which may or may not have done it
        before it went (it journals each change before its reply): an operation that finds
        its own work done answers as if it had done it."""
        args.pop("id", None)
        args.pop("op", None)
        try:
            reply, fd = self._receive(self._send(op, args), deadline=None)
            return _checked(reply), fd
        except KeyExists:
            if op not in (protocol.Op.CREATE, protocol.Op.COPY):
                raise
            key = args["key" if op is protocol.Op.CREATE else "new_key"]
            if self._owner(key) != self._container():
                raise
            reply, fd = self._receive(
                self._send(protocol.Op.ACCESS, {"key": key, "wait": False}), deadline=None
            )
            return _checked(reply), fd
        except NotOwner:
            if op is not protocol.Op.TRANSFER:
                raise
            owner = self._owner(args["key"])
            if owner not in (args.get("to"), args.get("via")):
                raise
            use = self._use(args["key"])
            return {"generation": use["generation"], "keep_mapping": False, "to": owner}, None
        except ObjectNotFound:
            if op is not protocol.Op.DESTROY:
                raise
            return {"keep_mapping": False}, None

    def _blocking_again(
        self, op: protocol.Op, timeout: float | None, args: dict[str, Any]
    ) -> tuple[dict[str, Any], int | None]:
        args.pop("id", None)
        args.pop("op", None)
        request_id = self._send(op, args)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            reply, fd = self._receive(request_id, deadline=deadline, spin=True)
        except AccessTimeout:
            granted = self._withdraw(request_id)
            if granted is None:
                raise
            reply, fd = granted
        return _checked(reply), fd

    def _use(self, key: str) -> dict[str, Any]:
        return _checked(self._receive(self._send(protocol.Op.USE, {"key": key}), None)[0])

    def _owner(self, key: str) -> str | None:
        try:
            return str(self._use(key)["owner"])
        except ObjectNotFound:
            return None

    def _container(self) -> str | None:
        return self._registration[0] if self._registration is not None else None

    # ---------------------------------------------------------------- internals
    def _exchange(
        self,
        op: protocol.Op,
        args: dict[str, Any],
        request_id: int,
        deadline: float | None,
        spin: bool,
    ) -> tuple[dict[str, Any], int | None] | None:
        """``transfer`` or ``access`` sent and answered in one native call; ``None`` if it was
        not sent (another operation, fields the compact form cannot carry, a minion without the
        form, a full socket buffer): the caller sends it the Python way, with ``request_id``."""
        wire = self._wire
        if wire is None or not self._compact:
            return None
        try:
            if op is protocol.Op.TRANSFER:
                key, to, via = args.get("key"), args.get("to"), args.get("via", "")
                if len(args) != 2 + ("via" in args) or not (
                    type(key) is type(to) is type(via) is str
                ):
                    return None
                got = wire.transfer(request_id, key, to, via)
            elif op is protocol.Op.ACCESS:
                key, wait, have = args.get("key"), args.get("wait", True), args.get("have")
                if len(args) != 1 + ("wait" in args) + ("have" in args):
                    return None
                if type(key) is not str or type(wait) is not bool:
                    return None
                if have is not None and not (type(have) is int and have in _I64):
                    return None
                spin_s = self._spin_s if spin else 0.0
                got = wire.access(request_id, key, wait, have, spin_s, deadline)
            else:
                return None
        except AccessTimeout:
            raise
        except OSError as exc:
            raise MinionUnavailable(f"lost the CDI minion at {self.path}: {exc}") from exc
        if got is None:
            return None
        body, fd = got
        if isinstance(body, dict):
            return body, fd  # a compact success of this request, read natively
        # Anything else (an error map, a reply to an earlier request, a hang-up) is read here.
        reply, fd = self._decoded(None if body is None else protocol.read_reply(body, fd), fd)
        if reply.get("id") == request_id:
            return reply, fd
        if fd is not None:
            os.close(fd)
        return self._receive(request_id, deadline, spin)

    def _send(self, op: protocol.Op, args: dict[str, Any], request_id: int | None = None) -> int:
        sock = self._require()
        if request_id is None:
            request_id = self._next_id
            self._next_id += 1
        try:
            data = compact.encode_request(op, request_id, args) if self._compact else None
            if data is None:
                args["op"] = str(op)
                args["id"] = request_id
                data = self._pack(args)
        except (OverflowError, TypeError, ValueError) as exc:  # what MessagePack cannot carry
            raise InvalidArgument(
                f"{op}: the request cannot be sent ({exc}); integers must fit in 64 bits"
            ) from exc
        try:
            try:
                sock.send(data, protocol.DONTWAIT)
            except BlockingIOError:
                # The minion is not reading (the socket buffer is full): wait, but not forever.
                ready = select.select([], [sock], [], self.timeout)[1]
                if not ready:
                    raise TimeoutError(f"the minion took no request for {self.timeout} s") from None
                sock.send(data, protocol.DONTWAIT)
        except OSError as exc:
            raise MinionUnavailable(f"lost the CDI minion at {self.path}: {exc}") from exc
        return request_id

    def _receive(
        self, request_id: int, deadline: float | None, spin: bool = False
    ) -> tuple[dict[str, Any], int | None]:
        while True:
            body, fd = self._next_reply(deadline, spin)
            if body.get("id") == request_id:
                return body, fd
            if fd is not None:
                os.close(fd)

    def _next_reply(
        self, deadline: float | None, spin: bool = False
    ) -> tuple[dict[str, Any], int | None]:
        sock = self._require()
        if spin and self.spin_ns and (polled := self._poll(sock, deadline)) is not None:
            return polled
        try:
            if deadline is None:
                body, fd = self._receiver.receive(sock)
            else:
                body, fd = self._receive_by(sock, deadline)
        except AccessTimeout:
            raise
        except OSError as exc:
            raise MinionUnavailable(f"lost the CDI minion at {self.path}: {exc}") from exc
        return self._decoded(body, fd)

    def _receive_by(
        self, sock: socket.socket, deadline: float
    ) -> tuple[dict[str, Any] | None, int | None]:
        """Sleep in poll() until a message is there or ``deadline`` (monotonic) has passed."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._poller.poll(max(1, math.ceil(remaining * 1000))):
                raise AccessTimeout("ownership did not arrive before the timeout")
            try:
                return self._receiver.receive(sock, protocol.DONTWAIT)
            except BlockingIOError:
                continue  # woken without a message: sleep again

    def _poll(
        self, sock: socket.socket, deadline: float | None
    ) -> tuple[dict[str, Any], int | None] | None:
        """Poll without sleeping for up to ``spin_ns``; ``None`` if nothing came."""
        now = time.perf_counter_ns()
        stop = now + self.spin_ns
        if deadline is not None:
            stop = min(stop, now + int((deadline - time.monotonic()) * 1e9))
        receive = self._receiver.receive
        ready = self._poller.poll
        clock = time.perf_counter_ns
        while True:
            # poll(0) is cheaper than a recv that fails (a syscall plus an exception).
            if ready(0):
                try:
                    body, fd = receive(sock, protocol.DONTWAIT)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise MinionUnavailable(f"lost the CDI minion at {self.path}: {exc}") from exc
                else:
                    return self._decoded(body, fd)
            if clock() >= stop:
                return None
            os.sched_yield()  # let a runnable peer on this core (the minion) go first

    def _decoded(
        self, body: dict[str, Any] | None, fd: int | None
    ) -> tuple[dict[str, Any], int | None]:
        if body is None:
            self.close_quietly()
            raise MinionUnavailable(f"the CDI minion at {self.path} closed the connection")
        return body, fd

    def close_quietly(self) -> None:
        self._wire = None
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None

    def _require(self) -> socket.socket:
        if self._sock is None:
            raise MinionUnavailable(f"the connection to the CDI minion at {self.path} is closed")
        return self._sock


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("ok"):
        return reply
    code = reply.get("code", CDIError.code)
    raise error_from_code(str(code), str(reply.get("msg", "the minion refused the request")))
