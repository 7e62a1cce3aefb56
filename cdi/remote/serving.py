"""An accept loop with a thread per connection, for the gateway's two listeners."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

__all__ = ["AcceptLoop"]


class AcceptLoop:
    """Accepts on ``server`` and runs ``handle(conn)`` in a daemon thread per connection;
    ``close()`` stops accepting and shuts the open connections down (their handlers end)."""

    def __init__(
        self, server: socket.socket, handle: Callable[[socket.socket], None], name: str
    ) -> None:
        self.server = server
        self._handle = handle
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.closing = False
        self._thread = threading.Thread(target=self._accept, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.closing = True
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        with self._lock:
            conns = list(self._open)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(5)

    def _accept(self) -> None:
        while not self.closing:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                self._open.add(conn)
            threading.Thread(target=self._run, args=(conn,), daemon=True).start()

    def _run(self, conn: socket.socket) -> None:
        try:
            self._handle(conn)
        finally:
            with self._lock:
                self._open.discard(conn)
            conn.close()
