"""Request and response bodies of the REST API, kept apart from the ORM models.

``XCreate`` is what a client sends, ``XPublic`` what it gets back. Names, module paths and
bounds come from ``workflows`` so the API and the validator never disagree.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    WithJsonSchema,
    field_validator,
)

from orchestrator.contract.vocabulary import (
    CHOSEN_PLANES,
    DataPlane,
    Policy,
    TaskRunStatus,
    WorkflowStatus,
)
from workflows.definitions import MAX_BACKOFF_S, MAX_RETRIES, MAX_TIMEOUT_S
from workflows.names import MODULE_PATH_RE, name_problem

__all__ = [
    "ActiveTaskRunPublic",
    "CdiDirectoryPublic",
    "CdiMinionPublic",
    "CdiObjectPublic",
    "CheckPublic",
    "ErrorPublic",
    "EventPublic",
    "HandoffPublic",
    "ImagePublic",
    "LatencyPublic",
    "LivenessPublic",
    "MinutePublic",
    "ReadinessPublic",
    "StatsPublic",
    "StepSchema",
    "TaskCreate",
    "TaskPublic",
    "TaskRunInWorkflowPublic",
    "TaskRunPublic",
    "TaskTimingPublic",
    "WorkerPublic",
    "WorkflowCreate",
    "WorkflowDefinitionCreate",
    "WorkflowDefinitionPublic",
    "WorkflowDetail",
    "WorkflowImagesPublic",
    "WorkflowInput",
    "WorkflowList",
    "WorkflowPublic",
    "error_responses",
]

MAX_STEPS: Final = 200
MAX_DESCRIPTION: Final = 2000
# s3://bucket/key: bucket per the S3 naming rules, key non-empty without control characters.
_S3_URI: Final = re.compile(r"s3://(?P<bucket>[^/]*)/(?P<key>.*)", re.S)
_BUCKET: Final = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f]")


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")  # a misspelt field is an error, not ignored


class _Output(BaseModel):
    model_config = ConfigDict(from_attributes=True)


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


def _checked_name(kind: str, value: str) -> str:
    problem = name_problem(kind, value)
    if problem is not None:
        raise ValueError(problem)
    return value


# --- task definitions ---------------------------------------------------------------------


class TaskCreate(_Input):
    name: str = Field(examples=["sharpen"], description="Letters, digits, '_', '-'.")
    module: str = Field(
        max_length=255,
        examples=["workflows.image_tasks:deblur"],
        description="Where the function lives: 'package.module:function'.",
    )
    timeout_s: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S)
    retries: int = Field(0, ge=0, le=MAX_RETRIES)
    retry_backoff_s: float = Field(0.5, ge=0, le=MAX_BACKOFF_S)
    description: str = Field("", max_length=MAX_DESCRIPTION)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _checked_name("task", value)

    @field_validator("module")
    @classmethod
    def _module(cls, value: str) -> str:
        if not MODULE_PATH_RE.fullmatch(value):
            raise ValueError(
                f"module {value!r} is not of the form 'package.module:function', "
                "e.g. 'workflows.image_tasks:deblur'"
            )
        return value


class TaskPublic(_Output):
    name: str
    module: str
    timeout_s: float
    retries: int
    retry_backoff_s: float
    description: str
    created_at: datetime
    updated_at: datetime


# --- workflow definitions -----------------------------------------------------------------


class StepSchema(_Input):
    ref: str = Field(description="Name of the step inside the workflow.")
    task: str = Field(description="Name of a registered task definition.")
    depends_on: list[str] = Field(default_factory=list, description="Refs that finish first.")
    params: dict[str, Any] = Field(default_factory=dict, description="Given to the task.")


class WorkflowDefinitionCreate(_Input):
    name: str = Field(examples=["image_pipeline"])
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS)


class WorkflowDefinitionPublic(_Output):
    name: str
    description: str
    tasks: list[StepSchema]
    created_at: datetime
    updated_at: datetime


# --- workflow runs ------------------------------------------------------------------------


class WorkflowInput(_Input):
    image: str | None = Field(
        None,
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
        if value is None:
            return None
        match = _S3_URI.fullmatch(value)
        if match is None:
            raise ValueError(f"{value!r} is not an S3 URI; expected s3://bucket/path/to/image")
        bucket, key = match["bucket"], match["key"]
        if not _BUCKET.fullmatch(bucket) or ".." in bucket:
            raise ValueError(
                f"{bucket!r} is not a valid S3 bucket name (3-63 lowercase letters, digits, "
                "'.' or '-', starting and ending with a letter or digit)"
            )
        if not key:
            raise ValueError(f"{value!r} names a bucket but no object key")
        if len(key.encode()) > 1024 or _CONTROL.search(key):
            raise ValueError("the object key must be at most 1024 bytes, without control chars")
        return value


class WorkflowCreate(_Input):
    workflow: str = Field(examples=["image_pipeline"], description="Workflow definition name.")
    input: WorkflowInput
    policy: Policy = Field(Policy.AFFINITY, description="Where the tasks run.")
    data_plane: ChosenPlane = Field(DataPlane.CDI, description="How data moves between tasks.")


class WorkflowPublic(_Output):
    id: uuid.UUID
    # The ORM calls it ``definition``; the API says ``workflow``, as in the create body.
    workflow: str = Field(validation_alias=AliasChoices("workflow", "definition"))
    status: WorkflowStatus
    policy: Policy
    data_plane: DataPlane
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


class TaskRunPublic(_Output):
    id: int
    ref: str
    task: str
    attempt: int
    status: TaskRunStatus
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
    output: dict[str, Any] | None


class HandoffPublic(_Output):
    id: int
    task_run_id: int | None
    from_container: str
    to_container: str
    bytes: int
    duration_us: float
    at: datetime
    from_host: str | None = None
    to_host: str | None = None


class EventPublic(_Output):
    id: int
    kind: str
    data: dict[str, Any]
    at: datetime


class WorkflowDetail(WorkflowPublic):
    task_runs: list[TaskRunPublic]
    handoffs: list[HandoffPublic]
    events: list[EventPublic] = Field(description="The latest events, oldest first.")


class WorkflowList(BaseModel):
    items: list[WorkflowPublic]
    total: int = Field(description="Workflows matching the filters, over all pages.")
    limit: int
    offset: int


# --- workers and health -------------------------------------------------------------------


class WorkerPublic(BaseModel):
    id: str
    host: str | None
    cpu: float | None = Field(description="CPU in use on the worker's host, percent.")
    mem: float | None = Field(description="Memory in use on the worker's host, percent.")
    queue_depth: int | None
    running: int | None
    slots: int | None = Field(description="Tasks the worker runs at once (--concurrency).")
    last_heartbeat: float | None = Field(description="Unix seconds.")
    started_at: float | None = Field(description="Unix seconds.")
    held_images: int | None = Field(
        default=None,
        description="Images the worker holds in memory between a workflow's tasks (affinity).",
    )
    held_bytes: int | None = Field(default=None, description="Bytes those images take.")
    heartbeat_age_s: float | None
    alive: bool


class LivenessPublic(BaseModel):
    status: str = Field(description="'ok': this API process serves requests.")


class CheckPublic(BaseModel):
    ok: bool = Field(description="False: this part keeps workflows from running.")
    detail: str = Field(description="What was seen: 'ok', or why it is unavailable.")


class ReadinessPublic(BaseModel):
    status: str = Field(description="'ok' when every part answers, else 'unavailable'.")
    checks: dict[str, CheckPublic] = Field(
        description="postgres, redis, minion, scheduler and s3, each with its answer."
    )


class ErrorPublic(BaseModel):
    """Every error the API answers on purpose (see ``orchestrator.controller.http_errors``)."""

    detail: str = Field(description="What went wrong and what to change.")
    code: str = Field(description="Stable error code, e.g. 'not_found', 'conflict'.")
    known: list[str] | None = Field(None, description="Valid names, with a 404.")
    problems: list[str] | None = Field(None, description="Every problem, with a 422.")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting the ``ErrorPublic`` body for ``statuses``."""
    return {status: {"model": ErrorPublic} for status in statuses}


