"""``/api/workflows``: start, list, inspect, cancel and retry workflow runs."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy import Row
from starlette.concurrency import run_in_threadpool

from orchestrator.announce import announce_finished
from orchestrator.controller.api.deps import RedisDep, Resources, SessionDep, wake_scheduler
from orchestrator.controller.finish_watch import FinishWatch
from orchestrator.controller.schemas import (
    EventPublic,
    HandoffPublic,
    TaskRunPublic,
    WorkflowCreate,
    WorkflowDetail,
    WorkflowList,
    WorkflowPublic,
    error_responses,
)
from orchestrator.db import repository as repo
from orchestrator.db.models import Policy, Workflow, WorkflowStatus
from orchestrator.errors import NotFound

router = APIRouter(prefix="/workflows", tags=["workflows"])

MAX_WAIT_S = 60.0  # a long poll answers within this; clients ask again


def _created(row: Workflow, response: Response) -> WorkflowPublic:
    response.headers["Location"] = f"/api/workflows/{row.id}"
    return WorkflowPublic.model_validate(row)


def _aware(moment: datetime | None) -> datetime | None:
    # A timestamp without a zone is read as UTC, not as the database session's zone.
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


@router.post("", status_code=201, responses=error_responses(404))
async def start_workflow(
    body: WorkflowCreate,
    request: Request,
    response: Response,
    wait_s: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description="Start and wait: answer with the run's detail once it has ended, or "
            "after this many seconds (0: at once, with the new PENDING run).",
        ),
    ] = 0.0,
) -> WorkflowDetail | WorkflowPublic:
    """Start a run of a workflow definition (status PENDING) and wake the scheduler.

    404 (listing the known workflows) if the definition does not exist. With ``wait_s`` the
    answer is the run's detail (as ``GET /api/workflows/{id}``, without events) once it has
    ended: one request for a client that wants the result.
    """
    resources: Resources = request.app.state.resources
    if wait_s <= 0:
        row = await run_in_threadpool(_create, resources, body, uuid.uuid4())
        response.headers["Location"] = f"/api/workflows/{row.id}"
        return WorkflowPublic.model_validate(row)
    watch: FinishWatch = request.app.state.finish_watch
    workflow_id = uuid.uuid4()
    with watch.listen(workflow_id) as woken:  # before the run exists: no announcement is missed
        row = await run_in_threadpool(_create, resources, body, workflow_id)
        response.headers["Location"] = f"/api/workflows/{row.id}"
        ended = await watch.until(
            woken,
            wait_s,
            lambda announced: run_in_threadpool(
                _detail, resources, row.id, 0, finished=True, announced=announced
            ),
            look_first=False,
        )
    if ended is not None:
        return ended
    detail = await run_in_threadpool(_detail, resources, row.id, 0)
    assert detail is not None
    return detail


def _create(resources: Resources, body: WorkflowCreate, workflow_id: uuid.UUID) -> Row[Any]:
    # One autocommit statement (durable: the API's commits are synchronous), no session.
    with resources.autocommit() as connection:
        row = repo.insert_workflow(
            connection,
            body.workflow,
            body.input.model_dump(exclude_defaults=True),  # what the user gave, no nulls
            policy=body.policy,
            data_plane=body.data_plane,
            workflow_id=workflow_id,
        )
    if row is None:
        with resources.sessions() as session:
            known = repo.workflow_definition_names(session)
        raise NotFound("workflow", body.workflow, known=known)
    wake_scheduler(resources.redis, row.id)
    return row


@router.get("")
def list_workflows(
    session: SessionDep,
    status: WorkflowStatus | None = None,
    workflow: Annotated[str | None, Query(description="Workflow definition name.")] = None,
    policy: Policy | None = None,
    created_after: Annotated[datetime | None, Query(description="Inclusive.")] = None,
    created_before: Annotated[datetime | None, Query(description="Exclusive.")] = None,
    q: Annotated[
        str | None,
        Query(max_length=36, pattern=r"^[0-9a-fA-F-]*$", description="Leading part of the id."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> WorkflowList:
    """Workflow runs, newest first, one page at a time; ``total`` counts every match."""
    filters = repo.WorkflowFilter(
        status=status,
        definition=workflow,
        policy=policy,
        created_after=_aware(created_after),
        created_before=_aware(created_before),
        id_prefix=q or None,
    )
    rows, total = repo.list_workflows(session, filters, limit=limit, offset=offset)
    items = [WorkflowPublic.model_validate(r) for r in rows]
    return WorkflowList(items=items, total=total, limit=limit, offset=offset)


@router.get("/{workflow_id}", responses=error_responses(404))
async def get_workflow(
    workflow_id: uuid.UUID,
    request: Request,
    events: Annotated[int, Query(ge=0, le=1000, description="How many recent events.")] = 100,
    wait_s: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_WAIT_S,
            description="Long poll: answer once the run has finished or this many seconds "
            "have passed, whichever comes first (0: at once). Cheaper than polling.",
        ),
    ] = 0.0,
) -> WorkflowDetail:
    """A run with its task runs (every attempt), CDI hand-offs and latest events."""
    resources: Resources = request.app.state.resources
    if wait_s > 0:
        watch: FinishWatch = request.app.state.finish_watch
        ended = await watch.wait(
            workflow_id,
            wait_s,
            lambda announced: run_in_threadpool(
                _detail, resources, workflow_id, events, finished=True, announced=announced
            ),
        )
        if ended is not None:
            return ended
    detail = await run_in_threadpool(_detail, resources, workflow_id, events)
    assert detail is not None
    return detail


def _detail(
    resources: Resources,
    workflow_id: uuid.UUID,
    events: int,
    *,
    finished: bool = False,
    announced: bool = False,
) -> WorkflowDetail | None:
    """The run's detail; with ``finished``, ``None`` while it runs. A look that no announcement
    prompted asks for the status alone first (one query); after an announcement the run has
    most likely ended, so the detail is loaded straight away."""
    if finished and not announced:
        with resources.autocommit() as connection:
            status = repo.workflow_status(connection, workflow_id)
        if status is None:
            raise NotFound("workflow run", workflow_id)
        if not status.finished:
            return None
    # Opened here, not as a dependency, so a waiting request holds no connection.
    with resources.autocommit() as connection:
        row = repo.workflow_detail_row(connection, workflow_id)
        if finished and not row.status.finished:
            return None
        return WorkflowDetail(
            **WorkflowPublic.model_validate(row).model_dump(),
            task_runs=[TaskRunPublic.model_validate(r) for r in row.task_runs_json],
            handoffs=[HandoffPublic.model_validate(h) for h in row.handoffs_json],
            events=[
                EventPublic.model_validate(e)
                for e in (repo.recent_events(connection, row.id, events) if events else [])
            ],
        )


@router.post("/{workflow_id}/cancel", responses=error_responses(404, 409))
def cancel_workflow(
    workflow_id: uuid.UUID, session: SessionDep, client: RedisDep
) -> WorkflowPublic:
    """PENDING or RUNNING → CANCELLED; 409 if the run has already finished."""
    row = repo.cancel_workflow(session, workflow_id)
    session.commit()
    wake_scheduler(client, row.id, cancel=True)
    announce_finished(client, row.id)
    return WorkflowPublic.model_validate(row)


@router.post("/{workflow_id}/retry", status_code=201, responses=error_responses(404, 409))
def retry_workflow(
    workflow_id: uuid.UUID, session: SessionDep, client: RedisDep, response: Response
) -> WorkflowPublic:
    """Start a new run with the same input as a FAILED or CANCELLED one; 409 otherwise."""
    row = repo.retry_workflow(session, workflow_id)
    session.commit()
    wake_scheduler(client, row.id)
    return _created(row, response)
