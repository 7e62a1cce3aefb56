"""Task definitions: what registers one, and what the API shows of it."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator

from orchestrator.schemas.base import (
    MAX_DESCRIPTION,
    MODULE_RULE,
    NAME_RULE,
    RequestBody,
    ResponseBody,
    checked_name,
)
from workflows.definitions import MAX_BACKOFF_S, MAX_RETRIES, MAX_TIMEOUT_S
from workflows.names import MODULE_PATH_RE

__all__ = ["TaskCreate", "TaskPublic"]


class TaskCreate(RequestBody):
    name: str = Field(
        examples=["sharpen"], description="Letters, digits, '_', '-'.", json_schema_extra=NAME_RULE
    )
    module: str = Field(
        json_schema_extra=MODULE_RULE,
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
    max_concurrency: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="At most this many runs of this task at once, over every scheduler "
        "(further ones wait); default: no limit.",
        strict=True,
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return checked_name("task", value)

    @field_validator("module")
    @classmethod
    def _module(cls, value: str) -> str:
        if not MODULE_PATH_RE.fullmatch(value):
            raise ValueError(
                f"module {value!r} is not of the form 'package.module:function', "
                "e.g. 'workflows.image_tasks:deblur'"
            )
        return value


class TaskPublic(ResponseBody):
    name: str
    module: str
    timeout_s: float
    retries: int
    retry_backoff_s: float
    description: str
    max_concurrency: int | None = None
    created_at: datetime
    updated_at: datetime
