"""The client's side of its host's gateway (``cdi.remote.local``): cross-host transfers.

A container uses it without knowing: when the minion answers a ``transfer`` with
``UnknownContainer`` and a gateway runs beside the minion, the object goes through it to the
container's host; when ``access()`` finds no such key here, it waits for the gateway to
announce that the object has arrived from another host.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Any

from cdi import protocol
from cdi.errors import CDIError, MinionUnavailable, error_from_code
from cdi.url import gateway_socket_path

__all__ = ["GatewayLink"]


class GatewayLink:
    """One connection to the gateway, opened on first use; one request at a time."""

    def __init__(self, minion_socket: str) -> None:
        self.path = gateway_socket_path(minion_socket)
        self._sock: socket.socket | None = None
        self._receiver = protocol.Receiver()
        self._lock = threading.Lock()
        self._next_id = 1
        self.slot: str | None = None

    @property
    def connected(self) -> bool:
        """Whether our connection to the gateway (and with it our slot) is up: it has not
        hung up, and has sent nothing we did not ask for."""
        sock = self._sock
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return not poller.poll(0)

    @property
    def present(self) -> bool:
        """Whether a gateway runs beside the minion (its socket exists)."""
        return self._sock is not None or os.path.exists(self.path)

    def reserve(self) -> str:
        """Our slot: the gateway's container we transfer outgoing objects to."""
        if self.slot is None:
            self.slot = str(self.call("reserve")["slot"])
        return self.slot

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        with self._lock:
            sock = self._connect()
            request_id = self._next_id
            self._next_id += 1
            try:
                sock.send(protocol.pack({"op": op, "id": request_id, **args}))
                while True:
                    reply, fd = self._receiver.receive(sock)
                    if fd is not None:
                        os.close(fd)
                    if reply is None:
                        raise OSError("the gateway closed the connection")
                    if reply.get("id") == request_id:
                        break
            except OSError as exc:
                self.close()
                raise MinionUnavailable(
                    f"lost this host's CDI gateway at {self.path}: {exc}"
                ) from exc
        if reply.get("ok"):
            return reply
        raise error_from_code(str(reply.get("code", CDIError.code)), str(reply.get("msg", "")))

    def await_arrival(self, key: str, timeout: float, since: float) -> None:
        self.call("await", key=key, timeout=timeout, since=since)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
            try:
                sock.connect(self.path)
            except OSError as exc:
                sock.close()
                raise MinionUnavailable(
                    f"no CDI gateway at {self.path} (start the minion with --rpc-listen): {exc}"
                ) from exc
            self._sock = sock
            self.slot = None
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            self.slot = None


def monotonic_now() -> float:
    """``CLOCK_MONOTONIC``, which the gateway's arrival stamps use too."""
    return time.monotonic()
