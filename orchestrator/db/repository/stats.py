"""Figures over workflow runs and task runs: counts by status, and per minute of a window the
completions, failures, starts and latency percentiles.

Every figure comes from the tallies the database keeps as runs change (``db.tallies``): the
counts by status, each kept minute's summary, and rows per minute (and per hour), series and
bucket. A window costs a row a minute of its summaries, its hours' histograms and counts, and
the rows of the minutes not yet folded (seconds' worth), however many runs there are on
record. Percentiles come from histograms (within about 8 %; the largest value is exact). The
dashboard's overview polls these through ``GET /api/stats``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db import tallies
from orchestrator.db.tallies import Histogram

__all__ = [
    "Latency",
    "Minute",
    "TaskTiming",
    "Window",
    "latency",
    "minutes",
    "read_window",
    "status_counts",
    "task_timing",
    "window",
]

_STOPPED: Final = (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED, WorkflowStatus.TIMED_OUT)


@dataclass(frozen=True)
class Minute:
    """One minute of a window; an empty minute has zero counts."""

    minute: datetime
    completed: int
    failed: int  # FAILED, CANCELLED or TIMED_OUT
    created: int
    p50_ms: float | None  # latency of the minute's completions
    p95_ms: float | None


@dataclass(frozen=True)
class Latency:
    """Latency (created → finished) of the workflows completed in a window."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass(frozen=True)
class TaskTiming:
    """Task runs finished in a window, and how long they waited and ran (medians)."""

    finished: int
    queue_wait_p50_ms: float | None
    run_p50_ms: float | None


_HISTOGRAMS: Final = ("latency", "queue_wait", "task_run")
_COUNTED: Final = ("task_finished",)
_SHARES: Final = (0.5, 0.95)


@dataclass(frozen=True)
class Window:
    """A window's figures, read once for all of them: each minute's summary (those folded) or
    counts and latency percentiles (those from the first not yet folded on), and the
    histograms and counts of the whole window (summed by the database, from its hours and the
    minutes of its first partial hour)."""

    since: datetime
    width: int
    summaries: dict[datetime, tallies.Summary]
    counts: dict[datetime, dict[str, int]]  # the minutes read live
    latency: dict[datetime, dict[float, float]]  # theirs, by share
    histograms: dict[str, Histogram]
    totals: dict[str, int]

    def count(self, series: str) -> int:
        return self.totals.get(series, 0)

    def histogram(self, series: str) -> Histogram:
        return self.histograms.get(series) or Histogram()


def window(session: Session, width: int) -> tuple[datetime, datetime]:
    """The database clock now, and the start of the window of ``width`` minutes that ends
    with the current one."""
    now, since = session.execute(
        select(func.now(), func.date_trunc("minute", func.now()) - timedelta(minutes=width - 1))
    ).one()
    return now, since


def read_window(session: Session, since: datetime, width: int) -> Window:
    """The summaries of the window's folded minutes; from the first minute with runs not yet
    folded (usually the current one), its minutes read from their rows, as exact."""
    live = tallies.unfolded_since(session, since)
    histograms, totals = tallies.window_sums(session, since, (*_HISTOGRAMS, *_COUNTED))
    return Window(
        since,
        width,
        summaries=tallies.summaries(session, since, live),
        counts={} if live is None else tallies.window_counts(session, live),
        latency={} if live is None else tallies.minute_quantiles(session, live, "latency", _SHARES),
        histograms=histograms,
        totals=totals,
    )


def status_counts(session: Session) -> dict[WorkflowStatus, int]:
    """The workflows on record, by status (zero for a status no workflow has)."""
    counts = dict.fromkeys(WorkflowStatus, 0)
    for status, n in tallies.counts(session, "workflows:").items():
        if status in counts:
            counts[WorkflowStatus(status)] = n
    return counts


def minutes(figures: Window) -> list[Minute]:
    """Each minute of the window, oldest first."""
    out = []
    for n in range(figures.width):
        minute = figures.since + timedelta(minutes=n)
        summary = figures.summaries.get(minute)
        if summary is not None:
            done, failed, made = summary.completed, summary.failed, summary.created
            out.append(Minute(minute, done, failed, made, summary.p50_ms, summary.p95_ms))
            continue
        counts = figures.counts.get(minute, {})
        took = figures.latency.get(minute, {})
        out.append(
            Minute(
                minute=minute,
                completed=counts.get(f"ended:{WorkflowStatus.COMPLETED}", 0),
                failed=sum(counts.get(f"ended:{s}", 0) for s in _STOPPED),
                created=counts.get("created", 0),
                p50_ms=took.get(0.5),
                p95_ms=took.get(0.95),
            )
        )
    return out


def latency(figures: Window) -> Latency:
    """Latency of the workflows completed in the window."""
    took = figures.histogram("latency")
    return Latency(
        count=took.count,
        p50_ms=took.quantile(0.5),
        p95_ms=took.quantile(0.95),
        p99_ms=took.quantile(0.99),
        max_ms=took.peak,
    )


def task_timing(figures: Window) -> TaskTiming:
    """The task runs finished in the window."""
    return TaskTiming(
        finished=figures.count("task_finished"),
        queue_wait_p50_ms=figures.histogram("queue_wait").quantile(0.5),
        run_p50_ms=figures.histogram("task_run").quantile(0.5),
    )
