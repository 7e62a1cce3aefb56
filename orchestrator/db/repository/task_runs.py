"""Task runs across workflows: the unfinished ones, and those that ran within a time window.

A workflow's own task runs come with its detail (``repository.workflows.DETAIL_STATEMENT``);
the scheduler writes task runs through ``db.scheduler_store``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from sqlalchemy import ColumnElement, Select, func, literal_column, select
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.db.models import TaskRun

__all__ = ["list_active_task_runs", "list_task_runs_within", "window_statement"]

_ACTIVE: Final = (TaskRunStatus.QUEUED, TaskRunStatus.RUNNING)
# The span a finished run ran, exactly as ``ix_task_runs_ran`` (GiST) indexes it: the bounds'
# text is part of the expression (a parameter there would not match the index).
_CLOSED: Final[ColumnElement[str]] = literal_column("'[]'")
_RAN: Final[ColumnElement[object]] = func.tstzrange(
    func.least(TaskRun.started_at, TaskRun.finished_at), TaskRun.finished_at, _CLOSED
)


def list_active_task_runs(
    session: Session,
    *,
    worker: str | None = None,
    workflow: uuid.UUID | None = None,
    limit: int = 200,
) -> Sequence[TaskRun]:
    """Unfinished task runs (QUEUED or RUNNING in Postgres), oldest first."""
    query = select(TaskRun).where(TaskRun.status.in_(_ACTIVE))
    if worker is not None:
        query = query.where(TaskRun.worker_id == worker)
    if workflow is not None:
        query = query.where(TaskRun.workflow_id == workflow)
    return session.scalars(query.order_by(TaskRun.queued_at, TaskRun.id).limit(limit)).all()


def list_task_runs_within(
    session: Session,
    *,
    finished_after: datetime,
    started_before: datetime,
    after_id: int = 0,
    limit: int = 200,
) -> Sequence[TaskRun]:
    """Task runs that ran, at least in part, between the two moments: started before
    ``started_before`` and finished after ``finished_after``; by id, from ``after_id`` on
    (exclusive), at most ``limit``."""
    statement = window_statement(finished_after, started_before, after_id, limit)
    return session.scalars(statement).all()


def window_statement(
    finished_after: datetime, started_before: datetime, after_id: int, limit: int
) -> Select[Any]:
    """The query of ``list_task_runs_within``. The index finds the runs whose span meets the
    window (a superset: the window's bounds closed, and either way round); the exact
    conditions then keep those that qualify. The cost is the window's runs, however old or
    empty the window is."""
    low, high = sorted((finished_after, started_before))
    return (
        select(TaskRun)
        .where(
            TaskRun.id > after_id,
            TaskRun.started_at.is_not(None),
            TaskRun.finished_at.is_not(None),
            _RAN.op("&&")(func.tstzrange(low, high, _CLOSED)),
            TaskRun.started_at < started_before,
            TaskRun.finished_at > finished_after,
        )
        .order_by(TaskRun.id)
        .limit(limit)
    )
