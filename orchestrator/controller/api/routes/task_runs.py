"""``/api/task-runs``: task runs across workflows: what each worker is doing now, and what
ran within a time window.

Postgres holds a task run as QUEUED until its report arrives (the report carries its start and
end), so "running now" comes from Redis: a worker moves the instruction it runs into its
in-flight list and removes it only after reporting (``orchestrator.contract.messages``).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Annotated

import redis
from fastapi import APIRouter, Query

from orchestrator.contract import keys
from orchestrator.contract.vocabulary import TaskRunStatus
from orchestrator.controller.api.deps import RedisDep, SessionDep, utc
from orchestrator.controller.api.params import MAX_OFFSET, WorkerFilter
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db.repository import task_runs as repo
from orchestrator.schemas import (
    ActiveTaskRunPublic,
    TaskRunInWorkflowPublic,
    error_responses,
)

router = APIRouter(prefix="/task-runs", tags=["task runs"], route_class=StrictJsonRoute)


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
    rows = repo.list_active_task_runs(session, worker=worker, workflow=workflow, limit=limit)
    running = in_flight(client, {r.worker_id for r in rows if r.worker_id})
    out = []
    for row in rows:
        public = ActiveTaskRunPublic.model_validate(row)
        if row.id in running:
            public.status = TaskRunStatus.RUNNING
        out.append(public)
    return out


@router.get("", responses=error_responses(422))
def list_task_runs_within(
    session: SessionDep,
    finished_after: Annotated[
        datetime, Query(description="Only runs that finished after this moment.")
    ],
    started_before: Annotated[
        datetime, Query(description="Only runs that started before this moment.")
    ],
    after_id: Annotated[
        int,
        Query(
            ge=0, le=MAX_OFFSET, description="Only runs with a greater id: the last id of a page."
        ),
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[TaskRunInWorkflowPublic]:
    """Task runs that ran, at least in part, between ``finished_after`` and
    ``started_before`` (e.g. each worker's busy time over a benchmark's window), by id. A page
    shorter than ``limit`` is the last; otherwise ask again with ``after_id`` set to its last
    id. A moment without a zone is UTC."""
    rows = repo.list_task_runs_within(
        session,
        finished_after=utc(finished_after),
        started_before=utc(started_before),
        after_id=after_id,
        limit=limit,
    )
    return [TaskRunInWorkflowPublic.model_validate(row) for row in rows]
