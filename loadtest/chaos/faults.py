"""The faults a chaos run strikes a running stack with, each as a person or the kernel would.

Processes are killed with SIGKILL by PID: nothing gets to say goodbye. On the embedded stack
its supervisor brings each one back; against external services (``Target.external``), the run
itself starts a killed service again on its port after ``EXTERNAL_RESTART_S``, as the service's
own supervisor (systemd, Kubernetes) would, and cdiflow has to find it again on its own.

A fault is one or more phases: most strike at once; a *held* fault lasts (a network cut, an
S3 outage, a full disk) and ends with a phase that undoes it. Some need a stack of their own
(``Rig``): two hosts, a gate in front of S3, the data folder on a small disk.

A case (``run.run_case``) strikes any stack reachable from here (``CaseTarget``): the stack of
processes (``Target``) with the faults here, the stack as containers
(``deploy.containers.faults``) with its own, judged by the same checks.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final, Generic, Protocol, TypeVar

import redis

import cdi
from cdi.hosts import Host
from loadtest.chaos import host_faults, join_faults
from loadtest.chaos.api_probes import s3_routes
from loadtest.chaos.checks import Facts, check_for
from loadtest.chaos.mid_turn import Caught, kill_postgres_mid_turn
from loadtest.chaos.s3_gate import S3Gate
from loadtest.chaos.sampling import LoopWatch, MinionWatch
from loadtest.chaos.small_disk import SmallDisk
from loadtest.chaos.workload import Reachable, Workload
from orchestrator.errors import StackError
from orchestrator.services import ManagedService, RunningServices
from orchestrator.stack import RestartPolicy, Stack

__all__ = [
    "EXTERNAL_RESTART_S",
    "FAULTS",
    "POLICY",
    "QUICK_FAULTS",
    "QUICK_GRAPH_FAULTS",
    "CaseTarget",
    "Fault",
    "Kind",
    "Phase",
    "Rig",
    "Target",
    "disk_full",
    "host_killed",
    "partition",
    "s3_outage",
]

T = TypeVar("T")

EXTERNAL_RESTART_S: Final = 1.0
DISK_MB: Final = 256  # the data folder's own disk: room for a fresh stack and a case's load
# A stuck (SIGSTOPped) process is killed once its alive stamp is this old: shorter than the
# default (``contract.alive.STALL_AFTER_S``) so that a case ends sooner; recovery from the
# frozen faults counts this wait.
POLICY: Final = RestartPolicy(stall_after=10.0)


class Kind(StrEnum):
    """Where a case's Postgres, Redis and S3 come from."""

    EMBEDDED = "embedded"  # the stack's own, supervised by it
    EXTERNAL = "external"  # started apart, restarted by the run itself


@dataclass(frozen=True)
class Rig:
    """What a fault's stack needs beyond the plain one."""

    hosts: int = 1
    s3_gate: bool = False  # S3 reached through a gate the fault closes or slows (``S3Gate``)
    disk_mb: int | None = None  # the data folder on a disk of its own this size (``SmallDisk``)


@dataclass(frozen=True)
class Phase(Generic[T]):
    """One step of a fault: what is done to a target of type ``T``, and how long that lasts
    before the next step."""

    what: str
    act: Callable[[T], None]
    hold_s: float = 0.0


@dataclass(frozen=True)
class Fault(Generic[T]):
    """A fault on a target of type ``T``: its phases in order (the first strikes, the last ends
    it), the stack it needs and the targets it runs on; ``no_failed``: the goal is that no
    workflow ends FAILED."""

    name: str
    what: str
    phases: tuple[Phase[T], ...]
    rig: Rig = Rig()
    kinds: tuple[Kind, ...] = (Kind.EMBEDDED, Kind.EXTERNAL)
    no_failed: bool = False
    graphs: bool = False  # it strikes at what graphs hold: a workload with graphs must run

    @classmethod
    def at_once(
        cls, name: str, what: str, act: Callable[[T], None], *, graphs: bool = False
    ) -> Fault[T]:
        """A fault of one phase: it strikes, and nothing undoes it but the stack itself."""
        return cls(name, what, (Phase(what, act),), graphs=graphs)

    @property
    def held_s(self) -> float:
        """From the strike to the end of the last phase."""
        return sum(p.hold_s for p in self.phases)

    def strike(self, target: T) -> None:
        """The first phase (a held fault's later ones follow on the case's timeline)."""
        self.phases[0].act(target)


