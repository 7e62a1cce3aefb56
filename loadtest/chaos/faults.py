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
from typing import Any, Final, Generic, Protocol, TypeVar

import redis

import cdi
from loadtest.chaos.workload import Reachable, Workload
from orchestrator.errors import StackError
from orchestrator.services import ManagedService, RunningServices
from orchestrator.stack import RestartPolicy, Stack

__all__ = [
    "EXTERNAL_RESTART_S",
    "FAULTS",
    "POLICY",
    "QUICK_FAULTS",
    "CaseTarget",
    "Fault",
    "Target",
]

T = TypeVar("T")

EXTERNAL_RESTART_S: Final = 1.0
# A stuck (SIGSTOPped) process is killed once its alive stamp is this old: shorter than the
# default (``contract.alive.STALL_AFTER_S``) so that a case ends sooner; recovery from the
# frozen faults counts this wait.
POLICY: Final = RestartPolicy(stall_after=10.0)


@dataclass(frozen=True)
class Fault(Generic[T]):
    """A fault by name, what it does, and how to strike a target of type ``T`` with it."""

    name: str
    what: str
    strike: Callable[[T], None]


class CaseTarget(Protocol):
    """What a chaos case (``run.run_case``) strikes: a running stack, reachable from here."""

    @property
    def stack(self) -> Reachable: ...

    @property
    def kind(self) -> str:
        """Where the stack runs, for the report: embedded, external, containers."""
        ...

    def strike(self, fault: Fault[Any], load: Workload) -> None:
        """Strike ``fault``; ``load`` follows the stack if it changes (down and up)."""
        ...

    def objects_held(self) -> int | None:
        """The CDI objects the stack's minions hold now; None when one does not answer."""
        ...


@dataclass
class Target:
    """The stack of processes under test, and the external services it uses (None:
    embedded)."""

    stack: Stack
    external: RunningServices | None = None

    @property
    def kind(self) -> str:
        return "external" if self.external is not None else "embedded"

    def strike(self, fault: Fault[Any], load: Workload) -> None:
        if fault.name != "down-up":
            fault.strike(self)
            return
        # The stack stops in order and starts again on its data folder: nothing else is kept.
        old = self.stack
        old.stop()
        again = Stack(old.data_dir, workers=len(old.worker_ids), port=old.port,
                      services=self.external, restart_policy=POLICY)  # fmt: skip
        again.start()
        self.stack = again
        load.reconnect(again)

    def objects_held(self) -> int | None:
        try:
            with cdi.Client(self.stack.minion_socket) as probe:
                return int(probe.stat()["objects"])
        except cdi.CDIError:
            return None

    def kill(self, name: str) -> None:
        """SIGKILL one piece by its row name; an external service is started again after a
        moment, on a thread of ours."""
        service = self._external(name)
        if service is None:
            self.stack.kill(name, signal.SIGKILL)
            return
        pid = service.pid
        assert pid is not None, f"{name} is not running"
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


FAULTS: Final[tuple[Fault[Target], ...]] = (
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
