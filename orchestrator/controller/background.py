"""Daemon threads an API process runs beside its event loop, until shutdown."""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Background"]


class Background:
    """Threads that share one stop event: ``start()``, then ``close()`` sets it and waits up
    to ``join_s`` for each to end."""

    def __init__(self, targets: dict[str, Callable[[], None]], *, join_s: float) -> None:
        self.stop = threading.Event()
        self._join_s = join_s
        self._threads = [
            threading.Thread(target=target, name=name, daemon=True)
            for name, target in targets.items()
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self.stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=self._join_s)
