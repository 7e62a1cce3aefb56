"""Retention: how long finished runs are kept, per definition and by default, and what the
last pruning pass did (``orchestrator.retention``)."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field, field_validator

from orchestrator.contract.vocabulary import ResultRetention
from orchestrator.schemas.base import OpenEnum, RequestBody, ResponseBody, whole_number

__all__ = ["DefinitionRetentionPublic", "RetentionPassPublic", "RetentionPublic", "RetentionSet"]

MAX_DAYS = 36_500


class RetentionSet(RequestBody):
    """A definition's own retention; a field left null (or out) follows the default."""

    days: int | None = Field(
        default=None,
        ge=0,
        le=MAX_DAYS,
        description="Days a finished run is kept from its end, then pruned; 0 keeps runs for "
        "ever; null: the default (CDIFLOW_RETENTION_DAYS).",
    )
    results: ResultRetention | None = Field(
        default=None,
        description="What pruning does to a run's results in S3: keep or delete; null: the "
        "default (CDIFLOW_RETENTION_RESULTS).",
    )

    _days_whole = field_validator("days", mode="before")(whole_number)


class DefinitionRetentionPublic(ResponseBody):
    name: str
    days: int | None = Field(description="Its own setting (null: the default).")
    results: OpenEnum[ResultRetention] | None = Field(
        description="Its own setting (null: the default)."
    )
    effective_days: int = Field(description="What applies: 0 means kept for ever.")
    effective_results: OpenEnum[ResultRetention]


class RetentionPassPublic(ResponseBody):
    at: datetime
    pruned: int
    seconds: float
    error: str | None = Field(description="Why the pass stopped early (null: it did not).")


class RetentionPublic(ResponseBody):
    default_days: int = Field(description="CDIFLOW_RETENTION_DAYS (0: kept for ever).")
    default_results: OpenEnum[ResultRetention] = Field(description="CDIFLOW_RETENTION_RESULTS.")
    archive_uri: str | None = Field(
        description="Where pruned runs are archived first (CDIFLOW_ARCHIVE_URI); null: not."
    )
    interval_s: float = Field(description="Seconds between two passes.")
    definitions: list[DefinitionRetentionPublic] = Field(
        description="The definitions with a retention of their own."
    )
    last_pass: RetentionPassPublic | None
    pruned_total: int = Field(description="Runs pruned so far.")
    archived_total: int = Field(description="Runs archived so far.")
    runs_on_record: int = Field(description="Workflow runs in Postgres now.")
