"""The stack's services and CDI processes in the shape the supervisor restarts (``Supervised``).

The API, scheduler and workers are ``Child`` processes, which already have that shape.
"""

from __future__ import annotations

import time
from pathlib import Path

from cdi.child import ChildProcess
from orchestrator.services import ManagedService

__all__ = ["CdiProcess", "ServiceProcess"]


class ServiceProcess:
    """An embedded Postgres, Redis or S3 endpoint: restarted on the port it had, so the URLs
    every other process was given stay right."""

    def __init__(self, service: ManagedService) -> None:
        self.service = service

    @property
    def name(self) -> str:
        return self.service.name

    @property
    def pid(self) -> int | None:
        return self.service.pid

    @property
    def log_path(self) -> Path:
        return self.service.log_file

    @property
    def started_at(self) -> float:
        return self.service.started_at

    def poll(self) -> int | None:
        return self.service.poll()

    def start(self) -> None:
        self.service.restart()


class CdiProcess:
    """The CDI controller or minion, started (and restarted) until it answers."""

    def __init__(self, name: str, child: ChildProcess) -> None:
        self.name = name
        self.child = child
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        process = self.child.process
        return process.pid if process is not None else None

    @property
    def log_path(self) -> Path:
        return Path(self.child.log_path)

    def poll(self) -> int | None:
        process = self.child.process
        return process.poll() if process is not None else 1

    def start(self) -> None:
        """Launch and wait until it answers; ``cdi.CDIError`` if it does not."""
        process = self.child.process
        if process is not None and process.poll() is None:
            return
        if process is not None:
            process.wait()  # reap the dead one
        self.started_at = time.monotonic()
        self.child.start()

    def stop(self, timeout: float) -> None:
        self.child.stop(timeout)