class CaseTarget(Protocol):
    """What a chaos case (``run.run_case``) strikes: a running stack, reachable from here."""

    @property
    def stack(self) -> Reachable: ...

    @property
    def kind(self) -> str:
        """Where the stack runs, for the report: embedded, external, containers."""
        ...

    @property
    def observed(self) -> dict[str, str]:
        """What the API answered while a fault held (route -> "<status> <code>"), filled by
        the fault's phases (empty: it asked nothing)."""
        ...

    def strike(self, fault: Fault[Any], load: Workload) -> None:
        """Strike ``fault`` (its first phase); ``load`` follows the stack if it changes (down
        and up)."""
        ...

    def objects_held(self) -> int | None:
        """The CDI objects the stack's minions hold now; None when one does not answer."""
        ...

    def loop_watch(self) -> LoopWatch | None:
        """What times the scheduler's longest stall from its alive stamp (None: not seen from
        here)."""
        ...

    def minion_watch(self) -> MinionWatch | None:
        """What times the longest a minion answered nothing (None: its socket is not reachable
        from here)."""
        ...

    def check(self, fault: Fault[Any], facts: Facts) -> list[str]:
        """The fault's own checks once every workflow has ended: the problems found."""
        ...


@dataclass
class Target:
    """The stack of processes under test, the external services it uses (None: embedded),
    and what its rig added: the gate in front of S3, the data folder's own disk."""

    stack: Stack
    external: RunningServices | None = None
    s3_gate: S3Gate | None = None
    disk: SmallDisk | None = None
    # What the API answered while a fault held (route -> "<status> <code>"), for its check.
    observed: dict[str, str] = field(default_factory=dict)
    # The scheduler's turn that Postgres was killed inside (``mid_turn``), for its check.
    turn: Caught | None = None
    # The case's workload, while a fault strikes (a fault may start workflows of its own).
    load: Workload | None = None

    @property
    def kind(self) -> str:
        return str(Kind.EXTERNAL if self.external is not None else Kind.EMBEDDED)

    def strike(self, fault: Fault[Any], load: Workload) -> None:
        if fault.name != "down-up":
            self.load = load
            try:
                fault.strike(self)
            finally:
                self.load = None
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
        count = 0
        try:
            for n in range(1, self.stack.hosts + 1):
                with cdi.Client(self.stack.cdi.socket_of(f"host{n}")) as probe:
                    count += int(probe.stat()["objects"])
        except cdi.CDIError:
            return None
        return count

    def loop_watch(self) -> LoopWatch:
        return LoopWatch(self.stack)

    def minion_watch(self) -> MinionWatch:
        return MinionWatch(self.stack)

    def check(self, fault: Fault[Any], facts: Facts) -> list[str]:
        return check_for(fault.name)(self, facts)

    def host(self, number: int) -> Host:
        """Host ``number`` of a ``--hosts`` stack, as a network namespace."""
        host = self.stack.cdi.host_of(f"host{number}")
        if host is None:
            raise RuntimeError(
                f"host{number} is not a network namespace with a link here: a host fault needs "
                "root, the `ip` command and `nft`"
            )
        return host

    def gate(self) -> S3Gate:
        assert self.s3_gate is not None, "this stack has no gate in front of S3 (Rig.s3_gate)"
        return self.s3_gate

    def small_disk(self) -> SmallDisk:
        assert self.disk is not None, "this stack's data folder has no disk of its own"
        return self.disk

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


def _postgres_mid_turn(target: Target) -> None:
    target.turn = None
    target.turn = kill_postgres_mid_turn(target)


def _flushall(target: Target) -> None:
    target.flush_redis()


def _s3_down(target: Target) -> None:
    target.gate().down()
    target.observed.update(s3_routes(target.stack))


# ---------------------------------------------------------------------- held faults
def partition(cut_s: float = 10.0) -> Fault[Target]:
    """Host 2 of two cut off the network for ``cut_s``, then mended."""
    return Fault(
        "partition",
        f"host 2 of 2 cut off the network for {cut_s:g} s",
        (
            Phase("cut", lambda t: host_faults.cut(t.host(2)), cut_s),
            Phase("mended", lambda t: host_faults.mend(t.host(2))),
        ),
        rig=Rig(hosts=2),
        kinds=(Kind.EMBEDDED,),
        no_failed=True,
    )


def _kill_host_2(target: Target) -> None:
    host_faults.kill_all_on(target.host(2))


