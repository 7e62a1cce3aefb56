"""Start a stack's supervisor process, wait for it, and stop a running stack by its PIDs."""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from cdi.child import ChildProcess, describe_exit, log_tail
from cdi.minion.state import discard_kept
from orchestrator.errors import StackError
from orchestrator.private import private_dir
from orchestrator.stack.defaults import minion_state_folders
from orchestrator.stack.state import ProcessInfo, StackState, read_state, remove_state

__all__ = [
    "check_no_leftovers",
    "failure_report",
    "launch_supervisor",
    "stop_stack",
    "supervisor_log",
    "wait_until_up",
]

log = logging.getLogger(__name__)

_POLL_S = 0.1
_FORCED_STOP_S = 10.0  # what a leftover process gets between SIGTERM and SIGKILL


def supervisor_log(data_dir: Path) -> Path:
    """Where a detached supervisor writes: ``<data>/logs/stack.log``."""
    return data_dir / "logs" / "stack.log"


def launch_supervisor(data_dir: Path, options: Sequence[str], *, detach: bool) -> ChildProcess:
    """Start ``python -m orchestrator.stack supervise`` in a session of its own (so a detached
    one outlives the ``cdiflow up`` that started it).

    ``options`` are the ``supervise`` options (``--workers 2 --port 8001 ...``). Detached, its
    output goes to ``supervisor_log``; otherwise it shares the caller's terminal.
    """
    # -P: not our working directory on sys.path (a folder named `cdi` there is not ours)
    argv = [sys.executable, "-P", "-m", "orchestrator.stack", "supervise", "--data-dir",
            str(data_dir)]  # fmt: skip
    argv += options
    if not detach:
        return ChildProcess("supervisor", argv).start()
    log_file = supervisor_log(data_dir)
    private_dir(log_file.parent)  # made here, by a process whose umask may be lax
    argv += ["--log-file", str(log_file)]
    # It logs JSON under --log-format json (process "supervisor"): so does its start line.
    json_log = "--log-format=json" in argv or any(
        a == "--log-format" and b == "json" for a, b in itertools.pairwise(argv)
    )
    return ChildProcess("supervisor", argv, log_path=log_file, json_log=json_log).start()


def wait_until_up(proc: ChildProcess, data_dir: Path, timeout: float) -> StackState | None:
    """The stack's state once ``proc`` has published it; ``None`` if ``proc`` exited first.

    Raises ``StackError`` after ``timeout`` seconds, having stopped ``proc`` (and so its stack).
    """
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        state = read_state(data_dir)
        if state is not None and state.supervisor.pid == proc.pid:
            return state
        if time.monotonic() > deadline:
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            raise StackError(
                f"the stack was not up within {timeout:g}s, so it was stopped; see the logs "
                f"in {data_dir / 'logs'}"
            )
        time.sleep(_POLL_S)
    return None


def failure_report(proc: ChildProcess, data_dir: Path) -> str:
    """Why a detached supervisor exited before its stack was up."""
    status = describe_exit(proc.returncode if proc.returncode is not None else 1)
    text = f"the stack did not start (supervisor exited with {status})"
    if tail := log_tail(supervisor_log(data_dir), lines=25):
        text += f"; last lines of {supervisor_log(data_dir)}:\n{tail}"
    return text


def check_no_leftovers(data_dir: Path) -> None:
    """Refuse to start over a stack whose supervisor died but whose processes still run.

    A new stack would collide with them (the old Postgres still holds its data folder). A
    stale ``stack.json`` whose processes are all gone is removed. Call only while no stack
    holds the data folder's lock.
    """
    state = read_state(data_dir)
    if state is None:
        return
    leftovers = [p for p in state.processes if p.alive()]
    if not leftovers:
        log.info("removing the stale %s", data_dir / "stack.json")
        remove_state(data_dir)
        return
    names = ", ".join(f"{p.name} (pid {p.pid})" for p in leftovers)
    raise StackError(
        f"the previous stack from {data_dir} lost its supervisor but left {names} running; "
        f"stop them with `cdiflow down --data-dir {data_dir}` first"
    )


def stop_stack(data_dir: Path, timeout: float) -> StackState | None:
    """Stop the stack described by ``<data>/stack.json``; ``None`` when there is none.

    Asks the supervisor to stop (SIGTERM; it stops its processes in reverse order) and waits
    until every listed PID is gone. Processes it leaves behind (it died, or took longer than
    ``timeout``) are stopped here by PID, in reverse start order. Raises ``StackError`` if a
    process survives even SIGKILL.
    """
    state = read_state(data_dir)
    if state is None:
        return None
    supervisor = state.supervisor
    everyone = [supervisor, *state.processes]
    if supervisor.alive():
        log.info("asking the supervisor (pid %s) to stop the stack", supervisor.pid)
        _signal(supervisor, signal.SIGTERM)
        _wait_gone(everyone, time.monotonic() + timeout)
    else:
        log.warning("the supervisor (pid %s) is gone; stopping what it left", supervisor.pid)
    if supervisor.alive():
        log.warning("the supervisor did not stop within %gs; killing it", timeout)
        _signal(supervisor, signal.SIGKILL)
    leftovers = [p for p in reversed(state.processes) if p.alive()]
    for proc in leftovers:  # one by one: a service outlives the processes that use it
        log.warning("stopping leftover %s (pid %s)", proc.name, proc.pid)
        _signal(proc, signal.SIGTERM)
        if not _wait_gone([proc], time.monotonic() + _FORCED_STOP_S):
            _signal(proc, signal.SIGKILL)
    if not _wait_gone(everyone, time.monotonic() + _FORCED_STOP_S):
        alive = ", ".join(f"{p.name} (pid {p.pid})" for p in everyone if p.alive())
        raise StackError(f"could not stop {alive}; stack.json is kept")
    socket_path = Path(state.minion_socket)
    if socket_path.is_socket():  # left by a minion that was killed
        socket_path.unlink(missing_ok=True)
    for minion_state in minion_state_folders(data_dir):  # a minion that outlived its launcher
        discard_kept(minion_state, _FORCED_STOP_S)
    remove_state(data_dir)
    return state


def _signal(proc: ProcessInfo, sig: int) -> None:
    """Signal ``proc`` by PID, only if that PID is still the process we started."""
    if proc.pid is None or not proc.alive():
        return
    with contextlib.suppress(psutil.Error):
        psutil.Process(proc.pid).send_signal(sig)


def _wait_gone(procs: Sequence[ProcessInfo], deadline: float) -> bool:
    while any(p.alive() for p in procs):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True
