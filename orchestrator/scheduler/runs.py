"""What the scheduler keeps in memory about each workflow it is running.

All of it can be rebuilt from Postgres: a scheduler that restarts starts its RUNNING workflows
again from their S3 input, and so does one that can no longer trust a run's state (``again``).
``data_plane`` is the workflow's, or ``DataPlane.NONE`` for one started without an image.

A run is its graph (``workflows.graph``) and one ``StepRun`` per node — per element, for a
node that runs once per element of a list (``for_each``: ``"<ref>[<i>]"``). A step run waits
until every node before it has ended, is then ready (placed at once, as parallelism and
workers allow), goes out to a worker (``StepRun.in_flight``) and ends done or skipped. What a
step made is in ``made`` (data, ``scheduler.data``), the objects that hold it in ``objects``.
"""

from __future__ import annotations

import enum
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cdi import ObjectKey
from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane, Policy
from orchestrator.scheduler.data import Datum, Mode, Obj
from workflows.graph import Graph, Node

__all__ = [
    "DEFAULT_MAX_PARALLEL",
    "InFlight",
    "Phase",
    "RunState",
    "StepRun",
    "StepSpec",
    "fresh_key_prefix",
]

DEFAULT_MAX_PARALLEL = 16  # step runs of one workflow out at once (``Settings``)


@dataclass(frozen=True)
class StepSpec:
    """How a task step runs: its task definition's settings and the step's parameters."""

    ref: str
    task: str  # task definition name
    module: str  # what the worker loads
    timeout_s: float
    retries: int
    retry_backoff_s: float
    params: dict[str, Any] = field(default_factory=dict)
    max_concurrency: int = 0  # of its task over every scheduler (0: no limit)


@dataclass(frozen=True)
class InFlight:
    """A task that went out to a worker and has not been reported yet."""

    instruction: Instruction
    worker: str
    worker_started: float  # the worker's start time when it went out: a change means a restart
    deadline: float  # monotonic: when a silent task is presumed lost
    resent: bool = False  # sent once more after its deadline (no report came)
    lease: str = ""  # its place under its task's concurrency limit (``limits.TaskLimits``)
    lease_task: str = ""  # that task
    hand_to_started: float = 0.0  # the ``hand_to`` worker's start time when it went out

    @property
    def task_run_id(self) -> int:
        return self.instruction.task_run_id


class Phase(enum.Enum):
    WAITING = "waiting"  # a node before it has not ended
    READY = "ready"  # may go out: its inputs are resolved
    OUT = "out"  # at a worker
    FANNED = "fanned"  # a node that runs per element: its step runs are under way
    DONE = "done"
    SKIPPED = "skipped"


@dataclass(eq=False)
class StepRun:
    """One node of the graph, or one element of a node that runs per element."""

    id: str  # the node's ref, or "<ref>[<i>]"
    node: Node
    spec: StepSpec | None  # None for a switch
    index: int | None = None
    phase: Phase = Phase.WAITING
    attempt: int = 1
    lost: int = 0  # of its attempts, those lost with their worker (not the task's failures)
    outages: int = 0  # of its attempts, those S3 failed by not answering (nor the task's)
    outage_since: float = 0.0  # monotonic: the first of its outage failures in a row (0: none)
    in_flight: InFlight | None = None
    retry_at: float = 0.0  # monotonic: when a failed attempt goes out again
    avoid: frozenset[str] = frozenset()  # workers that lost it
    last_worker: str | None = None
    # Monotonic: since when workers live but none loaded its task's module; and since when
    # no live worker can run it at all (none alive, or none loaded the module).
    unrunnable_since: float = 0.0
    waiting_since: float = 0.0
    waiting_for: str = ""  # what it waits for, as the run's status detail says it
    lease: str = ""  # its place under its task's limit, from its choice until it is sent
    reads: dict[str, Datum] = field(default_factory=dict)  # its inputs, once resolved
    modes: dict[ObjectKey, Mode] = field(default_factory=dict)  # each object's mode, once placed

    @property
    def current(self) -> StepSpec:
        """The task settings (a switch never goes to a worker)."""
        assert self.spec is not None, f"{self.id} is a switch"
        return self.spec


