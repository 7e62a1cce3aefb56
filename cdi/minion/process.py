"""Run a minion as a child process (for the stack, the benchmark and the tests)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from cdi.client import Client
from cdi.errors import MinionUnavailable

__all__ = ["MinionChild"]


class MinionChild:
    """``python -m cdi.minion`` in a child process; ``start()`` returns once it answers."""

    def __init__(self, socket_path: str, *args: str, log_path: str | None = None) -> None:
        self.socket_path = socket_path
        self.args = args
        self.log_path = log_path or str(Path(socket_path).with_suffix(".log"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "the minion is not running"
        return self.process.pid

    def start(self, timeout: float = 20.0) -> MinionChild:
        os.makedirs(os.path.dirname(self.socket_path), exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "cdi.minion", "--socket", self.socket_path, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise MinionUnavailable(
                    f"the minion exited with {self.process.returncode}; see {self.log_path}"
                )
            try:
                Client(self.socket_path).close()
                return self
            except MinionUnavailable:
                time.sleep(0.05)
        self.stop()
        raise MinionUnavailable(
            f"the minion did not answer within {timeout} s; see {self.log_path}"
        )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; by PID only."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> MinionChild:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
