"""The dashboard's statistics: counts, latency and task timings over a window."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.schemas.base import OpenEnum, ResponseBody

__all__ = ["LatencyPublic", "MinutePublic", "StatsPublic", "TaskTimingPublic"]


class LatencyPublic(ResponseBody):
    """End-to-end latency (created → finished) of the workflows completed in a window."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class MinutePublic(ResponseBody):
    """One minute of the window; an empty minute is present with zero counts."""

    minute: datetime = Field(description="Start of the minute (UTC).")
    completed: int
    failed: int = Field(description="FAILED, CANCELLED or TIMED_OUT in this minute.")
    created: int
    p50_ms: float | None = Field(description="Median latency of the minute's completions.")
    p95_ms: float | None


class TaskTimingPublic(ResponseBody):
    """Task runs finished in the window, and how long they waited and ran (medians)."""

    finished: int
    queue_wait_p50_ms: float | None
    run_p50_ms: float | None


class StatsPublic(ResponseBody):
    counts: dict[OpenEnum[WorkflowStatus], int] = Field(
        description="Every workflow ever, by status."
    )
    window_minutes: int
    now: datetime = Field(description="The database clock when the figures were taken.")
    minutes: list[MinutePublic] = Field(description="Oldest first, the current minute last.")
    latency: LatencyPublic
    tasks: TaskTimingPublic