@dataclass(eq=False)
class RunState:
    workflow_id: uuid.UUID
    policy: Policy
    data_plane: DataPlane
    graph: Graph
    specs: dict[str, StepSpec]  # node ref -> its task settings (task nodes only)
    input_uri: str
    data: dict[str, Any] = field(default_factory=dict)  # input.data, given to every task
    result_format: str = "png"  # key of workflows.imagebuf.RESULT_FORMATS
    intermediate_format: str = "png"  # object-store: how images between tasks are stored
    max_parallel: int = DEFAULT_MAX_PARALLEL
    steps: dict[str, StepRun] = field(default_factory=dict)  # step run id -> its state
    made: dict[str, dict[str, Datum]] = field(default_factory=dict)  # step run -> outputs
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)  # step run -> JSON output
    results: dict[str, str] = field(default_factory=dict)  # "<step run>.<output>" -> S3 URI
    objects: dict[ObjectKey, Obj] = field(default_factory=dict)  # the run's CDI objects
    fanned: dict[str, list[str]] = field(default_factory=dict)  # node ref -> its step runs
    attempts: dict[str, int] = field(default_factory=dict)  # step run id -> last attempt placed
    generation: int = 0  # suffix of the next object key
    home: str | None = None  # affinity: the worker every step goes to
    # Ending (cancelled by a user, or failed): nothing more is placed, and once nothing is out
    # what the run holds is freed.
    cancelled: bool = False
    # Object keys are "<key_prefix>-<generation>"; each claim and each drive gets a new prefix
    # (``fresh_key_prefix``), so its keys never meet objects an earlier one may have left.
    key_prefix: str = ""
    drives: int = 1  # how many times the run was driven from its input (resumes included)
    priority: int = 0  # its steps waiting for a worker go out highest priority first
    paused: bool = False  # paused by a user: nothing more is placed until it is resumed
    timeout_s: float | None = None  # its time limit (``deadline`` is when it passes)
    deadline: float | None = None  # monotonic: past it the run ends TIMED_OUT
    worker_wait_s: float | None = None  # how long a step may wait for a worker able to run it

    def __post_init__(self) -> None:
        if not self.steps:
            for ref, node in self.graph.nodes.items():
                self.steps[ref] = StepRun(ref, node, self.specs.get(ref))

    # ------------------------------------------------------------------ what is where
    def out(self) -> Iterator[StepRun]:
        """The step runs out at a worker now."""
        return (s for s in self.steps.values() if s.in_flight is not None)

    @property
    def busy(self) -> int:
        """Step runs out at a worker now (what ``max_parallel`` bounds)."""
        return sum(1 for s in self.steps.values() if s.phase is Phase.OUT)

    def flight(self, task_run_id: int) -> StepRun | None:
        """The step run whose task is out under ``task_run_id``, if this run has it."""
        for step in self.steps.values():
            flight = step.in_flight
            if flight is not None and flight.task_run_id == task_run_id:
                return step
        return None

    @property
    def finished(self) -> bool:
        """Every step run ended (done or skipped)."""
        return all(s.phase in (Phase.DONE, Phase.SKIPPED) for s in self.steps.values())

    def next_object_key(self) -> ObjectKey:
        self.generation += 1
        return ObjectKey(f"{self.key_prefix or f'wf-{self.workflow_id}'}-{self.generation}")

    def again(self, attempts: dict[str, int] | None = None) -> RunState:
        """The same workflow driven again from its input: every step waiting, no object,
        every step's attempts going on from ``attempts`` (default: what this run placed), so
        no attempt number is used twice."""
        placed = dict(self.attempts if attempts is None else attempts)
        fresh = RunState(
            self.workflow_id,
            self.policy,
            self.data_plane,
            self.graph,
            self.specs,
            self.input_uri,
            data=self.data,
            result_format=self.result_format,
            intermediate_format=self.intermediate_format,
            max_parallel=self.max_parallel,
            attempts=placed,
            key_prefix=fresh_key_prefix(self.workflow_id),
            drives=self.drives + 1,
            cancelled=self.cancelled,
            priority=self.priority,
            paused=self.paused,
            timeout_s=self.timeout_s,
            deadline=self.deadline,
            worker_wait_s=self.worker_wait_s,
        )
        for step in fresh.steps.values():
            step.attempt = placed.get(step.id, 0) + 1
        return fresh


def fresh_key_prefix(workflow_id: uuid.UUID) -> str:
    """A prefix for a drive's object keys that no earlier drive of the workflow used: a worker
    may still hold, or be making, an object an earlier drive named (an instruction a killed
    scheduler sent in a turn it never committed leaves no task run in Postgres to say so)."""
    return f"wf-{workflow_id}-{secrets.token_hex(3)}"
