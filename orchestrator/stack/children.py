"""The stack's own child processes (API, scheduler, workers) and how they are restarted."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["Child", "RestartPolicy", "describe_exit", "log_tail"]

log = logging.getLogger(__name__)

_TAIL_LINES = 15


@dataclass(frozen=True)
class RestartPolicy:
    """How the stack restarts a scheduler or worker that exits without being asked to."""

    max_per_minute: int = 5
    """Restarts of one process allowed in any 60 s window; beyond that the next one waits."""

    initial_backoff: float = 0.5
    """Seconds before restarting after a crash; doubles with each further quick crash."""

    max_backoff: float = 30.0
    """Ceiling of the back-off, in seconds."""

    stable_after: float = 60.0
    """A process that ran this long had a good run: its back-off starts over. Workers exit on
    purpose after a task timeout, so a long-lived worker exiting is restarted promptly."""

    def delay(self, now: float, recent: Sequence[float], quick_crashes: int) -> float:
        """Seconds to wait before the next restart.

        ``recent`` holds the monotonic times of the restarts in the last minute, oldest first;
        ``quick_crashes`` counts exits in a row that came before ``stable_after`` (>= 1).
        """
        backoff = min(self.initial_backoff * 2.0 ** max(quick_crashes - 1, 0), self.max_backoff)
        if len(recent) < self.max_per_minute:
            return backoff
        # Window full: wait until the restart that fills it is a minute old.
        oldest = recent[len(recent) - self.max_per_minute]
        return max(backoff, oldest + 60.0 - now)


class Child:
    """One process started by the stack, in its own session, output appended to ``log_path``.

    Its own session keeps a Ctrl-C meant for the stack from reaching it, so the stack can stop
    its processes in order; a forced stop kills its whole process group.
    """

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.started_at = 0.0  # monotonic time of the latest launch
        self.launched_at = 0.0  # wall-clock time of the latest launch
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def poll(self) -> int | None:
        """Exit status once the process has ended (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> None:
        """Launch (or relaunch) the process; returns at once."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self._log_offset = out.tell()
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            out.write(f"--- {stamp} cdiflow starts: {shlex.join(self.argv)}\n".encode())
            out.flush()
            self.launched_at = time.time()
            self.started_at = time.monotonic()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        log.debug("%s started (pid %d): %s", self.name, self._proc.pid, shlex.join(self.argv))

    def send_signal(self, sig: int) -> None:
        if self.running:
            assert self._proc is not None
            self._proc.send_signal(sig)

    def wait(self, timeout: float) -> bool:
        """Whether the process ended (and was reaped) within ``timeout`` seconds."""
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID, then SIGKILL to its process group after ``timeout``; idempotent."""
        self.send_signal(signal.SIGTERM)
        self.finish(timeout)

    def finish(self, timeout: float) -> None:
        """Wait for a process already asked to stop; SIGKILL its group if it outstays."""
        proc = self._proc
        if proc is None:
            return
        if not self.wait(timeout):
            log.warning("%s (pid %d) ignored SIGTERM for %.0fs; killing it",
                        self.name, proc.pid, timeout)  # fmt: skip
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its group id is its PID (own session)
            proc.wait()
        log.info("%s stopped (pid %d)", self.name, proc.pid)

    def log_tail(self) -> str:
        """The last lines this launch wrote to its log."""
        return log_tail(self.log_path, self._log_offset)


def log_tail(path: Path, offset: int = 0, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` after byte ``offset`` ("" if unreadable)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def describe_exit(status: int) -> str:
    """``"status 3"`` or ``"SIGKILL"`` for a Popen return code."""
    if status < 0:
        try:
            return signal.Signals(-status).name
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"
