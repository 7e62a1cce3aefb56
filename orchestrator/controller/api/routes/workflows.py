"""``/api/workflows``: start, list, inspect, cancel and retry workflow runs."""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Annotated, Any, Final

from fastapi import APIRouter, Header, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from orchestrator.contract import announce_finished, wake_scheduler
from orchestrator.contract.vocabulary import DataPlane, Policy, WorkflowStatus
from orchestrator.controller.api.deps import (
    RedisDep,
    Resources,
    SessionDep,
    run_store,
    utc,
)
from orchestrator.controller.api.params import (
    MAX_OFFSET,
    NAME_PATTERN,
    CursorParam,
    DateTimeFilter,
    NameFilter,
    TagFilter,
)
from orchestrator.controller.auth import Operator
from orchestrator.controller.finish_watch import FinishWatch
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.db import repository as repo
from orchestrator.db.async_run_store import AsyncRunStore
from orchestrator.db.models import Workflow
from orchestrator.errors import InvalidDefinition, InvalidRequest, NotFound
from orchestrator.s3policy import S3Policy
from orchestrator.schemas import (
    EventPage,
    EventPublic,
    HandoffPublic,
    TaskRunPublic,
    WorkflowCreate,
    WorkflowDetail,
    WorkflowList,
    WorkflowPublic,
    error_responses,
)
from workflows.definitions import chain_problems

router = APIRouter(prefix="/workflows", tags=["workflows"], route_class=StrictJsonRoute)

MAX_WAIT_S = 60.0  # a long poll answers within this; clients ask again
MAX_INPUT_FILTER: Final = 4096  # characters of the ``input`` filter's JSON

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=255,
        pattern=r"^[!-~]+$",
        description="Makes the start safe to retry: the same key (from the same API key) with "
        "the same body answers the run the first request started, without starting another "
        "(header Idempotent-Replayed: true); with another body, 422. 1-255 visible ASCII "
        "characters, e.g. a UUID.",
    ),
]


def _created(row: Workflow, response: Response) -> WorkflowPublic:
    response.headers["Location"] = f"/api/workflows/{row.id}"
    return WorkflowPublic.model_validate(row)


