"""``/api/stats``: counts by status, throughput and latency over the last minutes (Postgres).

The dashboard's overview polls this; every figure is computed by the database in a few
aggregate queries over indexed timestamps, so a poll costs the same however many runs exist.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from orchestrator.controller.api.deps import SessionDep
from orchestrator.controller.schemas import (
    LatencyPublic,
    MinutePublic,
    StatsPublic,
    TaskTimingPublic,
)
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db.models import TaskRun, Workflow, WorkflowStatus

router = APIRouter(prefix="/stats", tags=["stats"], route_class=StrictJsonRoute)

_STOPPED = (WorkflowStatus.FAILED, WorkflowStatus.CANCELLED)


def _latency_ms() -> ColumnElement[Any]:
    return func.extract("epoch", Workflow.finished_at - Workflow.created_at) * 1000.0


def _percentile(fraction: float, value: ColumnElement[Any] | InstrumentedAttribute[Any]) -> Any:
    return func.percentile_cont(fraction).within_group(value)


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _counts(session: Session) -> dict[WorkflowStatus, int]:
    counts = dict.fromkeys(WorkflowStatus, 0)
    for status, count in session.execute(
        select(Workflow.status, func.count()).group_by(Workflow.status)
    ):
        counts[status] = count
    return counts


def _minutes(session: Session, since: datetime, width: int) -> list[MinutePublic]:
    finished_minute = func.date_trunc("minute", Workflow.finished_at)
    completed = Workflow.status == WorkflowStatus.COMPLETED
    latency = _latency_ms()
    finished = session.execute(
        select(
            finished_minute,
            func.count().filter(completed),
            func.count().filter(Workflow.status.in_(_STOPPED)),
            _percentile(0.5, latency).filter(completed),
            _percentile(0.95, latency).filter(completed),
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
            MinutePublic(
                minute=minute,
                completed=row[1] if row else 0,
                failed=row[2] if row else 0,
                created=created.get(minute, 0),
                p50_ms=_number(row[3]) if row else None,
                p95_ms=_number(row[4]) if row else None,
            )
        )
    return out


def _latency(session: Session, since: datetime) -> LatencyPublic:
    latency = _latency_ms()
    count, p50, p95, p99, longest = session.execute(
        select(
            func.count(),
            _percentile(0.5, latency),
            _percentile(0.95, latency),
            _percentile(0.99, latency),
            func.max(latency),
        ).where(Workflow.status == WorkflowStatus.COMPLETED, Workflow.finished_at >= since)
    ).one()
    return LatencyPublic(
        count=count,
        p50_ms=_number(p50),
        p95_ms=_number(p95),
        p99_ms=_number(p99),
        max_ms=_number(longest),
    )


def _task_timing(session: Session, since: datetime) -> TaskTimingPublic:
    finished, wait, run = session.execute(
        select(
            func.count(),
            _percentile(0.5, TaskRun.queue_wait_ms),
            _percentile(0.5, TaskRun.run_ms),
        ).where(TaskRun.finished_at >= since)
    ).one()
    return TaskTimingPublic(
        finished=finished, queue_wait_p50_ms=_number(wait), run_p50_ms=_number(run)
    )


@router.get("")
def get_stats(
    session: SessionDep,
    window_minutes: Annotated[
        int, Query(ge=1, le=24 * 60, description="How many minutes, the current one included.")
    ] = 15,
) -> StatsPublic:
    """Workflows by status (all time) and, per minute of the window, completions, failures,
    starts and latency percentiles; plus the window's latency and task timing summary."""
    now: datetime = session.execute(select(func.now())).scalar_one()
    since: datetime = session.execute(
        select(func.date_trunc("minute", func.now()) - timedelta(minutes=window_minutes - 1))
    ).scalar_one()
    return StatsPublic(
        counts=_counts(session),
        window_minutes=window_minutes,
        now=now,
        minutes=_minutes(session, since, window_minutes),
        latency=_latency(session, since),
        tasks=_task_timing(session, since),
    )