# --- dashboard: statistics, active task runs, CDI objects, images ------------------------


class LatencyPublic(BaseModel):
    """End-to-end latency (created → finished) of the workflows completed in a window."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class MinutePublic(BaseModel):
    """One minute of the window; an empty minute is present with zero counts."""

    minute: datetime = Field(description="Start of the minute (UTC).")
    completed: int
    failed: int = Field(description="FAILED or CANCELLED in this minute.")
    created: int
    p50_ms: float | None = Field(description="Median latency of the minute's completions.")
    p95_ms: float | None


class TaskTimingPublic(BaseModel):
    """Task runs finished in the window, and how long they waited and ran (medians)."""

    finished: int
    queue_wait_p50_ms: float | None
    run_p50_ms: float | None


class StatsPublic(BaseModel):
    counts: dict[WorkflowStatus, int] = Field(description="Every workflow ever, by status.")
    window_minutes: int
    now: datetime = Field(description="The database clock when the figures were taken.")
    minutes: list[MinutePublic] = Field(description="Oldest first, the current minute last.")
    latency: LatencyPublic
    tasks: TaskTimingPublic


class TaskRunInWorkflowPublic(TaskRunPublic):
    """A task run with its workflow's id, in a list across workflows."""

    workflow_id: uuid.UUID


class ActiveTaskRunPublic(TaskRunInWorkflowPublic):
    """An unfinished task run with its workflow; ``status`` is RUNNING while a worker holds it
    (``started_at`` stays empty until the worker reports)."""


class CdiObjectPublic(BaseModel):
    key: str
    host: str = Field(description="Host whose minion holds the object's memory.")
    size: int = Field(description="Bytes.")
    owner: str = Field(description="Container that owns it now; empty when nobody does.")
    generation: int = Field(description="Bumped by every change of owner or size.")
    created_at: float = Field(description="Unix seconds.")
    updated_at: float = Field(description="Unix seconds of the last change.")
    age_s: float
    workflow_id: uuid.UUID | None = Field(description="The workflow whose data it is, if any.")


class CdiMinionPublic(BaseModel):
    host: str
    alive: bool
    containers: int
    objects: int
    last_heartbeat: float = Field(description="Unix seconds.")
    heartbeat_age_s: float


class CdiDirectoryPublic(BaseModel):
    """What the CDI controller knows now: every object and every minion."""

    objects: list[CdiObjectPublic]
    minions: list[CdiMinionPublic]
    total_bytes: int


class ImagePublic(BaseModel):
    """A workflow's input or result image, and whether it can be shown."""

    role: str = Field(description="'input' or 'result'.")
    uri: str | None
    available: bool
    problem: str | None = Field(description="Why there is no thumbnail, when there is none.")
    format: str | None
    width: int | None
    height: int | None
    bytes: int | None
    thumbnail_url: str | None = Field(description="A downscaled JPEG; only when available.")


class WorkflowImagesPublic(BaseModel):
    input: ImagePublic
    result: ImagePublic
