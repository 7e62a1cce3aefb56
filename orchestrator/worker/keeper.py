"""The worker process as the stack (or Kubernetes) sees it: a keeper that runs the worker
itself (its body: slots, heartbeat, connections) in a child process, and starts a fresh body at
once when the last one ended because a task would not stop (``EXIT_TASK_STUCK``,
``orchestrator.worker.stopping``).

*Why a keeper:* a Python thread cannot be killed, so the only way to stop a task that ignores a
stop is to end the process it runs in; and a worker started anew spends seconds importing
(about two on a busy 2-core machine) before it takes work again. The keeper forks each body
from its own state, where every module and the deployed task code are imported already, so a
fresh body beats and pops within a fraction of a second. The keeper itself holds no connection,
object or thread: it forwards SIGTERM and SIGINT to the body and ends with the body's exit
status (128 + the signal's number for a body killed by one). A body gets SIGKILL when its
keeper dies (``PR_SET_PDEATHSIG``), so killing the keeper, as the supervisor and the chaos
tests do, leaves no body behind.

*In a container* (Kubernetes runs the command itself as PID 1): the keeper handles SIGTERM and
SIGINT from the start (``keep`` installs ``forward`` before the first body), so a stop is never
ignored as the kernel ignores an unhandled signal sent to PID 1; a body inherits the process's
own handler (``orchestrator.pid_one``), so one stopped before it set up its own ends with
SIGTERM's status; a stop that comes while a body is being forked waits, blocked, until the
body has those handlers. And as PID 1 the keeper is every orphan's parent: a process a task started
that outlives its body (the body replaced because its task would not stop) is reaped while the
keeper waits, rather than left a zombie for the container's life.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

from orchestrator.worker.execution import EXIT_TASK_STUCK

__all__ = ["keep"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG: Final = 1
_FORWARDED: Final = (signal.SIGTERM, signal.SIGINT)


def keep(body: Callable[[], int], name: str) -> int:
    """Run ``body()`` in a child process until it ends other than stuck; its exit status.
    Call from the main thread of a process with no other threads."""
    stopping = False
    child = 0

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if child:
            _signal(child, signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        while True:
            child = _fork(body, previous)
            # Held from before the fork (``_fork``): one that came meanwhile is forwarded now.
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
            if stopping:  # asked to stop while it was being forked
                _signal(child, signal.SIGTERM)
            code = os.waitstatus_to_exitcode(_wait_for(child))
            if code != EXIT_TASK_STUCK or stopping:
                return code if code >= 0 else 128 - code
            log.warning("worker %s ended its process to stop a task; starting a fresh one", name)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait_for(child: int) -> int:
    """``child``'s wait status once it ends. As PID 1, the orphans that end meanwhile are
    reaped too (nobody else will); otherwise only ``child`` is waited for (a process that runs
    ``keep`` may have children of its own to wait for)."""
    if os.getpid() != 1:
        return os.waitpid(child, 0)[1]
    while True:
        pid, status = os.waitpid(-1, 0)
        if pid == child:
            return status


def _fork(body: Callable[[], int], handlers: dict[signal.Signals, Any]) -> int:
    """Fork a body; in the child, run it and end the process with its code. SIGTERM and
    SIGINT are blocked from before the fork: in the parent until the caller has noted the
    child (it unblocks them), in the child until it has the process's own handlers again (a
    stop forwarded meanwhile would otherwise reach the keeper's ``forward``, copied into the
    child, and be lost: the body would run on)."""
    keeper = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    try:
        child = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        raise
    if child:
        return child
    code = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != keeper:  # the keeper died before the call: nobody keeps this one
            os._exit(1)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)  # the keeper's own, as the process had them
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)  # one held meanwhile lands here
        code = body()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        log.critical("the worker's body crashed", exc_info=True)
    finally:
        for handler in logging.getLogger().handlers:
            handler.flush()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: waitpid tells how
        os.kill(pid, sig)
