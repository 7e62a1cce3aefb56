"""Sending an object to another host's gateway, and learning the outcome when the link fails.

The receiving gateway commits (hands the object to its new owner) only once every byte has
arrived, and answers ``resolve`` for a transfer it has not committed by fencing it: from then on
it will never commit it. So:

* the link fails before the whole payload was handed to the kernel: the other side cannot
  commit; the transfer failed (not in doubt);
* the payload went out but no answer came: ask ``resolve`` on a new link. ``committed``: done.
  ``aborted`` (fenced): failed. The connection is refused: the gateway there is gone, and with
  it its minion (they are one process), so nothing there holds the object: failed. No answer
  at all: in doubt, and the caller keeps asking.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time
from typing import Any

from cdi.errors import CDIError, ProtocolError, TransferFailed, error_from_code
from cdi.remote.handshake import greet
from cdi.remote.transport import Transport
from cdi.remote.wire import LINK_TIMEOUT_S, receive_header, send_frame

__all__ = ["Outcome", "Sender"]

log = logging.getLogger(__name__)

Outcome = str  # "committed" | "aborted" | "unknown"


class Sender:
    """Sends offers over pooled links, one link per transfer in flight. Each link starts with
    the handshake (``cdi.remote.handshake``): ``key`` is the cluster's gateway key, ``host``
    this gateway's host."""

    def __init__(
        self, transport: Transport, key: str, host: str, connect_timeout: float = 3.0
    ) -> None:
        self.transport = transport
        self.connect_timeout = connect_timeout
        self._key = key
        self._host = host
        self._idle: dict[str, list[socket.socket]] = {}
        self._lock = threading.Lock()

    def send(self, address: str, header: dict[str, Any], payload: memoryview) -> dict[str, Any]:
        """Offer ``payload`` to the gateway at ``address``; its reply when it committed.

        Raises the receiver's refusal as a ``CDIError`` (``UnknownContainer``, ``KeyExists``,
        ``OutOfMemory``...) or ``TransferFailed`` (``in_doubt`` in its message and attribute)."""
        xfer = secrets.token_hex(12)
        offer = {**header, "op": "offer", "xfer": xfer, "size": len(payload)}
        sock, pooled = self._take(address)
        while True:
            try:
                send_frame(sock, offer, payload)
                break
            except OSError as exc:
                _close(sock)
                if not pooled:
                    raise _failed(address, f"the link failed while sending: {exc}") from exc
                # An idle pooled link the peer had closed: the payload did not get through.
                sock, pooled = self._connect(address), False
        try:
            # The last bytes are in flight (at most a socket buffer) and the commit is local.
            sock.settimeout(LINK_TIMEOUT_S)
            reply = receive_header(sock)
            if reply is None:
                raise ConnectionError("the link closed before the answer")
        except (OSError, ProtocolError) as exc:
            _close(sock)
            log.warning("transfer %s to %s: no answer (%s); resolving", xfer, address, exc)
            return self._resolved(address, xfer, exc)
        sock.settimeout(None)
        self._give_back(address, sock)
        return _checked(reply)

    def resolve(self, address: str, xfer: str) -> Outcome:
        """Ask the receiver for the outcome, fencing the transfer if it has not committed."""
        try:
            sock = self._link(address)
        except ConnectionRefusedError:
            return "aborted"  # no gateway there: its minion, and any copy, is gone too
        except (OSError, CDIError):  # unreachable, or not our gateway: no answer to trust
            return "unknown"
        try:
            sock.settimeout(self.connect_timeout)
            send_frame(sock, {"op": "resolve", "xfer": xfer})
            reply = receive_header(sock)
        except (OSError, ProtocolError):
            return "unknown"
        finally:
            _close(sock)
        state = reply.get("state") if reply else None
        return state if state in ("committed", "aborted") else "unknown"

    def _resolved(self, address: str, xfer: str, cause: BaseException) -> dict[str, Any]:
        deadline = time.monotonic() + 10.0
        while True:
            outcome = self.resolve(address, xfer)
            if outcome == "committed":
                return {"ok": True}
            if outcome == "aborted":
                raise _failed(address, f"the link failed ({cause}) before the other host kept it")
            if time.monotonic() >= deadline:
                raise TransferFailed(
                    f"transfer to the gateway at {address}: the link failed ({cause}) after "
                    "the bytes left, and the other host has not said whether it kept the "
                    "object: the outcome is in doubt",
                    in_doubt=True,
                    xfer=xfer,
                )
            time.sleep(0.5)

    def _take(self, address: str) -> tuple[socket.socket, bool]:
        with self._lock:
            idle = self._idle.get(address)
            if idle:
                return idle.pop(), True
        return self._connect(address), False

    def _connect(self, address: str) -> socket.socket:
        """A new link for an offer; ``TransferFailed`` if there is none to be had."""
        try:
            return self._link(address)
        except (OSError, CDIError) as exc:
            raise _failed(address, f"cannot connect: {exc}") from exc

    def _link(self, address: str) -> socket.socket:
        """A new link to ``address`` once both gateways proved they belong to the cluster;
        ``OSError`` (``ConnectionRefusedError`` when nothing listens there), or the
        handshake's ``NotAuthenticated``/``ProtocolError``."""
        sock = self.transport.connect(address, self.connect_timeout)
        try:
            greet(sock, self._key, self._host, address)
        except BaseException:
            _close(sock)
            raise
        return sock

    def _give_back(self, address: str, sock: socket.socket) -> None:
        with self._lock:
            self._idle.setdefault(address, []).append(sock)

    def close(self) -> None:
        with self._lock:
            for links in self._idle.values():
                for sock in links:
                    _close(sock)
            self._idle.clear()


def _failed(address: str, why: str) -> TransferFailed:
    return TransferFailed(f"transfer to the gateway at {address} failed: {why}")


def _checked(reply: dict[str, Any]) -> dict[str, Any]:
    if reply.get("ok"):
        return reply
    raise error_from_code(str(reply.get("code", CDIError.code)), str(reply.get("msg", "")))


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()
