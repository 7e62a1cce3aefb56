"""A process started as a child: in a session of its own, its output appended to a log file
(0600), stopped by its PID, and its process group killed if it outstays the stop.

One class for every child cdiflow starts: the CDI controller, minions and link emulator
(``ServiceChild``: ``start()`` returns once the child answers), the stack's embedded services,
API, scheduler and workers (``orchestrator``) and the load tests' peers (``loadtest``). It lives
in ``cdi`` because ``cdi`` imports nothing of the orchestrator. *Why a session of its own:* a
Ctrl-C meant for the parent does not reach the child, so the parent stops its children in
order, and a forced stop can kill the child's whole group (what it started too) by its PID.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Final, Self

from cdi.errors import ConnectionFailed

__all__ = ["ChildProcess", "ServiceChild", "describe_exit", "log_tail", "python_module"]

log = logging.getLogger(__name__)

_TAIL_LINES: Final = 15


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` in this interpreter, safely: ``-P``
    keeps the working directory off ``sys.path``, so a folder named ``cdi`` (or any other of
    our packages) where the process was started cannot stand in for ours."""
    return [sys.executable, "-P", "-m", module, *args]


class ChildProcess:
    """``argv`` as a child process, its output appended to ``log_path``.

    Without a ``log_path`` its output goes to ``stream`` (a file or ``subprocess.DEVNULL``;
    ``None``: the parent's own stdout and stderr). ``env`` and ``cwd`` default to the
    parent's; ``user`` and ``group`` run it under another uid and gid (and without the
    parent's supplementary groups). ``piped``: the parent talks to it through ``stdin`` and
    ``stdout``, and only its stderr goes to the log. ``json_log``: the line each launch
    writes into the log first is a JSON object like the child's own lines (a child that logs
    JSON), not text. ``start`` may be called again once it has exited, which launches it anew.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path | None = None,
        stream: IO[Any] | int | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: int | None = None,
        group: int | None = None,
        piped: bool = False,
        json_log: bool = False,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.stream = stream
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.user, self.group = user, group
        self.piped = piped
        self.json_log = json_log
        self.started_at = 0.0  # monotonic time of the latest launch
        self.launched_at = 0.0  # wall-clock time of the latest launch
        self.log_offset = 0  # where the latest launch's output starts in the log
        self._proc: subprocess.Popen[bytes] | None = None
        self._asked: int = signal.SIGTERM  # the signal that asked it to stop

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode if self._proc is not None else None

    @property
    def stdin(self) -> IO[bytes] | None:
        """Where to write to a ``piped`` child."""
        return self._proc.stdin if self._proc is not None else None

    @property
    def stdout(self) -> IO[bytes] | None:
        """What a ``piped`` child writes."""
        return self._proc.stdout if self._proc is not None else None

    def poll(self) -> int | None:
        """Exit status once the process has ended (negative: killed by that signal)."""
        return self._proc.poll() if self._proc is not None else None

    def start(self) -> ChildProcess:
        """Launch (or relaunch) the process; returns at once. ``OSError`` if it cannot."""
        if self.log_path is None:
            self._launch(self.stream)
        else:
            self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # 0600: a log may name what its process saw; only our user reads it.
            # Unbuffered: a start line the disk has no room for fails here, not at the close.
            with os.fdopen(_open_log(self.log_path), "ab", buffering=0) as out:
                self.log_offset = out.tell()
                try:
                    out.write(self._start_line())
                except OSError as exc:
                    # A full disk: the process must run all the same (its own output is lost
                    # as long as the disk stays full); not starting it would outlast the fault.
                    log.warning("%s: cannot write to its log %s (%s); starting it anyway",
                                self.name, self.log_path, exc.strerror or exc)  # fmt: skip
                self._launch(out)
        assert self._proc is not None
        log.debug("%s started (pid %d): %s", self.name, self._proc.pid, shlex.join(self.argv))
        return self

    def _start_line(self) -> bytes:
        """What a launch writes into the log before the child's own lines."""
        stamp = datetime.now(UTC)
        message = f"cdiflow starts: {shlex.join(self.argv)}"
        if not self.json_log:
            return f"--- {stamp.isoformat(timespec='seconds')} {message}\n".encode()
        line = {"time": stamp.isoformat(timespec="milliseconds"), "level": "INFO",
                "logger": "cdiflow.stack", "message": message, "process": self.name}  # fmt: skip
        return json.dumps(line).encode() + b"\n"

    def _launch(self, out: IO[Any] | int | None) -> None:
        self.launched_at = time.time()
        self.started_at = time.monotonic()
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE if self.piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE if self.piped else out,
            stderr=out if self.piped or out is None else subprocess.STDOUT,
            env=self.env,
            cwd=self.cwd,
            start_new_session=True,
            user=self.user,
            group=self.group,
            extra_groups=[] if self.user is not None else None,
        )

    def send_signal(self, sig: int) -> None:
        """Signal the process by its PID, if it still runs."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the process ended (and was reaped) within ``timeout`` seconds (``None``:
        however long it takes)."""
        if self._proc is None:
            return True
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def stop(
        self, timeout: float = 10.0, *, sig: int = signal.SIGTERM, sweep_group: bool = False
    ) -> None:
        """``sig`` by PID, then SIGKILL to its process group after ``timeout``; idempotent.
        ``sweep_group``: kill the group even when the process itself ended in time, for what
        it started and left behind."""
        self._asked = sig
        self.send_signal(sig)
        self.finish(timeout, sweep_group=sweep_group)

    def finish(self, timeout: float, *, sweep_group: bool = False) -> None:
        """Wait for a process already asked to stop; SIGKILL its group if it outstays."""
        proc = self._proc
        if proc is None:
            return
        ended = self.wait(timeout)
        if not ended:
            name = signal.Signals(self._asked).name
            log.warning("%s (pid %d) ignored %s for %.0fs; killing it",
                        self.name, proc.pid, name, timeout)  # fmt: skip
        if not ended or sweep_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its group id is its PID (own session)
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        log.info("%s stopped (pid %d)", self.name, proc.pid)

    def log_tail(self, lines: int = _TAIL_LINES) -> str:
        """The last lines this launch wrote to its log ("" without one)."""
        if self.log_path is None:
            return ""
        return log_tail(self.log_path, self.log_offset, lines)


class ServiceChild(ChildProcess):
    """A child that serves: ``start()`` returns once ``answers()`` says it does, and raises
    ``ConnectionFailed`` (after stopping it) if it exits first or does not answer in time;
    ``with`` stops it."""

    log_path: Path

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        answers: Callable[[], bool],
        **options: Any,
    ) -> None:
        super().__init__(name, argv, log_path=log_path, **options)
        self.answers = answers

    @property
    def pid(self) -> int:
        pid = super().pid
        assert pid is not None, f"the {self.name} is not running"
        return pid

    def start(self, timeout: float = 20.0) -> Self:
        super().start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = self.poll()
            if status is not None:
                raise ConnectionFailed(
                    f"the {self.name} exited with {describe_exit(status)}; see {self.log_path}"
                )
            if self.answers():
                return self
            time.sleep(0.05)
        self.stop()
        raise ConnectionFailed(
            f"the {self.name} did not answer within {timeout} s; see {self.log_path}"
        )

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _open_log(path: Path) -> int:
    """``path`` opened to append, 0600 if created, made 0600 if an earlier run left it readable
    by others (a file only: a device such as ``/dev/null`` is the machine's, left as it is)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISREG(st.st_mode) and mode & 0o077:
            os.fchmod(fd, mode & ~0o077)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
