"""The gateway's Unix socket for this host's containers (the client library speaks it).

Requests (msgpack maps on ``SOCK_SEQPACKET``, answered in order, each with its ``id``):

``reserve``  -> ``{"slot": id}``: a container of the gateway's, bound to this connection, to
             which the caller transfers an object it wants sent to another host.
``forward`` ``{key, to, from}`` -> ``{}`` once ``to`` owns the object on its host; or an error,
             and the object is back with ``from`` (unless the outcome is in doubt: then the
             gateway keeps asking the other host, and gives it back if that host did not keep it).
``locate`` ``{key}`` -> ``{host, size}`` of an object on any host (the controller's directory).
``await`` ``{key, timeout, since}`` -> ``{}`` once an object with that key has arrived from
             another host after ``since`` (``CLOCK_MONOTONIC`` seconds, one clock for every
             process of a host); ``access_timeout`` after ``timeout`` seconds;
             ``not_found`` at once if no host has such an object.
``channel`` ``{name, to, from, slots, slot_bytes, max_message}`` -> ``{relay}``: carry topic
             ``name``, which ``from`` writes, to reader ``to`` on another host; the topic
             grants ``relay``, a container of the gateway's (``cdi.remote.channels``).

Whoever may connect to the minion may connect here (the same mode and group as the minion's
socket); nothing here grants more than the minion does: the gateway forwards only objects that
were transferred to the caller's own slot.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import cdi
from cdi import protocol
from cdi.errors import AccessTimeout, CDIError, ProtocolError
from cdi.remote.serving import AcceptLoop

__all__ = ["LocalService"]

log = logging.getLogger(__name__)

_ARRIVALS_KEPT_S = 30.0

Forward = Callable[[cdi.Client, str, str, str], None]
Locate = Callable[[str], dict[str, Any]]
Exists = Callable[[str], object]
Channel = Callable[[dict[str, Any]], dict[str, Any]]


class LocalService:
    """Serves ``reserve``/``forward``/``await`` on ``path``; one thread per connection."""

    def __init__(
        self,
        path: str,
        minion_socket: str,
        prefix: str,
        forward: Forward,
        locate: Locate,
        exists: Exists,
        mode: int = 0o660,
        group: int | None = None,
        *,
        channel: Channel | None = None,
    ) -> None:
        """``mode`` and ``group``: the socket file's, as the minion's (``MinionConfig``);
        ``channel``: carries a topic to a reader on another host (``cdi.remote.channels``)."""
        self._channel = channel
        self.path = path
        self.minion_socket = minion_socket
        self._prefix = prefix
        self._forward = forward
        self._locate = locate
        self._exists = exists
        self._ids = itertools.count(1)
        # Slot ids differ between the gateway's lives: a client that still names a slot of a
        # gateway that restarted must not hand its object to another client's new slot.
        self._life = secrets.token_hex(4)
        self._arrived: dict[str, tuple[float, int]] = {}  # key -> (when, generation)
        self._arrival = threading.Condition()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        # Created 0600 (no moment when anyone else may connect), then given the minion's group
        # and mode: who may not use the minion may not use its gateway either.
        umask = os.umask(0o177)
        try:
            self._server.bind(path)
        finally:
            os.umask(umask)
        if group is not None:
            os.chown(path, -1, group)
        os.chmod(path, mode)
        self._server.listen(64)
        self._loop = AcceptLoop(self._server, self._serve, "cdi-gateway-local")

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def arrived(self, key: str, generation: int = 0) -> None:
        """An object with ``key`` was handed to its owner here, at ``generation`` (0:
        unknown): wake whoever awaits it."""
        with self._arrival:
            now = time.monotonic()
            self._arrived[key] = (now, generation)
            if len(self._arrived) > 10_000:
                self._arrived = {
                    k: a for k, a in self._arrived.items() if now - a[0] < _ARRIVALS_KEPT_S
                }
            self._arrival.notify_all()

    def arrival(self, key: str) -> tuple[float, int]:
        """When (``time.monotonic()``) ``key`` last arrived here and its generation then;
        ``(-1.0, 0)`` if it did not lately (0: a generation not known)."""
        with self._arrival:
            return self._arrived.get(key, (-1.0, 0))

    def _arrived_at(self, key: str) -> float:
        return self._arrived.get(key, (-1.0, 0))[0]

    def _serve(self, sock: socket.socket) -> None:
        slot: cdi.Client | None = None
        receiver = protocol.Receiver()
        try:
            while True:
                request, fd = receiver.receive(sock)
                if fd is not None:
                    os.close(fd)
                if request is None:
                    return
                try:
                    body = self._answer(request, slot)
                    if request.get("op") == "reserve" and slot is None:
                        slot = cdi.connect(self.minion_socket, body["slot"])
                        slot.forwarding = False  # the gateway itself sends what it holds
                except CDIError as exc:
                    body = {"ok": False, "code": exc.code, "msg": str(exc)}
                body["id"] = request.get("id", 0)
                body.setdefault("ok", True)
                sock.send(protocol.pack(body))
        except (OSError, CDIError) as exc:
            if not self._loop.closing:
                log.debug("a local gateway connection ended: %s", exc)
        finally:
            if slot is not None:
                slot.close()  # what the slot still holds goes to each object's recovery

    def _answer(self, request: dict[str, Any], slot: cdi.Client | None) -> dict[str, Any]:
        op = request.get("op")
        if op == "reserve":
            if slot is not None:
                return {"slot": slot.container_id}
            return {"slot": f"{self._prefix}{self._life}-{next(self._ids)}"}
        if op == "forward":
            if slot is None:
                raise ProtocolError("reserve a slot before forwarding")
            key = protocol.check_key(request.get("key"))
            to = protocol.check_container_id(request.get("to"))
            back = protocol.check_container_id(request.get("from"))
            self._forward(slot, key, to, back)
            return {}
        if op == "locate":
            return self._locate(protocol.check_key(request.get("key")))
        if op == "await":
            key = protocol.check_key(request.get("key"))
            timeout, since = request.get("timeout"), request.get("since")
            self._await(
                key,
                float(timeout) if isinstance(timeout, int | float) else 10.0,
                float(since) if isinstance(since, int | float) else 0.0,
            )
            return {}
        if op == "channel" and self._channel is not None:
            return self._channel(request)
        raise ProtocolError(f"unknown gateway operation {op!r}")

    def _await(self, key: str, timeout: float, since: float) -> None:
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            with self._arrival:
                remaining = deadline - time.monotonic()
                if self._arrived_at(key) < since and remaining > 0:
                    self._arrival.wait(min(remaining, 0.5))
                if self._arrived_at(key) >= since:
                    return
                if time.monotonic() >= deadline:
                    raise AccessTimeout(f"{key!r} did not arrive from another host in time")
            # Half a second and nothing: nothing to wait for if no host has it (asked again
            # every half second, so a destroy elsewhere ends the wait). The home the directory
            # names may lag behind a move, so it is not asked for here.
            self._exists(key)
