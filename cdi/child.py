"""A CDI process (controller or minion) run as a child: start, wait until it answers, stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

from cdi.errors import ConnectionFailed

__all__ = ["ChildProcess", "python_module"]


def python_module(module: str, *args: str) -> list[str]:
    """The command that runs ``python -m module args`` in this interpreter, safely: ``-P``
    keeps the working directory off ``sys.path``, so a folder named ``cdi`` (or any other of
    our packages) where the process was started cannot stand in for ours."""
    return [sys.executable, "-P", "-m", module, *args]


class ChildProcess:
    """``argv`` in a child process with its output in ``log_path``; stopped by PID only."""

    def __init__(
        self, argv: Sequence[str], log_path: str, answers: Callable[[], bool], what: str
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.answers = answers
        self.what = what
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"the {self.what} is not running"
        return self.process.pid

    def start(self, timeout: float = 20.0) -> None:
        # 0600: only this user reads what the CDI process logs
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "ab") as log:
            # A session of its own: a terminal's Ctrl-C reaches our parent, which stops us in
            # order, instead of reaching every process at once.
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConnectionFailed(
                    f"the {self.what} exited with {self.process.returncode}; see {self.log_path}"
                )
            if self.answers():
                return
            time.sleep(0.05)
        self.stop()
        raise ConnectionFailed(
            f"the {self.what} did not answer within {timeout} s; see {self.log_path}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
