"""The gateway in the minion itself (``cdi/minion-native/src/gateway.rs``, ``sending.rs``).

The minion serves other hosts' ``offer`` and ``resolve`` on the gateway's TCP port: it receives
a payload straight into a segment of its pool and creates the object with its new owner in one
step, with no Python on that path. With ``sends``, it also sends: a ``transfer … via`` to a
container on another host leaves from the object's segment on a link of the minion's. The
gateway here binds the port (it knows the address to advertise), hands the minion the listening
socket and the cluster's gateway key, and keeps what is not the objects' data path:

* links that carry a channel (``channel``, ``cdi.remote.channels``): the minion answers their
  handshake, then hands each to us with its request, over a socket pair;
* the minion's ``arrived`` events (relayed by ``cdi.minion.launcher``): the recovery container
  a received object had on its former host, and the wake-up of a client's ``await``;
* routes, for a sending minion: it asks where a container lives (``{"op": "route", "to",
  "fresh"}`` over the same socket pair) and gets the controller's answer from the gateway's
  cache, the address resolved to an IP (``{"op": "route", "to", "fresh", "address"}``, or a
  refusal's ``code`` and ``msg``); it keeps the answer a few seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from cdi import protocol
from cdi.errors import CDIError
from cdi.remote.transport import parse_address, tune_accepted
from cdi.remote.wire import LINK_TIMEOUT_S

__all__ = ["NativeInbound"]

log = logging.getLogger(__name__)

Channel = Callable[[socket.socket, dict[str, Any]], None]
Route = Callable[[str, bool], str]
"""A container's host's gateway address (``fresh``: not from a cache); raises ``CDIError``."""


class NativeInbound:
    """What the minion needs to receive objects itself, and the channel links it hands back."""

    def __init__(
        self, listener: socket.socket, key: str, channel: Channel, route: Route | None = None
    ) -> None:
        """``route``: the minion sends to other hosts itself, asking this for routes."""
        self._listener = listener
        self._key = key
        self._channel = channel
        self._route = route
        self._answering = threading.Lock()
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._key_pipe: int | None = None
        self._thread = threading.Thread(target=self._serve, name="cdi-gateway-links", daemon=True)

    def arguments(self) -> tuple[list[str], tuple[int, ...]]:
        """The minion's options and the fds it inherits; ``spawned()`` once it runs."""
        read, write = os.pipe()
        try:
            os.write(write, self._key.encode())  # a few dozen bytes: the pipe takes them at once
        finally:
            os.close(write)
        self._key_pipe = read
        fds = (self._listener.fileno(), read, self._theirs.fileno())
        argv = [
            "--gateway-fd", str(fds[0]), "--gateway-key-fd", str(read),
            "--gateway-channels-fd", str(fds[2]),
            "--link-timeout-ms", str(round(LINK_TIMEOUT_S * 1000)),
        ]  # fmt: skip
        if self._route is not None:
            argv.append("--gateway-sends")
        return argv, fds

    def spawned(self) -> None:
        """The minion holds its copies now: ours of its ends go."""
        if self._key_pipe is not None:
            os.close(self._key_pipe)
            self._key_pipe = None
        self._theirs.close()

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._ours.shutdown(socket.SHUT_RDWR)
        if self._thread.is_alive():
            self._thread.join(5)
        self._ours.close()
        self._theirs.close()
        self._listener.close()

    def _serve(self) -> None:
        """Each message: a channel's request, with its link (after the handshake) as the fd;
        or, without one, a question for a route."""
        receiver = protocol.Receiver()
        while True:
            try:
                request, fd = receiver.receive(self._ours)
            except (OSError, CDIError) as exc:
                log.info("the minion's channel links ended: %s", exc)
                return
            if request is None:
                return
            if fd is None:
                if request.get("op") == "route" and self._route is not None:
                    # The controller may take a while (a container registering): not in line.
                    answer = threading.Thread(target=self._answer_route, args=(request,))
                    answer.daemon = True
                    answer.start()
                continue
            link = socket.socket(fileno=fd)
            link.setblocking(True)  # the minion read it without blocking
            tune_accepted(link)
            threading.Thread(target=self._carry, args=(link, request), daemon=True).start()

    def _answer_route(self, request: dict[str, Any]) -> None:
        to, fresh = str(request.get("to", "")), request.get("fresh") is True
        answer: dict[str, Any] = {"op": "route", "to": to, "fresh": fresh}
        assert self._route is not None
        try:
            answer["address"] = _dialable(self._route(to, fresh))
        except CDIError as exc:
            answer.update(ok=False, code=exc.code, msg=str(exc))
        except OSError as exc:
            why = f"cannot resolve its address: {exc}"
            answer.update(ok=False, code="transfer_failed", msg=why)
        with self._answering, contextlib.suppress(OSError):
            self._ours.send(protocol.pack(answer))

    def _carry(self, link: socket.socket, request: dict[str, Any]) -> None:
        try:
            self._channel(link, request)
        except (OSError, CDIError) as exc:
            log.info("a channel link closed: %s", exc)
        finally:
            link.close()


def _dialable(address: str) -> str:
    """``host:port`` with the host resolved to an IP (the minion does not look names up)."""
    host, port = parse_address(address)
    family, _, _, _, where = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    ip = str(where[0])
    return f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
