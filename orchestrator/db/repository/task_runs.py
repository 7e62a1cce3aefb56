"""Task runs across workflows: the unfinished ones, and those that ran within a time window.

A workflow's own task runs come with its detail (``repository.workflows.DETAIL_STATEMENT``);
the scheduler writes task runs through ``db.scheduler_store``.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.db.models import TaskRun

__all__ = ["list_active_task_runs", "list_task_runs_within"]

_ACTIVE: Final = (TaskRunStatus.QUEUED, TaskRunStatus.RUNNING)


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
    query = (
        select(TaskRun)
        .where(
            TaskRun.id > after_id,
            TaskRun.started_at.is_not(None),
            TaskRun.started_at < started_before,
            TaskRun.finished_at > finished_after,
        )
        .order_by(TaskRun.id)
        .limit(limit)
    )
    return session.scalars(query).all()
