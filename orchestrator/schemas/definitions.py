"""Workflow definitions: their steps, a new definition or version, and what the API shows."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from orchestrator.contract.vocabulary import ResultRetention
from orchestrator.schemas.base import (
    MAX_DESCRIPTION,
    NAME_RULE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    OpenEnum,
    RequestBody,
    ResponseBody,
)
from workflows.definitions import MAX_RUN_S

__all__ = [
    "MAX_STEPS",
    "StepSchema",
    "WorkflowDefinitionCreate",
    "WorkflowDefinitionPublic",
    "WorkflowDefinitionSave",
    "WorkflowDefinitionVersionPublic",
]

MAX_STEPS: Final = 200


class StepSchema(RequestBody):
    """One step: a task (``task``), a switch (``switch``) or a sub-workflow (``workflow``)."""

    ref: str = Field(
        description="Name of the step inside the workflow.", json_schema_extra=NAME_RULE
    )
    task: str | None = Field(
        None, description="Name of a registered task definition.", json_schema_extra=NAME_RULE
    )
    depends_on: list[str] = Field(default_factory=list, description="Refs that finish first.")
    params: dict[str, Any] = Field(default_factory=dict, description="Given to the task.")
    inputs: dict[str, str | list[str]] | None = Field(
        default=None,
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
        default=None,
        description="Name of another workflow definition this step runs.",
        json_schema_extra=NAME_RULE,
    )
    channels: dict[str, list[str]] | None = Field(
        default=None,
        description='A streaming task step: {"publish": [channel names], "subscribe": '
        "[channel names]}. It runs while the steps joined to it by channels run, reading and "
        "writing items until its input channels end (docs/streaming.md).",
    )

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A step is one of three kinds: the fields of the others are left out, not null.
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class QueueSettings(RequestBody):
    """How the definition's runs queue: not part of a version (a change saves none)."""

    priority: int = Field(
        0,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="The priority of its runs when a start names none (waiting runs are "
        "served highest first).",
        strict=True,
    )
    max_concurrent_runs: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="At most this many of its runs RUNNING at once, over every scheduler; "
        "the others wait PENDING. Default: no limit.",
        strict=True,
    )

    def given_settings(self) -> dict[str, Any]:
        """The settings the body names (a ``PUT`` leaves the others as they are)."""
        return {k: getattr(self, k) for k in QUEUE_SETTINGS if k in self.model_fields_set}


QUEUE_SETTINGS: Final = ("priority", "max_concurrent_runs")


# Documented in the schema; checked where a definition is, with a message saying more.
STEPS_RULE: Final[dict[str, Any]] = {"minItems": 1}


_TIMEOUT = (
    "The longest a run may take from its start, in seconds: past it the run ends TIMED_OUT "
    "and its running task is stopped. A start may set its own. Default: no limit."
)
_WORKER_WAIT = (
    "The longest a step may wait for a live worker able to run it (none alive, or none "
    "loaded its task's module), in seconds: the run then fails saying so. Default: wait while "
    "no worker lives; 30 s once workers live but none loaded the module."
)


class _RunLimits(RequestBody):
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_RUN_S, description=_TIMEOUT)
    worker_wait_s: float | None = Field(default=None, gt=0, le=MAX_RUN_S, description=_WORKER_WAIT)


class WorkflowDefinitionCreate(QueueSettings, _RunLimits):
    name: str = Field(examples=["image_pipeline"], json_schema_extra=NAME_RULE)
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS, json_schema_extra=STEPS_RULE)


class WorkflowDefinitionSave(QueueSettings, _RunLimits):
    """A new version of a workflow definition (``PUT``): the name comes from the path."""

    name: str | None = Field(
        None, description="Optional; must match the path when given.", json_schema_extra=NAME_RULE
    )
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS, json_schema_extra=STEPS_RULE)


class WorkflowDefinitionPublic(ResponseBody):
    name: str
    version: int = Field(description="The current version; new runs run it.")
    description: str
    tasks: list[StepSchema]
    timeout_s: float | None = Field(default=None, description=_TIMEOUT)
    worker_wait_s: float | None = Field(default=None, description=_WORKER_WAIT)
    created_at: datetime
    updated_at: datetime = Field(description="When the current version was saved.")
    priority: int = 0
    max_concurrent_runs: int | None = None
    paused_at: datetime | None = Field(
        None, description="Since when its new runs wait PENDING (POST .../resume lifts it)."
    )
    retention_days: int | None = Field(
        None,
        description="Days its finished runs are kept (PUT .../retention); null: the default.",
    )
    retention_results: OpenEnum[ResultRetention] | None = Field(
        None, description="What pruning does to its runs' results; null: the default."
    )


class WorkflowDefinitionVersionPublic(ResponseBody):
    name: str
    version: int
    description: str
    tasks: list[StepSchema]
    timeout_s: float | None = Field(default=None, description=_TIMEOUT)
    worker_wait_s: float | None = Field(default=None, description=_WORKER_WAIT)
    created_at: datetime


# --- workflow runs ------------------------------------------------------------------------
