"""The roles' ends for backends whose receivers are servers (REST, gRPC).

Such a backend brings two things: a *server*, listening on the address it is given, that
hands every frame message it is sent to a callback (which may wait, holding the sender's call
back) and tells its ``address``, and a
*caller* that sends a message to one server and returns once that server has queued it.
The ends are the same for both: the extractor calls detector ``seq % N``; a detector's server
queues into its ``Inbox``, the detector takes from it and calls the combinator; the
combinator's server puts frames in order into a ``Reorder``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from apps.ar.config import RunConfig
from apps.ar.links import Backend, Peers
from apps.ar.links.queues import Inbox, Reorder
from workflows.ar import framebuf

__all__ = ["Caller", "Server", "served_backend"]

Message = bytes | bytearray


class Server(Protocol):
    address: str

    def close(self) -> None: ...


class Caller(Protocol):
    def put(self, message: memoryview) -> None: ...

    def close(self) -> None: ...


ServerFactory = Callable[[RunConfig, str, Callable[[Message], None]], Server]
CallerFactory = Callable[[str, RunConfig], Caller]


def served_backend(name: str, server: ServerFactory, caller: CallerFactory) -> Backend:
    """A ``Backend`` whose ends run over ``server`` and ``caller``."""

    class Extractor:
        def __init__(self, config: RunConfig) -> None:
            self.config = config
            self.address = ""
            self._buffer = memoryview(bytearray(config.message_size))
            self._callers: list[Caller] = []

        def connect(self, peers: Peers) -> None:
            self._callers = [caller(a, self.config) for a in peers.detectors]

        def slot(self, seq: int) -> memoryview:
            return self._buffer  # the last call has returned: its message has left

        def send(self, seq: int) -> None:
            self._callers[self.config.detector_of(seq)].put(self._buffer)

        def close(self) -> None:
            for one in self._callers:
                one.close()

    class Detector:
        def __init__(self, config: RunConfig, index: int) -> None:
            self.config = config
            self._inbox: Inbox[Message] = Inbox(config.depth, config.timeout_s)
            self._server = server(config, config.address_for("detector", index), self._inbox.put)
            self.address = self._server.address
            self._caller: Caller | None = None
            self._current: memoryview | None = None

        def connect(self, peers: Peers) -> None:
            self._caller = caller(peers.combinator, self.config)

        def receive(self) -> memoryview:
            message = self._inbox.get()
            # We draw on it: a server that hands out immutable bytes costs a copy here.
            self._current = memoryview(
                message if isinstance(message, bytearray) else bytearray(message)
            )
            return self._current

        def forward(self) -> None:
            assert self._caller is not None and self._current is not None
            self._caller.put(self._current)
            self._current = None
            self._inbox.done()

        def close(self) -> None:
            if self._caller is not None:
                self._caller.close()
            self._server.close()

    class Combinator:
        def __init__(self, config: RunConfig) -> None:
            self.config = config
            self._frames: Reorder[Message] = Reorder(config.ring, config.timeout_s)
            self._server = server(config, config.address_for("combinator"), self._keep)
            self.address = self._server.address

        def _keep(self, message: Message) -> None:
            self._frames.put(framebuf.read_header(message).seq, message)

        def connect(self, peers: Peers) -> None:
            """The detectors call us."""

        def receive(self, seq: int) -> memoryview:
            return memoryview(self._frames.take(seq))  # the combinator only reads

        def release(self, seq: int) -> None:
            """The message was this frame's own: it goes with its last reference."""

        def close(self) -> None:
            self._server.close()

    return Backend(name, Extractor, Detector, Combinator)
