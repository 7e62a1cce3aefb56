"""A process's "my loop still turns" stamp for whoever supervises it: a file whose mtime it renews.

A process that is frozen or stuck (stopped by a signal, deadlocked, blocked in a call without a
deadline) keeps its connections open, and so its Postgres liveness lock and its claims: nothing
notices it by a lost connection and no one takes its work over. Its supervisor notices a stamp
that stops moving and kills it, and the usual restart and takeover follow. The scheduler renews
its stamp every turn of its loop, a worker from its heartbeat thread (a worker's loop may run a
long task, which is not a stall). ``cdiflow up`` watches the stamps
(``RestartPolicy.stall_after``); under Kubernetes a liveness probe compares the file's age with
``STALL_AFTER_S``.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Final

__all__ = ["ALIVE_FILE_ENV", "STALL_AFTER_S", "AliveStamp", "stamp_age"]

log = logging.getLogger(__name__)

ALIVE_FILE_ENV: Final = "CDIFLOW_ALIVE_FILE"

# Well above a turn of the scheduler's loop (about a second) and a heartbeat, and above the
# longest wait inside one turn (a service that restarts answers again within seconds).
STALL_AFTER_S: Final = 60.0


class AliveStamp:
    """Renews the file at ``path`` (its mtime) at most once every ``every_s``; no path, no-op."""

    def __init__(self, path: Path | None, *, every_s: float = 1.0) -> None:
        self.path = path
        self.every_s = every_s
        self._next = 0.0
        self._failed = False

    @classmethod
    def from_env(cls) -> AliveStamp:
        """The stamp ``CDIFLOW_ALIVE_FILE`` names (a supervisor sets it), else a no-op one."""
        value = os.environ.get(ALIVE_FILE_ENV, "").strip()
        return cls(Path(value) if value else None)

    def renew(self) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        try:
            self.path.touch()
        except OSError as exc:  # a full or read-only disk must not stop the loop itself
            if not self._failed:
                log.warning("cannot renew the alive stamp %s: %s", self.path, exc)
            self._failed = True
        else:
            self._failed = False


def stamp_age(path: Path, running_s: float) -> float:
    """Seconds since the process renewed ``path``, counting at most ``running_s`` (how long the
    process has run): a stamp left by an earlier process, or none yet, dates from its launch."""
    try:
        since = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        since = running_s
    return max(0.0, min(since, running_s))
