"""The receiving side: offers from other hosts' gateways become objects on this host's minion.

Per offer: ``create`` the object as one of the gateway's containers, receive the payload
straight into its mapping, then ``transfer`` it to the new owner — an ordinary same-host
transfer, so the new owner's ``access()`` returns only once every byte is there. A link that
ends mid-payload leaves no half object: the gateway destroys it (and if the gateway itself
dies, the minion reclaims what its containers held). Commit and fencing (``resolve``) take one
lock, so a transfer is committed or fenced, never both.
"""

from __future__ import annotations

import collections
import itertools
import logging
import socket
import threading
from collections.abc import Callable
from typing import Any

import cdi
from cdi.errors import CDIError, InvalidArgument, ProtocolError
from cdi.remote.handshake import answer
from cdi.remote.serving import AcceptLoop
from cdi.remote.transport import Transport, tune_accepted
from cdi.remote.wire import receive_header, receive_into, send_frame

__all__ = ["InboundServer"]

log = logging.getLogger(__name__)

_REMEMBERED = 100_000  # outcomes kept for late ``resolve`` questions
_DRAIN = 1 << 20


class InboundServer:
    """Accepts gateway links on ``listen``; delivers their objects to this host's minion."""

    def __init__(
        self,
        transport: Transport,
        listen: str,
        minion_socket: str,
        container_prefix: str,
        recovery: Callable[[str, str], str],
        delivered: Callable[[str, int], None],
        departed: Callable[[str], None],
        key: str,
        *,
        channel: Callable[[socket.socket, dict[str, Any]], None] | None = None,
    ) -> None:
        """``key``: the cluster's gateway key, which a link must prove it holds before it
        offers or asks anything (``cdi.remote.handshake``).
        ``recovery(key, their_recovery)``: the recovery container to give a new object;
        ``delivered(key, generation)``: called once an object has been handed to its owner,
        with its generation here (0: the offer carried none);
        ``departed(key)``: waits until a copy of ``key`` leaving this host is gone;
        ``channel(sock, request)``: serves a link that carries a channel here, to its end."""
        self._channel = channel
        self.minion_socket = minion_socket
        self._prefix = container_prefix
        self._recovery = recovery
        self._delivered = delivered
        self._departed = departed
        self._key = key
        self._server = transport.listen(listen)
        self.address = "{}:{}".format(*self._server.getsockname()[:2])
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._outcomes: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._loop = AcceptLoop(self._server, self._serve, "cdi-gateway-in")

    @property
    def listener(self) -> socket.socket:
        """The bound, listening socket (the minion accepts on it instead: ``native``)."""
        return self._server

    def start(self) -> None:
        self._loop.start()

    def close(self) -> None:
        self._loop.close()

    # ------------------------------------------------------------------ links
    def _serve(self, sock: socket.socket) -> None:
        tune_accepted(sock)
        client: cdi.Client | None = None
        try:
            answer(sock, self._key)
            while True:
                header = receive_header(sock)
                if header is None:
                    return
                op = header.get("op")
                if op == "resolve":
                    send_frame(sock, {"ok": True, "state": self.resolve(str(header.get("xfer")))})
                elif op == "offer":
                    if client is None:
                        client = cdi.connect(self.minion_socket, f"{self._prefix}{next(self._ids)}")
                        client.forwarding = False  # it hands objects to containers of this host
                    send_frame(sock, self._take(client, sock, header))
                elif op == "channel" and self._channel is not None:
                    self._channel(sock, header)  # the link is the channel's from now on
                    return
                else:
                    raise ProtocolError(f"unknown gateway operation {op!r}")
        except (OSError, CDIError) as exc:
            if not self._loop.closing:
                log.info("gateway link closed: %s", exc)
        finally:
            if client is not None:
                client.close()  # anything it still owns is reclaimed: never a half object

    # ------------------------------------------------------------------ offers
    def resolve(self, xfer: str) -> str:
        """``committed`` if that transfer was handed over; otherwise fence it: ``aborted``."""
        with self._lock:
            outcome = self._outcomes.get(xfer)
            if outcome == "committed":
                return outcome
            self._remember(xfer, "aborted")
            return "aborted"

    def _take(
        self, client: cdi.Client, sock: socket.socket, offer: dict[str, Any]
    ) -> dict[str, Any]:
        xfer, key, to, size = (offer.get(k) for k in ("xfer", "key", "to", "size"))
        if not isinstance(xfer, str) or not isinstance(size, int) or size < 0:
            raise ProtocolError(f"a malformed offer: {offer!r}")
        if client.max_object is not None and size > client.max_object:
            # Not drained: an absurd size must not make us read forever. Close the link.
            raise InvalidArgument(f"an offer of {size} bytes exceeds this minion's limit")
        self._departed(str(key))  # it may be coming straight back: our copy goes first
        generation = _next_generation(offer.get("generation"))
        try:
            obj = client.create(
                str(key),
                size,
                isolation=offer.get("isolation"),
                recovery=self._recovery(str(key), str(offer.get("recovery") or "")),
                zeroed=False,
                generation=generation,
            )
        except CDIError as exc:
            _drain(sock, size)
            return _refusal(exc)
        try:
            with obj.view() as view:
                receive_into(sock, view)
        except BaseException:
            obj.destroy()  # a half object never outlives its link
            raise
        with self._lock:
            if self._outcomes.get(xfer) == "aborted":  # fenced while we were receiving
                obj.destroy()
                return _refusal(CDIError("the sender gave this transfer up"))
            try:
                obj.transfer(str(to))
            except CDIError as exc:
                obj.destroy()
                self._remember(xfer, "aborted")
                return _refusal(exc)
            self._remember(xfer, "committed")
        self._delivered(str(key), generation + 1 if generation is not None else 0)
        return {"ok": True}

    def _remember(self, xfer: str, outcome: str) -> None:
        self._outcomes[xfer] = outcome
        self._outcomes.move_to_end(xfer)
        while len(self._outcomes) > _REMEMBERED:
            self._outcomes.popitem(last=False)


def _refusal(exc: CDIError) -> dict[str, Any]:
    return {"ok": False, "code": exc.code, "msg": str(exc)}


def _drain(sock: socket.socket, size: int) -> None:
    scratch = memoryview(bytearray(min(size, _DRAIN) or 1))
    left = size
    while left:
        chunk = scratch[: min(left, len(scratch))]
        receive_into(sock, chunk)
        left -= len(chunk)


def _next_generation(carried: object) -> int | None:
    """The generation a received object starts at: after the sender's (its move to the
    sender's slot is counted there; this hand-over counts here), so that the directory
    sees this host as its newer home. ``None`` (1) for an offer that carries none."""
    if type(carried) is not int or not 1 <= carried < 2**63 - 1:
        return None
    return carried + 1
