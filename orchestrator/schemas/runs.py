"""Workflow runs: what starts one, and a run with its task runs, hand-offs and events."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AliasChoices, Field, PlainValidator, WithJsonSchema, field_validator

from orchestrator.contract.vocabulary import (
    CHOSEN_PLANES,
    DataPlane,
    Policy,
    TaskRunStatus,
    WorkflowStatus,
)
from orchestrator.s3policy import check_s3_uri
from orchestrator.schemas.base import (
    NAME_RULE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    OpenEnum,
    RequestBody,
    ResponseBody,
    Tags,
    checked_name,
)
from workflows.definitions import MAX_RUN_S

__all__ = [
    "ActiveTaskRunPublic",
    "ChosenPlane",
    "EventPage",
    "EventPublic",
    "HandoffPublic",
    "TaskRunInWorkflowPublic",
    "TaskRunPublic",
    "WorkflowCreate",
    "WorkflowDetail",
    "WorkflowInput",
    "WorkflowList",
    "WorkflowPublic",
]


def _chosen_plane(value: object) -> DataPlane:
    if isinstance(value, str) and value in CHOSEN_PLANES:
        return DataPlane(value)
    listed = " or ".join(repr(plane.value) for plane in CHOSEN_PLANES)
    raise ValueError(f"Input should be {listed} (a run without input.image moves no data)")


# A plane a workflow may be started on (``DataPlane.NONE`` is a dataless run's, never chosen).
ChosenPlane = Annotated[
    DataPlane,
    PlainValidator(_chosen_plane),
    WithJsonSchema({"type": "string", "enum": [plane.value for plane in CHOSEN_PLANES]}),
]


class WorkflowInput(RequestBody):
    image: str | None = Field(
        default=None,
        examples=["s3://cdiflow/images/cat.png"],
        description="S3 URI of the input image. Leave it out for a dataless workflow: nothing "
        "is downloaded or moved, and only tasks that need no image may run (e.g. noop).",
    )
    data: dict[str, Any] = Field(
        default_factory=dict, description="JSON given to every task as ctx.input."
    )
    result_format: Literal["png", "jpeg", "raw"] = Field(
        "png",
        description="How the result image is stored: 'png' (lossless, the default), 'jpeg' "
        "(quality 90: ~20x faster to encode and ~4x smaller, for photos) or 'raw' (lossless, "
        "an uncompressed TIFF: the fastest to encode, the largest).",
    )
    intermediate_format: Literal["png", "raw", "jpeg"] = Field(
        "png",
        description="object-store plane: how the images between tasks are stored: 'png' "
        "(lossless, the default), 'raw' (lossless, an uncompressed TIFF: ~70x faster to "
        "encode than PNG, ~2x larger) or 'jpeg' (quality 90, lossy: each task degrades the "
        "image). The cdi plane moves pixels and encodes nothing between tasks.",
    )

    @field_validator("image")
    @classmethod
    def _s3_uri(cls, value: str | None) -> str | None:
        if value is not None:
            check_s3_uri(value)  # S3NotAllowed is a ValueError: a 422 naming the problem
        return value


class WorkflowCreate(RequestBody):
    workflow: str = Field(
        examples=["image_pipeline"],
        description="Workflow definition name.",
        json_schema_extra=NAME_RULE,
    )
    input: WorkflowInput
    policy: Policy = Field(Policy.AFFINITY, description="Where the tasks run.")
    data_plane: ChosenPlane = Field(DataPlane.CDI, description="How data moves between tasks.")
    version: int | None = Field(
        default=None,
        ge=1,
        le=2**31 - 1,
        description="A version of the definition to run; default: its current one.",
    )
    priority: int | None = Field(
        default=None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="Waiting runs are served highest first (first come, first served within "
        "a priority); default: the definition's.",
        strict=True,
    )
    tags: Tags = Field(
        default_factory=list, description="Labels to find the run by (GET ?tag=...)."
    )
    timeout_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_RUN_S,
        description="The longest this run may take from its start, in seconds: past it the run "
        "ends TIMED_OUT and its running task is stopped. Default: the definition's timeout_s "
        "(none: no limit).",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str) -> str:
        return checked_name("workflow", value)


class WorkflowPublic(ResponseBody):
    id: uuid.UUID
    # The ORM calls it ``definition``; the API says ``workflow``, as in the create body.
    workflow: str = Field(validation_alias=AliasChoices("workflow", "definition"))
    workflow_version: int = Field(
        validation_alias=AliasChoices("workflow_version", "definition_version"),
        description="The version of the definition this run runs.",
    )
    status: OpenEnum[WorkflowStatus]
    policy: OpenEnum[Policy]
    data_plane: OpenEnum[DataPlane]
    input: dict[str, Any]
    output: dict[str, Any] | None
    error: str | None
    result_uri: str | None
    retry_of: uuid.UUID | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    claimed_by: str | None
    claimed_at: datetime | None
    started_by: str | None = Field(description="Name of the API key that started the run.")
    priority: int = 0
    tags: list[str] = Field(default_factory=list)
    paused_at: datetime | None = Field(
        default=None, description="Since when its next steps wait (POST .../resume lifts it)."
    )
    schedule_id: uuid.UUID | None = Field(default=None, description="The schedule that started it.")
    scheduled_for: datetime | None = Field(
        default=None, description="The schedule's tick it ran for."
    )
    timeout_s: float | None = Field(
        default=None, description="The run's time limit from its start, in seconds (null: none)."
    )
    status_detail: str | None = Field(
        default=None,
        description="What the run waits for while it cannot go on by itself, e.g. for a "
        "worker that loads its next step's task; null otherwise.",
    )

    @property
    def finished(self) -> bool:
        """Whether the run has ended. A status this version does not know (from a newer API)
        counts as ended once the run has an end time."""
        if isinstance(self.status, WorkflowStatus):
            return self.status.finished
        return self.finished_at is not None


class TaskRunPublic(ResponseBody):
    id: int
    ref: str
    task: str
    attempt: int
    status: OpenEnum[TaskRunStatus]
    worker_id: str | None
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    queue_wait_ms: float | None
    run_ms: float | None
    cpu_ms: float | None = None  # the task function's own CPU time (None before it ran)
    bytes_in: int | None
    bytes_out: int | None
    error: str | None
    traceback: str | None = Field(
        default=None,
        description="Where the task's own code raised (its Python traceback, the last 16 KiB), "
        "or, for a task that was stopped, where it was then; null when the failure was not "
        "the task code's.",
    )
    output: dict[str, Any] | None
    data: dict[str, Any] | None = Field(
        default=None,
        description='The named data it read and made: {"reads": {name: datum}, "made": '
        '{name: datum}}, a datum {"key", "kind"} (a CDI object), {"value"} or '
        '{"items": [...]}; "results": the S3 URIs of what it stored.',
    )


class HandoffPublic(ResponseBody):
    id: int
    task_run_id: int | None
    from_container: str
    to_container: str
    bytes: int
    duration_us: float
    at: datetime
    from_host: str | None = None
    to_host: str | None = None
    datum: str | None = Field(default=None, description='What moved: "<step run>.<output>".')
    mode: str | None = Field(
        None, description="transfer (ownership), share (read-only) or copy (another host)."
    )


class EventPublic(ResponseBody):
    id: int
    kind: str
    data: dict[str, Any]
    at: datetime


class WorkflowDetail(WorkflowPublic):
    task_runs: list[TaskRunPublic]
    handoffs: list[HandoffPublic]
    events: list[EventPublic] = Field(description="The latest events, oldest first.")


class EventPage(ResponseBody):
    """A run's events after a given one, and its status when they were read: a client that
    follows a run stops once the run has finished and a page comes back short."""

    status: OpenEnum[WorkflowStatus]
    events: list[EventPublic] = Field(description="Oldest first.")


class WorkflowList(ResponseBody):
    """One page of runs, newest first. Page on with ``cursor=next_cursor`` (older runs) or
    back with ``cursor=prev_cursor`` (newer ones); a page costs the same however deep it is."""

    items: list[WorkflowPublic]
    next_cursor: str | None = Field(
        description="The cursor of the page of older runs; null on the last page."
    )
    prev_cursor: str | None = Field(
        description="The cursor of the page of newer runs; null on the first page."
    )
    has_more: bool = Field(description="Whether older runs follow (next_cursor is set).")
    total: int = Field(
        description="Runs matching the filters over all pages: exact without a filter or "
        "with a status alone (counts kept as runs change), otherwise counted up to 1,000 "
        "(then total_exact is false and more may match)."
    )
    total_exact: bool
    limit: int
    offset: int = Field(description="Runs skipped after the cursor (an offset asked for).")


class TaskRunInWorkflowPublic(TaskRunPublic):
    """A task run with its workflow's id, in a list across workflows."""

    workflow_id: uuid.UUID


class ActiveTaskRunPublic(TaskRunInWorkflowPublic):
    """An unfinished task run with its workflow; ``status`` is RUNNING while a worker holds it
    (``started_at`` stays empty until the worker reports)."""
