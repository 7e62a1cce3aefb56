"""The supervisor process behind ``cdiflow up``: runs a ``Stack`` until SIGTERM or SIGINT.

``cdiflow up`` starts it in a session of its own, so a terminal's Ctrl-C reaches only ``up``
(which forwards it as SIGTERM) and the stack stops in order rather than all at once; with
``--detach``, ``up`` simply does not wait for it. It writes ``<data>/stack.json`` once every
piece answers, rewrites it when a worker or the scheduler restarts (new PID), and removes it
after stopping.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from orchestrator.errors import OrchestratorError
from orchestrator.stack.stack import Stack
from orchestrator.stack.state import ProcessInfo, StackState, remove_state, write_state

__all__ = ["run_supervisor"]

log = logging.getLogger(__name__)


class _Terminate(BaseException):
    """Raised in the main thread by the first SIGTERM/SIGINT/SIGHUP, even mid start-up."""


def run_supervisor(data_dir: Path, *, log_file: Path | None = None, **stack_args: Any) -> int:
    """Run the stack in the foreground of this process; the exit status to return.

    ``stack_args`` go to ``Stack``. ``log_file`` is where this process's output goes, recorded
    in ``stack.json`` for ``cdiflow status``.
    """
    # Whatever this process and its children create (logs, a service's files, a task's) is
    # its user's alone unless made otherwise on purpose (docs/security.md).
    os.umask(0o077)
    terminating = False

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        nonlocal terminating
        if terminating:  # a second Ctrl-C must not interrupt the orderly stop
            log.info("already stopping (%s ignored)", signal.Signals(signum).name)
            return
        terminating = True
        log.info("stopping the stack on %s", signal.Signals(signum).name)
        raise _Terminate

    published = False
    publishing = threading.Lock()  # the supervisor thread republishes on restarts
    started_at = datetime.now(UTC).isoformat(timespec="seconds")

    def publish(_restarted: str | None = None) -> None:
        nonlocal published
        state = StackState(
            supervisor=ProcessInfo.of("supervisor", os.getpid(), "", log_file),
            started_at=started_at,
            data_dir=str(stack.data_dir),
            api_url=stack.api_url,
            controller_url=stack.controller_url,
            minion_socket=stack.minion_socket,
            processes=tuple(stack.processes()),
            api_key_file=str(stack.api_key_file or ""),
        )
        with publishing:
            write_state(stack.data_dir, state)
            published = True

    stack = Stack(data_dir, on_restart=publish, **stack_args)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    status = 0
    try:
        stack.start()
        publish()
        while True:
            time.sleep(3600)  # signals interrupt the sleep
    except _Terminate:
        pass
    except OrchestratorError as exc:
        log.error("%s", exc)
        status = 1
    finally:
        terminating = True
        try:
            stack.stop()
        finally:
            if published:  # never another stack's file (StackRunning)
                remove_state(stack.data_dir)
    return status
