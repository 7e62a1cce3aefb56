"""What the API answers, as typed models. Fields the API adds later are ignored, not errors,
so an older client keeps working against a newer API."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "FINISHED",
    "Definition",
    "DefinitionVersion",
    "Event",
    "EventPage",
    "Handoff",
    "Step",
    "Task",
    "TaskRun",
    "Upload",
    "Worker",
    "Workflow",
    "WorkflowDetail",
    "WorkflowPage",
]

Status = Literal["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"]
FINISHED: frozenset[str] = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT"})


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Task(_Model):
    """A registered task definition."""

    name: str
    module: str
    timeout_s: float
    retries: int
    retry_backoff_s: float
    description: str = ""
    created_at: datetime
    updated_at: datetime


class Step(_Model):
    ref: str
    task: str
    depends_on: list[str] = Field(default_factory=list)
    params: dict[str, Any] = Field(default_factory=dict)


class Definition(_Model):
    """A workflow definition at its current version."""

    name: str
    version: int
    description: str = ""
    tasks: list[Step]
    timeout_s: float | None = None  # a run's time limit
    worker_wait_s: float | None = None  # a step's longest wait for a worker able to run it
    created_at: datetime
    updated_at: datetime


class DefinitionVersion(_Model):
    """One version of a workflow definition."""

    name: str
    version: int
    description: str = ""
    tasks: list[Step]
    timeout_s: float | None = None
    worker_wait_s: float | None = None
    created_at: datetime


class Upload(_Model):
    """An input image stored in the stack's bucket; start a workflow with its ``uri``."""

    uri: str
    bytes: int
    format: str
    width: int
    height: int
    content_type: str


class Workflow(_Model):
    """One run of a workflow definition."""

    id: uuid.UUID
    workflow: str
    workflow_version: int
    status: Status
    policy: str
    data_plane: str
    input: dict[str, Any]
    output: dict[str, Any] | None = None
    error: str | None = None
    result_uri: str | None = None
    retry_of: uuid.UUID | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    timeout_s: float | None = None  # the run's time limit from its start
    status_detail: str | None = None  # what it waits for, while it cannot go on by itself

    @property
    def finished(self) -> bool:
        """Whether the run has ended (COMPLETED, FAILED, CANCELLED or TIMED_OUT)."""
        return self.status in FINISHED


class TaskRun(_Model):
    """One attempt of one step."""

    id: int
    ref: str
    task: str
    attempt: int
    status: str
    worker_id: str | None = None
    queued_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    queue_wait_ms: float | None = None
    run_ms: float | None = None
    cpu_ms: float | None = None
    bytes_in: int | None = None
    bytes_out: int | None = None
    error: str | None = None
    traceback: str | None = None  # where the task's code raised, or was stopped
    output: dict[str, Any] | None = None


class Handoff(_Model):
    """A CDI ownership transfer made for the run."""

    id: int
    task_run_id: int | None = None
    from_container: str
    to_container: str
    bytes: int
    duration_us: float
    at: datetime


class Event(_Model):
    id: int
    kind: str
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime


class WorkflowDetail(Workflow):
    """A run with every task run, hand-off and (the latest) events."""

    task_runs: list[TaskRun] = Field(default_factory=list)
    handoffs: list[Handoff] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)


class WorkflowPage(_Model):
    """One page of runs, newest first; ``total`` counts every match."""

    items: list[Workflow]
    total: int
    limit: int
    offset: int


class EventPage(_Model):
    status: Status
    events: list[Event]


class Worker(_Model):
    """A worker as its latest heartbeat describes it."""

    id: str
    host: str | None = None
    alive: bool
    cpu: float | None = None  # the worker process's, percent of one core
    mem: float | None = None  # the worker process's resident memory, percent of its host's
    rss_bytes: int | None = None
    host_cpu: float | None = None
    host_mem: float | None = None
    queue_depth: int | None = None
    running: int | None = None
    slots: int | None = None
    last_heartbeat: float | None = None
