"""The stack's services and CDI processes in the shape the supervisor restarts (``Supervised``).

The API, scheduler and workers are ``Child`` processes, which already have that shape.
"""

from __future__ import annotations

from pathlib import Path

from cdi.child import ServiceChild
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
    """The CDI controller, a minion or the link emulator under the stack's name for it:
    started (and restarted) until it answers."""

    def __init__(self, name: str, child: ServiceChild) -> None:
        self.name = name
        self.child = child

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child.launched_at else None

    @property
    def log_path(self) -> Path | None:
        return self.child.log_path

    @property
    def started_at(self) -> float:
        return self.child.started_at

    def poll(self) -> int | None:
        return self.child.poll() if self.child.launched_at else 1

    def start(self) -> None:
        """Launch and wait until it answers; ``cdi.CDIError`` if it does not."""
        if self.child.running:
            return
        self.child.wait()  # reap the dead one
        self.child.start()

    def stop(self, timeout: float) -> None:
        self.child.stop(timeout)
