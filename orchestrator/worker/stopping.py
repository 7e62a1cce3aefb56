"""Stopping a running task: its run was cancelled, failed elsewhere or passed its time limit (a
``Stop`` from the scheduler on the worker's control list), or the task overran its own
``timeout_s``.

The worker first asks: it sets the task's ``ctx.cancelled`` and calls what the task registered
with ``ctx.on_cancel`` (on a thread of its own, so a callback that blocks holds up nothing),
then gives the task ``STOP_GRACE_S`` to end. A task that waits on ``ctx.cancelled`` or looks at
it ends at once, and the slot goes on to its next instruction. One that does not end (it
sleeps, blocks in a read, computes in native code, or ignores the request) cannot be stopped
inside the process: a Python thread cannot be killed. The report then says where the task was
(its stack), and the worker ends the process the task runs in (``EXIT_TASK_STUCK``); its keeper
starts a fresh one at once (``keeper``), and the minion hands every object that process held
back to its recovery container.

*Why not raise an exception in the task's thread* (``PyThreadState_SetAsyncExc``): it stops
only Python code, not a sleep or a blocking call, and it lands between any two bytecodes of
whatever runs there, library code included: a lock taken just before it (``logging`` takes its
handler's lock, then enters the ``try`` that releases it) stays taken, and the worker's next log
line waits forever. Ending the process leaves nothing half-done behind. *The price:* the other
tasks that process ran (a worker with ``--concurrency`` above 1) and the images it held are
lost with it; the scheduler runs them again, spending none of their retries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, TypeVar

from orchestrator.contract.vocabulary import TaskRunStatus
from workflows.api import TaskContext

__all__ = ["STOP_GRACE_S", "StopRequest", "StopRequests", "Watch", "ask_to_stop"]

log = logging.getLogger(__name__)

STOP_GRACE_S: Final = 1.0  # how long a stopped task has to end by itself
_EARLY_MAX: Final = 1024  # stop requests kept for task runs that have not started (yet)

T = TypeVar("T")


@dataclass(frozen=True)
class StopRequest:
    """Why a task run must stop, and the status its report then says."""

    status: TaskRunStatus  # CANCELLED or TIMED_OUT
    reason: str


class Watch:
    """One running task's stop request, and the event that wakes the slot waiting for it."""

    def __init__(self) -> None:
        self.wake = threading.Event()
        self.request: StopRequest | None = None

    def ask(self, request: StopRequest) -> None:
        if self.request is None:
            self.request = request
        self.wake.set()

    def until_done_or_stopped(self, future: Future[T], timeout_s: float | None) -> bool:
        """Wait until ``future`` is done (True: it ended first, whatever was asked meanwhile),
        or a stop is asked or ``timeout_s`` passes (False)."""
        future.add_done_callback(lambda _done: self.wake.set())
        self.wake.wait(timeout_s)
        return future.done()


class StopRequests:
    """Stop requests by task run id: handed to the task's ``Watch`` while it runs, or kept
    (the latest ``_EARLY_MAX``) until it starts, for a stop that comes before its task does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, Watch] = {}
        self._early: OrderedDict[int, StopRequest] = OrderedDict()

    def ask(self, task_run_id: int, request: StopRequest) -> bool:
        """Stop task run ``task_run_id``; whether it runs now (else it stops when it starts)."""
        with self._lock:
            watch = self._running.get(task_run_id)
            if watch is None:
                self._early[task_run_id] = request
                while len(self._early) > _EARLY_MAX:
                    self._early.popitem(last=False)
                return False
        watch.ask(request)
        return True

    @contextmanager
    def watch(self, task_run_id: int) -> Iterator[Watch]:
        """A ``Watch`` for the task run about to start; a stop asked already is in it."""
        watch = Watch()
        with self._lock:
            early = self._early.pop(task_run_id, None)
            self._running[task_run_id] = watch
        if early is not None:
            watch.ask(early)
        try:
            yield watch
        finally:
            with self._lock:
                self._running.pop(task_run_id, None)


def ask_to_stop(ctx: TaskContext, future: Future[T], grace_s: float = STOP_GRACE_S) -> bool:
    """Ask the task behind ``future`` to stop (``ctx.cancelled``, its ``on_cancel``
    callbacks) and wait up to ``grace_s`` for it to end and for its callbacks; whether it
    ended. *Why wait for the callbacks:* the report that follows says the task was stopped,
    so what they clean up (a process it started, a remote job) is done by then, unless they
    outlast the same grace."""
    deadline = time.monotonic() + grace_s
    ctx.cancelled.set()
    callbacks = threading.Thread(
        target=_call_back, args=(ctx,), name=f"on-cancel-{ctx.task_name}", daemon=True
    )
    callbacks.start()
    ended = threading.Event()
    future.add_done_callback(lambda _done: ended.set())
    stopped = ended.wait(grace_s)
    callbacks.join(max(0.0, deadline - time.monotonic()))
    return stopped


def _call_back(ctx: TaskContext) -> None:
    for callback in ctx.take_cancel_callbacks():
        try:
            callback()
        except Exception:
            log.exception("an on_cancel callback of task %r raised", ctx.task_name)
