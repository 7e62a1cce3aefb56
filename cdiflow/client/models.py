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
    "DefinitionRetention",
    "DefinitionVersion",
    "Event",
    "EventPage",
    "Handoff",
    "Retention",
    "RetentionPass",
    "Step",
    "Task",
    "TaskRun",
    "Upload",
    "Worker",
    "Workflow",
    "WorkflowDetail",
    "WorkflowPage",
]

Status = Literal["PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"]
FINISHED: frozenset[str] = frozenset({"COMPLETED", "FAILED", "CANCELLED"})


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
    created_at: datetime
    updated_at: datetime
    retention_days: int | None = None  # its own retention (None: the default)
    retention_results: str | None = None


class DefinitionVersion(_Model):
    """One version of a workflow definition."""

    name: str
    version: int
    description: str = ""
    tasks: list[Step]
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

    @property
    def finished(self) -> bool:
        """Whether the run has ended (COMPLETED, FAILED or CANCELLED)."""
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
    """One page of runs, newest first. ``next_cursor`` (older runs) and ``prev_cursor``
    (newer ones) are where the pages beside it start; ``total`` counts the matches, exactly
    unless ``total_exact`` is false (then at least that many)."""

    items: list[Workflow]
    total: int
    limit: int
    next_cursor: str | None = None
    prev_cursor: str | None = None
    has_more: bool = False
    total_exact: bool = True
    offset: int = 0


class RetentionPass(_Model):
    at: datetime
    pruned: int
    seconds: float
    error: str | None = None


class DefinitionRetention(_Model):
    name: str
    days: int | None = None
    results: str | None = None
    effective_days: int
    effective_results: str


class Retention(_Model):
    """How long finished runs are kept (``days`` 0: for ever) and what pruning has done."""

    default_days: int
    default_results: str
    archive_uri: str | None = None
    interval_s: float
    definitions: list[DefinitionRetention] = Field(default_factory=list)
    last_pass: RetentionPass | None = None
    pruned_total: int = 0
    archived_total: int = 0
    runs_on_record: int = 0


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
