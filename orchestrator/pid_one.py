"""A container's first process (PID 1) stops on SIGTERM like any other.

The kernel ignores a signal sent to PID 1 unless that process handles it. In a container
without an init process (Kubernetes runs the command itself as PID 1), a role that has not
installed its own handler yet (a worker or scheduler waiting up to 30 s for its minion, the
API migrating) would ignore the stop it is sent and be killed only once the grace period
ends. ``stop_on_sigterm`` gives such a process a handler that ends it, until the role installs
its own. ``unwind_on_sigterm`` does the same in any process whose clean-up lives in its
``finally`` blocks (a benchmark stopping the minions and stacks it started): Python's default
for SIGTERM ends the process without running them, leaving those children behind.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

__all__ = ["stop_on_sigterm", "unwind_on_sigterm"]


def stop_on_sigterm() -> None:
    """As PID 1, exit (status 143, as if killed by SIGTERM) on SIGTERM; else nothing."""
    if os.getpid() == 1:
        signal.signal(signal.SIGTERM, _exit)


def unwind_on_sigterm() -> None:
    """Exit (status 143) on SIGTERM by raising ``SystemExit``, so ``finally`` blocks run."""
    signal.signal(signal.SIGTERM, _exit)


def _exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)
