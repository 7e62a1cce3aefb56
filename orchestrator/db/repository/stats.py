"""Figures over workflow runs and task runs: counts by status, and per minute of a window the
completions, failures, starts and latency percentiles.

Every figure is computed by the database in a few aggregate queries over indexed timestamps,
so it costs the same however many runs exist. The dashboard's overview polls these through
``GET /api/stats``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.db.models import TaskRun, Workflow

__all__ = [
    "Latency",
    "Minute",
    "TaskTiming",
    "latency",
    "minutes",
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


def _latency_ms() -> ColumnElement[Any]:
    return func.extract("epoch", Workflow.finished_at - Workflow.created_at) * 1000.0


def _percentile(fraction: float, value: ColumnElement[Any] | InstrumentedAttribute[Any]) -> Any:
    return func.percentile_cont(fraction).within_group(value)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def window(session: Session, width: int) -> tuple[datetime, datetime]:
    """The database clock now, and the start of the window of ``width`` minutes that ends
    with the current one."""
    now: datetime = session.execute(select(func.now())).scalar_one()
    since: datetime = session.execute(
        select(func.date_trunc("minute", func.now()) - timedelta(minutes=width - 1))
    ).scalar_one()
    return now, since


def status_counts(session: Session) -> dict[WorkflowStatus, int]:
    """Every workflow ever, by status (zero for a status no workflow has)."""
    counts = dict.fromkeys(WorkflowStatus, 0)
    for status, count in session.execute(
        select(Workflow.status, func.count()).group_by(Workflow.status)
    ):
        counts[status] = count
    return counts


def minutes(session: Session, since: datetime, width: int) -> list[Minute]:
    """Each of ``width`` minutes from ``since``, oldest first."""
    finished_minute = func.date_trunc("minute", Workflow.finished_at)
    completed = Workflow.status == WorkflowStatus.COMPLETED
    latency_ms = _latency_ms()
    finished = session.execute(
        select(
            finished_minute,
            func.count().filter(completed),
            func.count().filter(Workflow.status.in_(_STOPPED)),
            _percentile(0.5, latency_ms).filter(completed),
            _percentile(0.95, latency_ms).filter(completed),
        )
        .where(Workflow.finished_at >= since)
        .group_by(finished_minute)
    ).all()
    created_minute = func.date_trunc("minute", Workflow.created_at)
    created: dict[datetime, int] = {
        minute: count
        for minute, count in session.execute(
            select(created_minute, func.count())
            .where(Workflow.created_at >= since)
            .group_by(created_minute)
        )
    }
    by_minute = {row[0]: row for row in finished}
    out = []
    for n in range(width):
        minute = since + timedelta(minutes=n)
        row = by_minute.get(minute)
        out.append(
            Minute(
                minute=minute,
                completed=row[1] if row else 0,
                failed=row[2] if row else 0,
                created=created.get(minute, 0),
                p50_ms=_number(row[3]) if row else None,
                p95_ms=_number(row[4]) if row else None,
            )
        )
    return out


def latency(session: Session, since: datetime) -> Latency:
    """Latency of the workflows completed since ``since``."""
    latency_ms = _latency_ms()
    count, p50, p95, p99, longest = session.execute(
        select(
            func.count(),
            _percentile(0.5, latency_ms),
            _percentile(0.95, latency_ms),
            _percentile(0.99, latency_ms),
            func.max(latency_ms),
        ).where(Workflow.status == WorkflowStatus.COMPLETED, Workflow.finished_at >= since)
    ).one()
    return Latency(
        count=count,
        p50_ms=_number(p50),
        p95_ms=_number(p95),
        p99_ms=_number(p99),
        max_ms=_number(longest),
    )


def task_timing(session: Session, since: datetime) -> TaskTiming:
    """The task runs finished since ``since``."""
    finished, wait, run = session.execute(
        select(
            func.count(),
            _percentile(0.5, TaskRun.queue_wait_ms),
            _percentile(0.5, TaskRun.run_ms),
        ).where(TaskRun.finished_at >= since)
    ).one()
    return TaskTiming(finished=finished, queue_wait_p50_ms=_number(wait), run_p50_ms=_number(run))
