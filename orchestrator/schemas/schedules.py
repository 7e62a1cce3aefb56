"""Schedules: what makes one, and a schedule as shown, with its next fire times."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Final

from pydantic import AliasChoices, Field, field_validator

from orchestrator.contract.vocabulary import CatchUp, DataPlane, Policy
from orchestrator.schemas.base import (
    NAME_RULE,
    PRIORITY_MAX,
    PRIORITY_MIN,
    RequestBody,
    ResponseBody,
    Tags,
    checked_name,
)
from orchestrator.schemas.runs import ChosenPlane, WorkflowInput

__all__ = ["DEFAULT_GRACE_S", "ScheduleCreate", "SchedulePublic"]

DEFAULT_GRACE_S: Final = 60.0


class ScheduleCreate(RequestBody):
    name: str = Field(examples=["nightly-report"], json_schema_extra=NAME_RULE)
    workflow: str = Field(
        examples=["image_pipeline"],
        description="The definition to run.",
        json_schema_extra=NAME_RULE,
    )
    cron: str = Field(
        max_length=255,
        examples=["0 2 * * *"],
        description="Five fields (minute hour day-of-month month day-of-week), six with the "
        "seconds first, or @hourly, @daily, @weekly, @monthly, @yearly.",
    )
    timezone: str = Field(
        "UTC", max_length=64, examples=["Europe/Paris"], description="An IANA time zone name."
    )
    catchup: CatchUp = Field(
        CatchUp.SKIP,
        description="Ticks missed (no scheduler running, or later than grace_s): 'skip' runs "
        "none, 'latest' one for the latest, 'all' one for each.",
    )
    grace_s: float = Field(
        DEFAULT_GRACE_S,
        ge=1,
        le=7 * 24 * 3600,
        description="A tick no later than this is run as usual; a later one is missed.",
    )
    input: WorkflowInput = Field(
        default_factory=lambda: WorkflowInput.model_validate({}), description="As in a start."
    )
    policy: Policy = Policy.AFFINITY
    data_plane: ChosenPlane = DataPlane.CDI
    version: int | None = Field(
        None, ge=1, le=2**31 - 1, description="Default: the definition's current one at each tick."
    )
    priority: int | None = Field(
        None,
        ge=PRIORITY_MIN,
        le=PRIORITY_MAX,
        description="Default: the definition's.",
        strict=True,
    )
    tags: Tags = Field(default_factory=list, description="Given to every run it makes.")
    paused: bool = Field(False, description="Made paused: it fires once resumed.")

    @field_validator("name", "workflow")
    @classmethod
    def _names(cls, value: str) -> str:
        return checked_name("name", value)


class SchedulePublic(ResponseBody):
    id: uuid.UUID
    name: str
    workflow: str = Field(validation_alias=AliasChoices("workflow", "definition"))
    cron: str
    timezone: str
    catchup: CatchUp
    grace_s: float
    input: dict[str, object]
    policy: Policy
    data_plane: DataPlane
    version: int | None
    priority: int | None
    tags: list[str]
    paused_at: datetime | None
    next_fire_at: datetime = Field(description="Its next tick (when paused: if resumed now).")
    next_fire_times: list[datetime] = Field(
        default_factory=list, description="Its next few ticks, from next_fire_at on."
    )
    last_fired_at: datetime | None = Field(description="The tick of its latest run.")
    last_run_id: uuid.UUID | None
    last_error: str | None = Field(description="Why its latest tick made no run, if it did not.")
    created_by: str | None
    created_at: datetime
