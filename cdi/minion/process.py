"""Run a minion as a child process (for the stack, the benchmark and the tests)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from cdi.child import ServiceChild, python_module
from cdi.client import Client
from cdi.errors import MinionUnavailable

__all__ = ["MinionChild"]


class MinionChild(ServiceChild):
    """``python -m cdi.minion`` in a child process; ``start()`` returns once it answers."""

    def __init__(
        self,
        socket_path: str,
        *args: str,
        log_path: str | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``wrap``: run the command through it (``Host.wrap``: on another host)."""
        self.socket_path = socket_path
        argv = python_module("cdi.minion", "--socket", socket_path, *args)
        super().__init__(
            "minion",
            wrap(argv) if wrap else argv,
            Path(log_path or Path(socket_path).with_suffix(".log")),
            self._answers,
        )

    def _answers(self) -> bool:
        try:
            Client(self.socket_path).close()
        except MinionUnavailable:
            return False
        return True

    def start(self, timeout: float = 20.0) -> MinionChild:
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        return super().start(timeout)
