"""How the stack restarts its own processes (scheduler, workers) when they exit unasked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.contract.alive import STALL_AFTER_S

__all__ = ["RestartPolicy"]


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

    stall_after: float = STALL_AFTER_S
    """A process whose alive stamp (``contract.alive``) has not moved for this many seconds is
    stuck: it is killed and so restarted like one that crashed."""

    start_grace: float = STALL_AFTER_S
    """Seconds a process may take from its launch to its first stamp (imports, first
    connections: on a loaded machine the scheduler's take over ten): it is starting, not stuck.
    ``stall_after`` counts from that first stamp on; a short one thus catches a process that
    stops, without killing every start of a slow machine over and over."""

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
