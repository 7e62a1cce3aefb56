"""Request and response bodies of the REST API, kept apart from the ORM models.

``XCreate`` is what a client sends, ``XPublic`` what it gets back. Names, module paths and
bounds come from ``workflows`` so the API and the validator never disagree.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    field_validator,
    model_serializer,
)

from orchestrator.apikeys import ADMIN_KEY_NAME, Role
from orchestrator.contract.vocabulary import (
    CHOSEN_PLANES,
    DataPlane,
    Policy,
    TaskRunStatus,
    WorkflowStatus,
)
from orchestrator.s3policy import check_s3_uri
from workflows.definitions import MAX_BACKOFF_S, MAX_RETRIES, MAX_TIMEOUT_S
from workflows.names import MODULE_PATH_RE, NAME_RE, name_problem

__all__ = [
    "ActiveTaskRunPublic",
    "CdiDirectoryPublic",
    "CdiMinionPublic",
    "CdiObjectPublic",
    "CheckPublic",
    "ErrorPublic",
    "EventPage",
    "EventPublic",
    "FieldErrorPublic",
    "HandoffPublic",
    "IdentityPublic",
    "ImagePublic",
    "InputPublic",
    "KeyCreate",
    "KeyCreated",
    "KeyPublic",
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
    "ValidationErrorPublic",
    "WorkerPublic",
    "WorkflowCreate",
    "WorkflowDefinitionCreate",
    "WorkflowDefinitionPublic",
    "WorkflowDefinitionSave",
    "WorkflowDefinitionVersionPublic",
    "WorkflowDetail",
    "WorkflowImagesPublic",
    "WorkflowInput",
    "WorkflowList",
    "WorkflowPublic",
    "error_responses",
]

MAX_STEPS: Final = 200
# Documented in the schema (clients and the fuzzer see the rule); checked by the validators,
# whose messages say more than a pattern mismatch would.
_NAME_RULE: Final[dict[str, Any]] = {"pattern": f"^{NAME_RE.pattern}$", "maxLength": 64}
_MODULE_RULE: Final[dict[str, Any]] = {"pattern": f"^{MODULE_PATH_RE.pattern}$"}
MAX_DESCRIPTION: Final = 2000


class _Input(BaseModel):
    # A misspelt field is an error, not ignored; NaN and infinities are no numbers here.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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
    name: str = Field(
        examples=["sharpen"], description="Letters, digits, '_', '-'.", json_schema_extra=_NAME_RULE
    )
    module: str = Field(
        json_schema_extra=_MODULE_RULE,
        max_length=255,
        examples=["workflows.image_tasks:deblur"],
        description="Where the function lives: 'package.module:function'.",
    )
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_TIMEOUT_S, description="Default: the function's @task setting."
    )
    retries: int | None = Field(
        None, ge=0, le=MAX_RETRIES, description="Default: the function's @task setting."
    )
    retry_backoff_s: float | None = Field(
        None, ge=0, le=MAX_BACKOFF_S, description="Default: the function's @task setting."
    )
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
    """One step: a task (``task``), a switch (``switch``) or a sub-workflow (``workflow``)."""

    ref: str = Field(
        description="Name of the step inside the workflow.", json_schema_extra=_NAME_RULE
    )
    task: str | None = Field(
        None, description="Name of a registered task definition.", json_schema_extra=_NAME_RULE
    )
    depends_on: list[str] = Field(default_factory=list, description="Refs that finish first.")
    params: dict[str, Any] = Field(default_factory=dict, description="Given to the task.")
    inputs: dict[str, str | list[str]] | None = Field(
        None,
        description='Parameter name -> "<ref>.<output>" or "input.<name>" (or a list: the '
        "first whose step ran). Default: the image of the one step it depends on, or the "
        "workflow's input image.",
    )
    for_each: str | None = Field(
        None, description="One of its inputs, a list: the step runs once per element."
    )
    switch: str | None = Field(
        None, description='"<ref>.<output>": the value that chooses among the cases.'
    )
    cases: dict[str, list[str]] | None = Field(
        None, description="Switch: value -> the refs of the steps it runs."
    )
    default: list[str] | None = Field(
        None, description="Switch: the refs it runs when no case matches."
    )
    workflow: str | None = Field(
        None,
        description="Name of another workflow definition this step runs.",
        json_schema_extra=_NAME_RULE,
    )

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A step is one of three kinds: the fields of the others are left out, not null.
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class WorkflowDefinitionCreate(_Input):
    name: str = Field(examples=["image_pipeline"], json_schema_extra=_NAME_RULE)
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS)


class WorkflowDefinitionSave(_Input):
    """A new version of a workflow definition (``PUT``): the name comes from the path."""

    name: str | None = Field(
        None, description="Optional; must match the path when given.", json_schema_extra=_NAME_RULE
    )
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS)


class WorkflowDefinitionPublic(_Output):
    name: str
    version: int = Field(description="The current version; new runs run it.")
    description: str
    tasks: list[StepSchema]
    created_at: datetime
    updated_at: datetime = Field(description="When the current version was saved.")


class WorkflowDefinitionVersionPublic(_Output):
    name: str
    version: int
    description: str
    tasks: list[StepSchema]
    created_at: datetime


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
        if value is not None:
            check_s3_uri(value)  # S3NotAllowed is a ValueError: a 422 naming the problem
        return value


class WorkflowCreate(_Input):
    workflow: str = Field(
        examples=["image_pipeline"],
        description="Workflow definition name.",
        json_schema_extra=_NAME_RULE,
    )
    input: WorkflowInput
    policy: Policy = Field(Policy.AFFINITY, description="Where the tasks run.")
    data_plane: ChosenPlane = Field(DataPlane.CDI, description="How data moves between tasks.")
    version: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="A version of the definition to run; default: its current one.",
    )

    @field_validator("workflow")
    @classmethod
    def _workflow(cls, value: str) -> str:
        return _checked_name("workflow", value)


class WorkflowPublic(_Output):
    id: uuid.UUID
    # The ORM calls it ``definition``; the API says ``workflow``, as in the create body.
    workflow: str = Field(validation_alias=AliasChoices("workflow", "definition"))
    workflow_version: int = Field(
        validation_alias=AliasChoices("workflow_version", "definition_version"),
        description="The version of the definition this run runs.",
    )
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
    started_by: str | None = Field(description="Name of the API key that started the run.")


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
    data: dict[str, Any] | None = Field(
        None,
        description='The named data it read and made: {"reads": {name: datum}, "made": '
        '{name: datum}}, a datum {"key", "kind"} (a CDI object), {"value"} or '
        '{"items": [...]}; "results": the S3 URIs of what it stored.',
    )


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
    datum: str | None = Field(None, description='What moved: "<step run>.<output>".')
    mode: str | None = Field(
        None, description="transfer (ownership), share (read-only) or copy (another host)."
    )


class EventPublic(_Output):
    id: int
    kind: str
    data: dict[str, Any]
    at: datetime


class WorkflowDetail(WorkflowPublic):
    task_runs: list[TaskRunPublic]
    handoffs: list[HandoffPublic]
    events: list[EventPublic] = Field(description="The latest events, oldest first.")


class EventPage(BaseModel):
    """A run's events after a given one, and its status when they were read: a client that
    follows a run stops once the run has finished and a page comes back short."""

    status: WorkflowStatus
    events: list[EventPublic] = Field(description="Oldest first.")


class WorkflowList(BaseModel):
    items: list[WorkflowPublic]
    total: int = Field(description="Workflows matching the filters, over all pages.")
    limit: int
    offset: int


# --- API keys -----------------------------------------------------------------------------


class KeyCreate(_Input):
    name: str = Field(
        examples=["ci-runner"],
        description="Letters, digits, '_', '-'; unique.",
        json_schema_extra=_NAME_RULE,
    )
    role: Role = Field(
        Role.VIEWER,
        description="viewer: read everything; operator: also start, cancel and retry "
        "workflows; admin: also register tasks and definitions and manage keys.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value == ADMIN_KEY_NAME:
            raise ValueError(f"{value!r} is the name of the configured admin key; pick another")
        return _checked_name("key", value)


class KeyPublic(_Output):
    id: uuid.UUID
    name: str
    role: Role
    configured: bool = Field(description="The admin key from the API's settings (not revocable).")
    created_by: str | None = Field(description="Name of the key that issued it.")
    created_at: datetime


class KeyCreated(KeyPublic):
    key: str = Field(description="The key itself: shown this once; the API keeps a digest.")


class IdentityPublic(BaseModel):
    """The key a request was made with."""

    id: uuid.UUID
    name: str
    role: Role


# --- workers and health -------------------------------------------------------------------


class WorkerPublic(BaseModel):
    id: str
    host: str | None
    cpu: float | None = Field(
        description="The worker process's CPU, percent of one core (over 100 with several "
        "slots busy)."
    )
    mem: float | None = Field(
        description="The worker process's resident memory, percent of its host's memory."
    )
    rss_bytes: int | None = Field(None, description="The worker process's resident memory.")
    host_cpu: float | None = Field(None, description="CPU in use on the whole host, percent.")
    host_mem: float | None = Field(None, description="Memory in use on the whole host, percent.")
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


class FieldErrorPublic(BaseModel):
    """One problem FastAPI found in a request's shape (a field, a parameter, the JSON)."""

    loc: list[str | int] = Field(description="Where: 'body', 'query', 'path', then names.")
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = Field(None, description="e.g. 'error': why the JSON is refused.")


class ValidationErrorPublic(BaseModel):
    """A request whose shape is wrong: every problem, where it is."""

    detail: list[FieldErrorPublic]


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` documenting the ``ErrorPublic`` body for ``statuses``; a 422 is
    either that or FastAPI's list of field problems (``ValidationErrorPublic``)."""
    return {
        status: {"model": ErrorPublic | ValidationErrorPublic if status == 422 else ErrorPublic}
        for status in statuses
    }


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


class InputPublic(BaseModel):
    """An uploaded input image, stored in the stack's S3 bucket."""

    uri: str = Field(description="Start a workflow with it: input.image.")
    bytes: int
    format: str = Field(description="As Pillow names it: JPEG, PNG, ...")
    width: int
    height: int
    content_type: str


class WorkflowImagesPublic(BaseModel):
    input: ImagePublic
    result: ImagePublic
