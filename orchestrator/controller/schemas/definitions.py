"""Workflow definitions: their steps, a new definition or version, and what the API shows."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from orchestrator.contract.vocabulary import ResultRetention
from orchestrator.controller.schemas.base import (
    MAX_DESCRIPTION,
    NAME_RULE,
    RequestBody,
    ResponseBody,
)

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
        json_schema_extra=NAME_RULE,
    )

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A step is one of three kinds: the fields of the others are left out, not null.
        data: dict[str, Any] = handler(self)
        return {key: value for key, value in data.items() if value is not None}


class WorkflowDefinitionCreate(RequestBody):
    name: str = Field(examples=["image_pipeline"], json_schema_extra=NAME_RULE)
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS)


class WorkflowDefinitionSave(RequestBody):
    """A new version of a workflow definition (``PUT``): the name comes from the path."""

    name: str | None = Field(
        None, description="Optional; must match the path when given.", json_schema_extra=NAME_RULE
    )
    description: str = Field("", max_length=MAX_DESCRIPTION)
    tasks: list[StepSchema] = Field(max_length=MAX_STEPS)


class WorkflowDefinitionPublic(ResponseBody):
    name: str
    version: int = Field(description="The current version; new runs run it.")
    description: str
    tasks: list[StepSchema]
    created_at: datetime
    updated_at: datetime = Field(description="When the current version was saved.")
    retention_days: int | None = Field(
        None,
        description="Days its finished runs are kept (PUT .../retention); null: the default.",
    )
    retention_results: ResultRetention | None = Field(
        None, description="What pruning does to its runs' results; null: the default."
    )


class WorkflowDefinitionVersionPublic(ResponseBody):
    name: str
    version: int
    description: str
    tasks: list[StepSchema]
    created_at: datetime


# --- workflow runs ------------------------------------------------------------------------