def host_killed() -> Fault[Target]:
    """Every process of host 2 (its minion with its gateway, its worker) killed at once."""
    return Fault(
        "host-kill",
        "kill -9 of every process on host 2 of 2 at once",
        (Phase("killed", _kill_host_2),),
        rig=Rig(hosts=2),
        kinds=(Kind.EMBEDDED,),
    )


def s3_outage(
    down_s: float = 30.0, slow_s: float = 30.0, per_request_s: float = 1.0
) -> Fault[Target]:
    """The S3 endpoint refusing connections for ``down_s``, then answering each request
    ``per_request_s`` late for ``slow_s``."""
    return Fault(
        "s3-outage",
        f"S3 down {down_s:g} s, then {per_request_s:g} s a request for {slow_s:g} s",
        (
            Phase("down", _s3_down, down_s),
            Phase("slow", lambda t: t.gate().slow(per_request_s), slow_s),
            Phase("restored", lambda t: t.gate().open()),
        ),
        rig=Rig(s3_gate=True),
        kinds=(Kind.EXTERNAL,),
        no_failed=True,
    )


def disk_full(full_s: float = 30.0, size_mb: int = DISK_MB) -> Fault[Target]:
    """The data folder's disk (Postgres, S3, logs) full for ``full_s``, then freed."""
    return Fault(
        "disk-full",
        f"the data folder's disk full for {full_s:g} s",
        (
            Phase("full", lambda t: t.small_disk().fill(), full_s),
            Phase("freed", lambda t: t.small_disk().free()),
        ),
        rig=Rig(disk_mb=size_mb),
        kinds=(Kind.EMBEDDED,),
    )


FAULTS: Final[tuple[Fault[Target], ...]] = (
    # The control: nothing is struck. Its recovery is the probe's own wait behind the workflows
    # in flight (in the scheduler's queue for a free worker slot), which every case's includes.
    Fault.at_once("none", "nothing struck (the control)", lambda target: None),
    Fault.at_once("scheduler", "kill -9 of the scheduler", _kill("scheduler-1")),
    Fault.at_once("postgres", "kill -9 of Postgres", _kill("postgres")),
    Fault.at_once(
        "postgres-mid-turn",
        "kill -9 of Postgres inside a scheduler turn's transaction",
        _postgres_mid_turn,
    ),
    Fault.at_once("redis", "kill -9 of Redis", _kill("redis")),
    Fault.at_once("redis-flushall", "Redis FLUSHALL", _flushall),
    Fault.at_once("s3", "kill -9 of the S3 endpoint", _kill("s3")),
    Fault.at_once("minion", "kill -9 of the CDI minion", _kill("cdi-minion")),
    Fault.at_once("controller", "kill -9 of the CDI controller", _kill("cdi-controller")),
    Fault.at_once("worker", "kill -9 of a worker", _kill("worker-1")),
    Fault.at_once(
        "scheduler+worker",
        "kill -9 of the scheduler and a worker together",
        _kill("scheduler-1", "worker-1"),
    ),
    Fault.at_once(
        "redis-during-scheduler-restart",
        "kill -9 of Redis while the scheduler restarts",
        _redis_during_scheduler_restart,
    ),
    Fault.at_once(
        "scheduler-frozen", "SIGSTOP of the scheduler: stuck, not dead", _freeze("scheduler-1")
    ),
    Fault.at_once("worker-frozen", "SIGSTOP of a worker: stuck, not dead", _freeze("worker-1")),
    Fault.at_once("down-up", "cdiflow down, then up on the same data folder", lambda target: None),
    Fault.at_once(
        "worker-holding-join-input",
        "kill -9 of the worker holding a join's input ahead of the join",
        join_faults.kill_holder,
        graphs=True,
    ),
    Fault.at_once(
        "scheduler-while-join-input-held",
        "kill -9 of the scheduler while a worker holds a join's input ahead of the join",
        join_faults.kill_scheduler_while_held,
        graphs=True,
    ),
    partition(),
    host_killed(),
    s3_outage(),
    disk_full(),
)
# What `make test` runs of these (tests/orchestrator/test_chaos.py): the faults that used to
# leave workflows stuck. The held faults run shorter there (tests/orchestrator/test_chaos_*.py).
# Postgres killed inside a turn starts workflows of its own when it finds the scheduler idle.
QUICK_FAULTS: Final = (
    "scheduler",
    "postgres",
    "postgres-mid-turn",
    "redis-flushall",
    "minion",
    "worker",
    "scheduler-frozen",
)
# What `make test` runs with graphs in flight (``--workload graph``).
QUICK_GRAPH_FAULTS: Final = ("worker-holding-join-input", "scheduler-while-join-input-held")
