"""Run a minion as a child process (for the stack, the benchmark and the tests)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from cdi.child import ServiceChild, python_module
from cdi.client import Client
from cdi.errors import MinionUnavailable
from cdi.minion.state import discard_kept

__all__ = ["MinionChild"]


class MinionChild(ServiceChild):
    """``python -m cdi.minion`` in a child process; ``start()`` returns once it answers.

    ``stop()`` is a stop for good: with a state folder (``--state-dir``), what the minion kept
    for a successor goes too, even when the minion could not remove it itself (``discard_kept``:
    one that outlived its launcher, one that was killed). Kill it (``send_signal``) to have the
    next minion of the folder find its objects."""

    def __init__(
        self,
        socket_path: str,
        *args: str,
        log_path: str | None = None,
        wrap: Callable[[list[str]], list[str]] | None = None,
    ) -> None:
        """``wrap``: run the command through it (``Host.wrap``: on another host)."""
        self.socket_path = socket_path
        self.state_dir = _state_dir(args)
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

    def stop(
        self, timeout: float = 10.0, *, sig: int = signal.SIGTERM, sweep_group: bool = False
    ) -> None:
        try:
            super().stop(timeout, sig=sig, sweep_group=sweep_group)
        finally:
            if self.state_dir is not None and self.launched_at:
                discard_kept(self.state_dir, timeout)


def _state_dir(args: Sequence[str]) -> str | None:
    """The ``--state-dir`` among a minion's options (made absolute here: the child runs in
    our working directory), else ``$CDI_MINION_STATE_DIR``, which it inherits."""
    found = os.environ.get("CDI_MINION_STATE_DIR") or None
    for n, arg in enumerate(args):
        if arg == "--state-dir" and n + 1 < len(args):
            found = args[n + 1]
        elif arg.startswith("--state-dir="):
            found = arg.partition("=")[2]
    return os.path.abspath(found) if found else None