@router.post("", status_code=201, responses=error_responses(404, 422))
async def start_workflow(
    body: WorkflowCreate,
    request: Request,
    response: Response,
    principal: Operator,
    idempotency_key: IdempotencyKey = None,
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

    404 (listing the known workflows, or versions) if the definition (or the ``version`` of
    it asked for) does not exist. With ``wait_s`` the
    answer is the run's detail (as ``GET /api/workflows/{id}``, without events) once it has
    ended: one request for a client that wants the result. With an ``Idempotency-Key``, a
    retry answers the run the first request started.
    """
    runs = run_store(request)
    key = _Keyed(idempotency_key, principal.name, body)
    if wait_s <= 0:
        row = await _create(request, body, uuid.uuid4(), key, response)
        return WorkflowPublic.model_validate(row)
    watch: FinishWatch = request.app.state.finish_watch
    workflow_id = uuid.uuid4()
    with watch.listen(workflow_id) as woken:  # before the run exists: no announcement is missed
        row = await _create(request, body, workflow_id, key, response)
        if row.id != workflow_id:  # a replay: the run it started is the one to wait for
            ended = await watch.wait(
                row.id,
                wait_s,
                lambda announced: _detail(runs, row.id, 0, finished=True, announced=announced),
            )
        else:
            ended = await watch.until(
                woken,
                wait_s,
                lambda announced: _detail(runs, row.id, 0, finished=True, announced=announced),
                look_first=False,
            )
    return ended if ended is not None else await _found(runs, row.id)


async def _found(runs: AsyncRunStore, workflow_id: uuid.UUID) -> WorkflowDetail:
    detail = await _detail(runs, workflow_id, 0)
    assert detail is not None
    return detail


class _Keyed:
    """A start's ``Idempotency-Key`` (if any), whose it is, and the digest of its body."""

    def __init__(self, key: str | None, caller: str, body: WorkflowCreate) -> None:
        self.key = key
        self.caller = caller
        given = body.model_dump(mode="json", warnings=False)  # a plane given as text is fine
        canonical = json.dumps(given, sort_keys=True, separators=(",", ":"))
        self.digest = hashlib.sha256(canonical.encode()).hexdigest() if key else None


async def _create(
    request: Request,
    body: WorkflowCreate,
    workflow_id: uuid.UUID,
    keyed: _Keyed,
    response: Response,
) -> Any:
    if body.input.image is not None:
        policy: S3Policy = request.app.state.s3_policy
        policy.check_input(body.input.image)  # 422 outside CDIFLOW_S3_INPUTS
    if body.data_plane == DataPlane.OBJECT_STORE and body.input.image is not None:
        await run_in_threadpool(
            _check_one_chain, request.app.state.resources, body.workflow, body.version
        )
    row = await run_store(request).create(
        body.workflow,
        body.input.model_dump(exclude_defaults=True),  # what the user gave, no nulls
        policy=body.policy,
        data_plane=body.data_plane,
        workflow_id=workflow_id,
        version=body.version,
        started_by=keyed.caller,
        priority=body.priority,
        tags=body.tags,
        idempotency_key=keyed.key,
        request_digest=keyed.digest,
        timeout_s=body.timeout_s,
    )
    if row is None:
        resources: Resources = request.app.state.resources
        raise await run_in_threadpool(_not_found, resources, body.workflow, body.version)
    response.headers["Location"] = f"/api/workflows/{row.id}"
    if row.id != workflow_id:
        response.headers["Idempotent-Replayed"] = "true"  # the run an earlier request started
    return row  # the store woke the scheduler for the runs its commit made


def _check_one_chain(resources: Resources, workflow: str, version: int | None) -> None:
    """422 when the definition is not one chain, which the object-store plane needs (it
    carries one image from step to step); a rare path, so a query of its own."""
    with resources.sessions() as session:
        try:
            if version is None:
                steps = repo.get_workflow_definition(session, workflow).tasks
            else:
                steps = repo.get_workflow_definition_version(session, workflow, version).tasks
        except NotFound:
            return  # the run's creation answers 404, naming what exists
    problems = chain_problems(steps)
    if problems:
        raise InvalidDefinition(problems, f"workflow {workflow!r} on the object-store plane")


def _not_found(resources: Resources, workflow: str, version: int | None) -> NotFound:
    with resources.sessions() as session:
        return repo.definition_not_found(session, workflow, version)


@router.get("", responses=error_responses(422))
def list_workflows(
    session: SessionDep,
    status: WorkflowStatus | None = None,
    workflow: NameFilter = None,
    policy: Policy | None = None,
    created_after: Annotated[DateTimeFilter, Query(description="Inclusive.")] = None,
    created_before: Annotated[DateTimeFilter, Query(description="Exclusive.")] = None,
    q: Annotated[
        str | None,
        Query(max_length=36, pattern=r"^[0-9a-fA-F-]*$", description="Leading part of the id."),
    ] = None,
    tag: TagFilter = None,
    input: Annotated[
        str | None,
        Query(
            max_length=MAX_INPUT_FILTER,
            description='A JSON object the run\'s input contains, e.g. {"data": {"camera": 3}} '
            'or {"image": "s3://cdiflow/in/a.jpg"}.',
        ),
    ] = None,
    schedule: Annotated[
        str | None, Query(pattern=f"^{NAME_PATTERN}$", description="Runs this schedule made.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: CursorParam = None,
    offset: Annotated[
        int,
        Query(
            ge=0,
            le=MAX_OFFSET,
            description="Runs to skip after the cursor; a page costs every run it skips, so "
            "page with cursor instead (at most 10,000).",
        ),
    ] = 0,
) -> WorkflowList:
    """Workflow runs, newest first, one page at a time: the first page without ``cursor``,
    then ``cursor=next_cursor`` of the page before. ``total`` counts the matches (see its
    description for when it is exact). Filters combine: every ``tag`` given, the ``input``
    containing the JSON given, and the rest."""
    filters = repo.WorkflowFilter(
        status=status,
        definition=workflow,
        policy=policy,
        created_after=None if created_after is None else utc(created_after),
        created_before=None if created_before is None else utc(created_before),
        id_prefix=q or None,
        tags=tuple(tag or ()),
        input_contains=_input_filter(input),
        schedule=schedule,
    )
    at = None if cursor is None else repo.Cursor.decode(cursor)
    page = repo.list_workflows(session, filters, limit=limit, cursor=at, offset=offset)
    return WorkflowList(
        items=[WorkflowPublic.model_validate(r) for r in page.items],
        next_cursor=None if page.next is None else page.next.encode(),
        prev_cursor=None if page.prev is None else page.prev.encode(),
        has_more=page.next is not None,
        total=page.total,
        total_exact=page.total_exact,
        limit=limit,
        offset=offset,
    )


def _input_filter(given: str | None) -> dict[str, Any] | None:
    if given is None:
        return None
    try:
        value = json.loads(given)
    except ValueError as exc:
        problem = f"input: not JSON ({exc}); give a JSON object the runs' input contains"
        raise InvalidRequest(problem, [problem]) from None
    if not isinstance(value, dict):
        problem = 'input: give a JSON object, e.g. {"data": {"camera": 3}}'
        raise InvalidRequest(problem, [problem])
    return value


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
    runs = run_store(request)
    if wait_s > 0:
        watch: FinishWatch = request.app.state.finish_watch
        ended = await watch.wait(
            workflow_id,
            wait_s,
            lambda announced: _detail(
                runs, workflow_id, events, finished=True, announced=announced
            ),
        )
        if ended is not None:
            return ended
    detail = await _detail(runs, workflow_id, events)
    assert detail is not None
    return detail


async def _detail(
    runs: AsyncRunStore,
    workflow_id: uuid.UUID,
    events: int,
    *,
    finished: bool = False,
    announced: bool = False,
) -> WorkflowDetail | None:
    """The run's detail; with ``finished``, ``None`` while it runs. A look that no announcement
    prompted asks for the status alone first (one query); after an announcement the run has
    most likely ended, so the detail is loaded straight away."""
    if finished and not announced and not (await runs.status(workflow_id)).finished:
        return None
    row, recent = await runs.detail(workflow_id, events)
    if finished and not WorkflowStatus(row.status).finished:
        return None
    return WorkflowDetail(
        **WorkflowPublic.model_validate(row).model_dump(),
        task_runs=[TaskRunPublic.model_validate(r) for r in row.task_runs_json],
        handoffs=[HandoffPublic.model_validate(h) for h in row.handoffs_json],
        events=[EventPublic.model_validate(e) for e in recent],
    )


@router.get("/{workflow_id}/events", responses=error_responses(404))
def workflow_events(
    workflow_id: uuid.UUID,
    session: SessionDep,
    after: Annotated[
        int, Query(ge=0, le=2**63 - 1, description="Only events with a larger id.")
    ] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
) -> EventPage:
    """The run's events after event ``after``, oldest first, with the run's status: follow a
    run by asking again with the last id seen, until it has finished and a page is short."""
    status, rows = repo.events_after(session, workflow_id, after, limit)
    return EventPage(status=status, events=[EventPublic.model_validate(e) for e in rows])


@router.post("/{workflow_id}/cancel", responses=error_responses(404, 409))
def cancel_workflow(
    workflow_id: uuid.UUID, session: SessionDep, client: RedisDep, principal: Operator
) -> WorkflowPublic:
    """PENDING or RUNNING → CANCELLED; 409 if the run has already finished."""
    row = repo.cancel_workflow(session, workflow_id, by=principal.name)
    session.commit()
    wake_scheduler(client, row.id, cancel=True)
    announce_finished(client, row.id)
    return WorkflowPublic.model_validate(row)


@router.post("/{workflow_id}/pause", responses=error_responses(404, 409))
def pause_workflow(
    workflow_id: uuid.UUID, session: SessionDep, client: RedisDep, principal: Operator
) -> WorkflowPublic:
    """Pause a PENDING or RUNNING run: steps already at a worker finish, the next ones wait
    (a PENDING run is not claimed) until ``resume``. 409 once the run has ended; pausing a
    paused run changes nothing."""
    row = repo.pause_workflow(session, workflow_id, paused=True, by=principal.name)
    session.commit()
    wake_scheduler(client, row.id, pause=True)
    return WorkflowPublic.model_validate(row)


@router.post("/{workflow_id}/resume", responses=error_responses(404, 409))
def resume_workflow(
    workflow_id: uuid.UUID, session: SessionDep, client: RedisDep, principal: Operator
) -> WorkflowPublic:
    """Let a paused run go on; 409 once it has ended; resuming a run that is not paused
    changes nothing."""
    row = repo.pause_workflow(session, workflow_id, paused=False, by=principal.name)
    session.commit()
    wake_scheduler(client, row.id, pause=True)
    wake_scheduler(client, row.id)  # a PENDING one is claimed now
    return WorkflowPublic.model_validate(row)


@router.post("/{workflow_id}/retry", status_code=201, responses=error_responses(404, 409, 422))
def retry_workflow(
    workflow_id: uuid.UUID,
    session: SessionDep,
    client: RedisDep,
    request: Request,
    response: Response,
    principal: Operator,
) -> WorkflowPublic:
    """Start a new run with the same input as a FAILED, CANCELLED or TIMED_OUT one; 409
    otherwise, 422 when the input now lies outside the S3 policy."""
    policy: S3Policy = request.app.state.s3_policy

    def check(given: dict[str, Any]) -> None:
        if isinstance(image := given.get("image"), str):
            policy.check_input(image)

    row = repo.retry_workflow(session, workflow_id, started_by=principal.name, check_input=check)
    session.commit()
    wake_scheduler(client, row.id)
    return _created(row, response)
