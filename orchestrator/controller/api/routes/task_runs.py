"""``/api/task-runs``: task runs across workflows, e.g. what each worker is doing now.

Postgres holds a task run as QUEUED until its report arrives (the report carries its start and
end), so "running now" comes from Redis: a worker moves the instruction it runs into its
in-flight list and removes it only after reporting (``orchestrator.messages``).
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated

import redis
from fastapi import APIRouter, Query
from sqlalchemy import select

from orchestrator import keys
from orchestrator.controller.api.deps import RedisDep, SessionDep
from orchestrator.controller.api.params import WorkerFilter
from orchestrator.controller.schemas import ActiveTaskRunPublic, error_responses
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db.models import TaskRun, TaskRunStatus

router = APIRouter(prefix="/task-runs", tags=["task runs"], route_class=StrictJsonRoute)

_ACTIVE = (TaskRunStatus.QUEUED, TaskRunStatus.RUNNING)


def in_flight(client: redis.Redis, workers: set[str]) -> set[int]:
    """Ids of the task runs sitting in these workers' in-flight lists (being run now)."""
    ordered = sorted(workers)
    with client.pipeline(transaction=False) as pipe:
        for worker_id in ordered:
            pipe.lrange(keys.worker_inflight_key(worker_id), 0, -1)
        lists = pipe.execute()
    running: set[int] = set()
    for items in lists:
        for text in items:
            try:  # written by another process: skip what does not parse
                running.add(int(json.loads(text)["task_run_id"]))
            except (ValueError, TypeError, KeyError):
                continue
    return running


@router.get("/active", responses=error_responses(503))
def list_active_task_runs(
    session: SessionDep,
    client: RedisDep,
    worker: WorkerFilter = None,
    workflow: Annotated[uuid.UUID | None, Query(description="Only this workflow's runs.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[ActiveTaskRunPublic]:
    """Unfinished task runs, oldest first: RUNNING while a worker holds the instruction in its
    in-flight list, QUEUED while it waits in a queue."""
    query = select(TaskRun).where(TaskRun.status.in_(_ACTIVE))
    if worker is not None:
        query = query.where(TaskRun.worker_id == worker)
    if workflow is not None:
        query = query.where(TaskRun.workflow_id == workflow)
    rows = list(session.scalars(query.order_by(TaskRun.queued_at, TaskRun.id).limit(limit)))
    running = in_flight(client, {r.worker_id for r in rows if r.worker_id})
    out = []
    for row in rows:
        public = ActiveTaskRunPublic.model_validate(row)
        if row.id in running:
            public.status = TaskRunStatus.RUNNING
        out.append(public)
    return out
