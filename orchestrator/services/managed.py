"""A service run as a child process: port, log file, readiness wait and stop by PID."""

from __future__ import annotations

import abc
import atexit
import logging
import os
import re
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar, Self

from cdi.child import ChildProcess, log_tail
from orchestrator.child_process import free_port, port_is_free
from orchestrator.errors import ServiceError
from orchestrator.private import private_dir
from orchestrator.services._unprivileged import RunAs
from orchestrator.services.credentials import hide_password
from orchestrator.started import StartStop

__all__ = ["HOST", "ManagedService"]

log = logging.getLogger(__name__)

HOST = "127.0.0.1"  # embedded services are for this machine only
_PORT_ATTEMPTS = 3  # a free port can be taken between probing it and the child binding it
_PORT_IN_USE = re.compile(r"address already in use|is in use by another program", re.IGNORECASE)


class _PortTaken(Exception):
    """The child lost the race for its port; start again on another one."""


class ManagedService(StartStop):
    """One embedded service: ``start()`` waits until it answers, ``stop()`` ends it by PID.

    Subclasses give the command line and a readiness probe. Output goes to
    ``<data_dir>/logs/<name>.log``; the child is a ``ChildProcess`` (a session of its own, a
    forced stop kills its whole process group).
    """

    name: ClassVar[str]
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def __init__(
        self,
        data_dir: Path | str,
        *,
        port: int | None = None,
        start_timeout: float = 30.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.data_dir = Path(data_dir).expanduser().absolute()
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._fixed_port = port
        self._port: int | None = None
        self._proc: ChildProcess | None = None
        self._log_offset = 0  # where the output worth showing on a failure starts
        self._run_as: RunAs | None = None  # set by subclasses that must not run as root

    # -- public ---------------------------------------------------------------------------

    @property
    def log_file(self) -> Path:
        return self.data_dir / "logs" / f"{self.name}.log"

    @property
    def port(self) -> int:
        if self._port is None or not self.running:
            raise ServiceError(f"{self.name} is not running; call start() first", service=self.name)
        return self._port

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """Where clients connect (only while running)."""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.running else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.running

    @property
    def log_path(self) -> Path:
        return self.log_file

    @property
    def started_at(self) -> float:
        """Monotonic time of the latest launch (0 before the first)."""
        return self._proc.started_at if self._proc is not None else 0.0

    def poll(self) -> int | None:
        """None while the child runs; else its exit status (1 when no child was left)."""
        if self._proc is None:
            return 1
        return self._proc.poll()

    def restart(self) -> None:
        """Launch the child again after it died, on the port it had (its clients' URLs stay
        right), and wait until it answers; ``ServiceError`` if it does not."""
        if self.running:
            return
        if self._proc is not None:
            self._proc.wait()  # reap the dead one
        self._proc = None
        if self._port is not None:
            self._fixed_port = self._port
        self.start()

    def start(self) -> Self:
        """Start the child and block until it answers; idempotent."""
        if self.running:
            return self
        began = time.monotonic()
        try:
            self._start()
        except OSError as exc:  # unwritable data folder, missing binary, ...
            self.stop()
            raise self._error(f"{self.name} could not start: {exc}", tail=False) from exc
        except BaseException:  # includes Ctrl-C while waiting: never leave the child behind
            self.stop()
            raise
        log.info(
            "%s ready at %s in %.2fs (pid %s, log %s)",
            self.name, hide_password(self.url), time.monotonic() - began, self.pid,
            self.log_file,
        )  # fmt: skip
        return self

    def stop(self) -> None:
        """Signal the child by PID, then SIGKILL its process group after ``stop_timeout``."""
        proc, self._proc = self._proc, None
        atexit.unregister(self.stop)
        if proc is None:
            return
        if proc.poll() is not None:
            log.warning("%s (pid %s) had exited with status %s; see %s",
                        self.name, proc.pid, proc.returncode, self.log_file)  # fmt: skip
            return
        proc.stop(self.stop_timeout, sig=self.stop_signal)

    # -- for subclasses -------------------------------------------------------------------

    def _prepare(self) -> None:
        """One-off set-up before the first launch (directories, initdb)."""

    @abc.abstractmethod
    def _command(self, port: int) -> list[str]:
        """The child's command line, listening on ``HOST:port``."""

    @abc.abstractmethod
    def _probe(self) -> bool:
        """True once the child serves requests; raise ``ServiceError`` only if it never will."""

    def _after_ready(self) -> None:
        """Post-start set-up (create the database or bucket); raise ``ServiceError``."""

    def _cwd(self) -> Path:
        return self.data_dir

    def _env(self) -> Mapping[str, str]:
        return os.environ

    def _error(self, message: str, *, tail: bool = True) -> ServiceError:
        text = f"{message}; see {self.log_file}"
        lines = self._log_tail() if tail else ""
        if lines:
            text += f"\n--- last lines of {self.log_file.name} ---\n{lines}"
        return ServiceError(text, service=self.name, log_file=self.log_file)

    # -- internals ------------------------------------------------------------------------

    def _start(self) -> None:
        private_dir(self.log_file.parent)
        if self._fixed_port and not port_is_free(HOST, self._fixed_port):
            # Checked first: the readiness probe would take whatever listens there for our child.
            raise self._error(
                f"port {self._fixed_port} on {HOST} is already in use; stop what listens there "
                "or choose another port",
                tail=False,
            )
        self._prepare()
        attempts = 1 if self._fixed_port else _PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self._launch(self._fixed_port or free_port(HOST))
            try:
                self._wait_ready()
                break
            except _PortTaken:
                if attempt == attempts:
                    raise self._error(f"{self.name} found no free port") from None
                log.info("%s: port %s was taken meanwhile, retrying", self.name, self._port)
        self._after_ready()

    def _launch(self, port: int) -> None:
        self._port = port
        who = self._run_as
        self._proc = ChildProcess(
            self.name,
            self._command(port),
            log_path=self.log_file,
            env=self._env(),
            cwd=self._cwd(),
            user=who.uid if who else None,
            group=who.gid if who else None,
        ).start()
        self._log_offset = self._proc.log_offset
        atexit.register(self.stop)  # a parent that forgets stop() must not leak the child

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        delay = 0.02
        while True:
            code = self._proc.poll()
            if code is not None:
                self._proc = None
                if self._fixed_port is None and _PORT_IN_USE.search(self._log_tail()):
                    raise _PortTaken
                raise self._error(f"{self.name} exited with status {code} while starting")
            if self._probe():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise self._error(
                    f"{self.name} did not become ready within {self.start_timeout:.0f}s"
                )
            time.sleep(delay)
            delay = min(delay * 1.5, 0.25)

    def _log_tail(self) -> str:
        return log_tail(self.log_file, self._log_offset)
