"""The faults a chaos run strikes a running stack with, each as a person or the kernel would.

Processes are killed with SIGKILL by PID: nothing gets to say goodbye. On the embedded stack
its supervisor brings each one back; against external services (``Target.external``), the run
itself starts a killed service again on its port after ``EXTERNAL_RESTART_S``, as the service's
own supervisor (systemd, Kubernetes) would, and cdiflow has to find it again on its own.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import redis

from orchestrator.errors import StackError
from orchestrator.services import ManagedService, RunningServices
from orchestrator.stack import Stack

__all__ = ["FAULTS", "QUICK_FAULTS", "Fault", "Target"]

EXTERNAL_RESTART_S: Final = 1.0


@dataclass
class Target:
    """The stack under test, and the external services it uses (None: embedded)."""

    stack: Stack
    external: RunningServices | None = None

    def kill(self, name: str) -> None:
        """SIGKILL one piece by its row name; an external service is started again after a
        moment, on a thread of ours."""
        service = self._external(name)
        if service is None:
            self.stack.kill(name, signal.SIGKILL)
            return
        pid = service.pid
        assert pid is not None, f"{name} is not running"
        import os

        os.kill(pid, signal.SIGKILL)
        threading.Thread(target=_restart_later, args=(service,), daemon=True).start()

    def flush_redis(self) -> None:
        client = redis.Redis.from_url(self.stack.services.redis_url)
        try:
            client.flushall()
        finally:
            client.close()

    def wait_restarted(self, name: str, old_pid: int | None, timeout: float = 60.0) -> None:
        """Until ``name`` runs again under a new PID."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            service = self._external(name)
            pid = service.pid if service is not None else self.stack.pid_of(name)
            alive = service.running if service is not None else self._alive(name)
            if pid is not None and pid != old_pid and alive:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not come back within {timeout:g} s")

    def pid(self, name: str) -> int | None:
        service = self._external(name)
        return service.pid if service is not None else self.stack.pid_of(name)

    def _alive(self, name: str) -> bool:
        return any(p.name == name and p.alive() for p in self.stack.processes())

    def _external(self, name: str) -> ManagedService | None:
        if self.external is None:
            return None
        return next((s for s in self.external.embedded if s.name == name), None)


def _restart_later(service: ManagedService) -> None:
    time.sleep(EXTERNAL_RESTART_S)
    service.restart()


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    strike: Callable[[Target], None]


def _kill(*names: str) -> Callable[[Target], None]:
    def strike(target: Target) -> None:
        for name in names:
            target.kill(name)

    return strike


def _freeze(name: str) -> Callable[[Target], None]:
    """SIGSTOP: the process stays, with its connections, locks and claims, but does nothing.
    It goes to the piece's process group: a worker is its keeper and the body it runs."""

    def strike(target: Target) -> None:
        pid = target.stack.pid_of(name)
        if pid is None:
            raise StackError(f"{name} is not running: there is nothing to freeze")
        os.killpg(pid, signal.SIGSTOP)  # its group: each piece starts a session of its own

    return strike


def _redis_during_scheduler_restart(target: Target) -> None:
    old = target.pid("scheduler-1")
    target.kill("scheduler-1")
    target.wait_restarted("scheduler-1", old)
    target.kill("redis")  # while the new scheduler resumes its workflows


def _flushall(target: Target) -> None:
    target.flush_redis()


FAULTS: Final = (
    Fault("scheduler", "kill -9 of the scheduler", _kill("scheduler-1")),
    Fault("postgres", "kill -9 of Postgres", _kill("postgres")),
    Fault("redis", "kill -9 of Redis", _kill("redis")),
    Fault("redis-flushall", "Redis FLUSHALL", _flushall),
    Fault("s3", "kill -9 of the S3 endpoint", _kill("s3")),
    Fault("minion", "kill -9 of the CDI minion", _kill("cdi-minion")),
    Fault("controller", "kill -9 of the CDI controller", _kill("cdi-controller")),
    Fault("worker", "kill -9 of a worker", _kill("worker-1")),
    Fault(
        "scheduler+worker",
        "kill -9 of the scheduler and a worker together",
        _kill("scheduler-1", "worker-1"),
    ),
    Fault(
        "redis-during-scheduler-restart",
        "kill -9 of Redis while the scheduler restarts",
        _redis_during_scheduler_restart,
    ),
    Fault("scheduler-frozen", "SIGSTOP of the scheduler: stuck, not dead", _freeze("scheduler-1")),
    Fault("worker-frozen", "SIGSTOP of a worker: stuck, not dead", _freeze("worker-1")),
    Fault("down-up", "cdiflow down, then up on the same data folder", lambda target: None),
)
# What `make test` runs: the faults that used to leave workflows stuck.
QUICK_FAULTS: Final = (
    "scheduler",
    "postgres",
    "redis-flushall",
    "minion",
    "worker",
    "scheduler-frozen",
)
