"""What the scheduler keeps in memory about each workflow it is running.

All of it can be rebuilt from Postgres: a scheduler that restarts starts its RUNNING workflows
again from their S3 input, and so does one that can no longer trust a run's state (``again``).
``data_plane`` is the workflow's, or ``DataPlane.NONE`` for a dataless one (started without
an image).

A run has one current step (``RunState.current``) and at most one task out at a worker
(``RunState.in_flight``, an ``InFlight``), as its steps run one after another. The paths that
send and report a task find it through ``RunState.flight`` by its task run id, so runs whose
ready steps go out side by side will keep one ``InFlight`` per step.
"""

from __future__ import annotations

import dataclasses
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any

from orchestrator.contract.messages import Instruction
from orchestrator.contract.vocabulary import DataPlane, Policy

__all__ = ["InFlight", "RunState", "StepSpec"]


@dataclass(frozen=True)
class StepSpec:
    ref: str
    task: str  # task definition name
    module: str  # what the worker loads
    timeout_s: float
    retries: int
    retry_backoff_s: float
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class InFlight:
    """A task that went out to a worker and has not been reported yet."""

    instruction: Instruction
    worker: str
    worker_started: float  # the worker's start time when it went out: a change means a restart
    deadline: float  # monotonic: when a silent task is presumed lost
    resent: bool = False  # sent once more after its deadline (no report came)

    @property
    def task_run_id(self) -> int:
        return self.instruction.task_run_id


@dataclass(eq=False)
class RunState:
    workflow_id: uuid.UUID
    policy: Policy
    data_plane: DataPlane
    steps: list[StepSpec]
    input_uri: str
    data: dict[str, Any] = field(default_factory=dict)  # input.data, given to every task
    result_format: str = "png"  # key of workflows.imagebuf.RESULT_FORMATS
    intermediate_format: str = "png"  # object-store: how images between tasks are stored
    step: int = 0
    attempt: int = 1
    key: str = ""  # cdi: the object holding the current image
    generation: int = 0  # cdi: suffix of the next output object
    owner: str = ""  # cdi: who owns ``key`` (the scheduler or a worker that kept it)
    held: str = ""  # cdi: task run whose image the owner holds in memory, newer than ``key``
    held_from: int = 0  # cdi: the first step whose image is only held (recomputed if lost)
    attempts: dict[str, int] = field(default_factory=dict)  # step ref -> last attempt placed
    nbytes: int = 0
    current_uri: str = ""  # object-store: where the current image is
    last_worker: str | None = None
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    in_flight: InFlight | None = None
    avoid: frozenset[str] = frozenset()  # workers that lost the current step
    retry_at: float = 0.0  # monotonic: when a failed attempt is dispatched again
    unrunnable_since: float = 0.0  # monotonic: since when no live worker can run the step
    cancelled: bool = False
    # Object keys are "<key_prefix>-<generation>"; a run driven again gets a new prefix, so its
    # keys never meet objects an earlier drive may have left (in a worker that kept one).
    key_prefix: str = ""
    drives: int = 1  # how many times the run was driven from its input (resumes included)

    @property
    def current(self) -> StepSpec:
        return self.steps[self.step]

    @property
    def last_step(self) -> bool:
        return self.step == len(self.steps) - 1

    def flight(self, task_run_id: int) -> InFlight | None:
        """The task out at a worker under ``task_run_id``, if this run has it."""
        flight = self.in_flight
        return flight if flight is not None and flight.task_run_id == task_run_id else None

    def advance(self) -> None:
        """Make the next step current, at its first attempt not yet made (a step recomputed
        after a lost held image has run before)."""
        self.step += 1
        self.attempt = self.attempts.get(self.current.ref, 0) + 1
        self.avoid = frozenset()

    def follow_held(self, task_run_id: int, *, held: bool, lost: bool) -> bool:
        """Follow a report on the image a worker holds instead of ``key`` (``Report.held``,
        ``Report.held_lost``); True if the held image was lost and the run rewound."""
        if lost and self.held:
            self.rewind()
            return True
        if held:
            if not self.held:
                self.held_from = self.step
            self.held = str(task_run_id)
        else:
            self.held = ""
        return False

    def rewind(self) -> None:
        """The held image is lost: make the first step it came from current again, at its
        last attempt (the retry that follows counts against that step's retries)."""
        self.step = self.held_from
        self.attempt = self.attempts.get(self.current.ref, 1)
        self.held = ""

    def next_object_key(self) -> str:
        self.generation += 1
        return f"{self.key_prefix or f'wf-{self.workflow_id}'}-{self.generation}"

    def again(self, attempts: dict[str, int] | None = None) -> RunState:
        """The same workflow driven again from its input: first step, no object, every step's
        attempts going on from ``attempts`` (default: what this run placed), so no attempt
        number is used twice."""
        placed = dict(self.attempts if attempts is None else attempts)
        return dataclasses.replace(
            self,
            step=0,
            attempt=placed.get(self.steps[0].ref, 0) + 1,
            key="",
            generation=0,
            owner="",
            held="",
            held_from=0,
            attempts=placed,
            nbytes=0,
            current_uri=self.input_uri,
            last_worker=None,
            outputs={},
            in_flight=None,
            avoid=frozenset(),
            retry_at=0.0,
            key_prefix=f"wf-{self.workflow_id}-{secrets.token_hex(3)}",
            drives=self.drives + 1,
        )
