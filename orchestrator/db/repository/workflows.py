"""Workflow runs as the API sees them: start, list, read, cancel, retry.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
A cancel ends a run with the scheduler's own ending statement, which locks the workflow row
first, so the controller and a scheduler cannot both move a workflow out of a state.

The statements a workflow's start and its detail run on (``CREATE_STATEMENT``,
``DETAIL_STATEMENT``, ...) are also compiled once into psycopg's text (``..._SQL``) for the
API's event loop (``db.async_run_store``) and the scheduler (``db.scheduler_store``), so each
has one definition.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    Uuid,
    bindparam,
    cast,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, aggregate_order_by
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement

from orchestrator.contract.vocabulary import DataPlane, Policy, WorkflowStatus
from orchestrator.db.models import (
    Event,
    Handoff,
    Schedule,
    TaskRun,
    Workflow,
    WorkflowDefinitionVersion,
)
from orchestrator.db.repository.definitions import workflow_definition_names
from orchestrator.db.run_statements import FINISH, Finish, finish_params
from orchestrator.errors import Conflict, NotFound

__all__ = [
    "CREATE_SQL",
    "CREATE_STATEMENT",
    "DETAIL_SQL",
    "DETAIL_STATEMENT",
    "IDEMPOTENT_SQL",
    "RECENT_EVENTS_SQL",
    "RECENT_EVENTS_STATEMENT",
    "STATUS_SQL",
    "STATUS_STATEMENT",
    "WorkflowFilter",
    "cancel_workflow",
    "create_params",
    "create_workflow",
    "definition_not_found",
    "ended_among",
    "events_after",
    "get_workflow",
    "list_workflows",
    "pause_workflow",
    "retry_workflow",
]


@dataclass(frozen=True)
class WorkflowFilter:
    """Criteria for ``list_workflows``; ``None`` means "any"."""

    status: WorkflowStatus | None = None
    definition: str | None = None
    policy: Policy | None = None
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    id_prefix: str | None = None  # leading characters of the canonical UUID text
    tags: tuple[str, ...] = ()  # the run has every one of them
    input_contains: dict[str, Any] | None = None  # JSON the run's input contains (``@>``)
    schedule: str | None = None  # made by the schedule of that name

    def clauses(self) -> list[ColumnElement[bool]]:
        """The SQL conditions this filter stands for."""
        out: list[ColumnElement[bool]] = []
        if self.status is not None:
            out.append(Workflow.status == self.status)
        if self.definition is not None:
            out.append(Workflow.definition == self.definition)
        if self.policy is not None:
            out.append(Workflow.policy == self.policy)
        if self.created_after is not None:
            out.append(Workflow.created_at >= self.created_after)
        if self.created_before is not None:
            out.append(Workflow.created_at < self.created_before)
        if self.id_prefix:
            prefix = self.id_prefix.lower()
            out.append(cast(Workflow.id, String).startswith(prefix, autoescape=True))
        if self.tags:
            out.append(Workflow.tags.contains(list(self.tags)))
        if self.input_contains is not None:
            out.append(Workflow.input.contains(self.input_contains))
        if self.schedule is not None:
            made_by = select(Schedule.id).where(Schedule.name == self.schedule).scalar_subquery()
            out.append(Workflow.schedule_id == made_by)
        return out


# One statement (one round trip): the definition must exist, the run and its event are written
# together. *Why:* starting workflows is the API's hottest write; the ORM took four round trips.
# The API runs it on its event loop (``CREATE_SQL``). A run whose id exists already is left as
# it is (no row returned, no event): a start sent again after its connection dropped does
# nothing the second time. The run records the definition's current version, or ``:version``
# when one is asked for (it must exist), and its time limit: the start's, else that version's.
# The definition's row is share-locked (``FOR KEY SHARE``, which the foreign key's check takes
# anyway): a delete, which locks it first, then counts this run or refuses it.
CREATE_STATEMENT = text(
    """
    WITH w AS (
        INSERT INTO workflows (id, definition, definition_version, status, policy, data_plane,
                               input, retry_of, started_by, priority, tags, idempotency_key,
                               request_digest, timeout_s)
        SELECT CAST(:id AS uuid), d.name, coalesce(CAST(:version AS integer), d.version),
               'PENDING', CAST(:policy AS workflow_policy), CAST(:data_plane AS data_plane),
               :input, CAST(:retry_of AS uuid), CAST(:started_by AS varchar),
               coalesce(CAST(:priority AS integer), d.priority), CAST(:tags AS varchar[]),
               CAST(:idempotency_key AS varchar), CAST(:request_digest AS varchar),
               coalesce(CAST(:timeout_s AS float8), CASE
                   WHEN CAST(:version AS integer) IS NULL THEN d.timeout_s
                   ELSE (SELECT v.timeout_s FROM workflow_definition_versions v
                         WHERE v.name = d.name AND v.version = CAST(:version AS integer))
               END)
        FROM workflow_definitions d
        WHERE d.name = :definition AND d.deleted_at IS NULL
          AND (CAST(:version AS integer) IS NULL OR EXISTS (
                SELECT 1 FROM workflow_definition_versions v
                WHERE v.name = d.name AND v.version = CAST(:version AS integer)))
        FOR KEY SHARE OF d
        ON CONFLICT DO NOTHING
        RETURNING *
    ), ev AS (
        INSERT INTO events (workflow_id, kind, data)
        SELECT id, 'workflow.created', :event FROM w
    )
    SELECT * FROM w
    """
).bindparams(
    bindparam("id", type_=Uuid),
    bindparam("retry_of", type_=Uuid),
    bindparam("input", type_=JSONB),
    bindparam("event", type_=JSONB),
)

# The run an earlier start made with this caller's ``Idempotency-Key`` (``ON CONFLICT DO
# NOTHING`` above leaves no row when the key is taken; this finds whose it is).
IDEMPOTENT_STATEMENT = select(Workflow.__table__).where(
    Workflow.started_by == bindparam("started_by"),
    Workflow.idempotency_key == bindparam("idempotency_key"),
)


def create_workflow(
    session: Session,
    definition: str,
    input: dict[str, Any],
    *,
    policy: Policy = Policy.AFFINITY,
    data_plane: DataPlane = DataPlane.CDI,
    retry_of: uuid.UUID | None = None,
    version: int | None = None,
    started_by: str | None = None,
    priority: int | None = None,
    tags: Sequence[str] = (),
    timeout_s: float | None = None,
) -> Workflow:
    """A new PENDING run of ``definition`` (its current version, or ``version``); ``NotFound``
    (listing the known names, or versions) if there is no such definition or version.
    ``started_by``: the name of the API key that asked for it; ``timeout_s``: the run's time
    limit (default: the version's)."""
    params = create_params(
        definition,
        input,
        policy,
        data_plane,
        retry_of,
        version=version,
        started_by=started_by,
        priority=priority,
        tags=tags,
        timeout_s=timeout_s,
    )
    query = select(Workflow).from_statement(CREATE_STATEMENT)
    created: Workflow | None = session.scalars(query, params).one_or_none()
    if created is None:
        raise definition_not_found(session, definition, version)
    return created


def definition_not_found(session: Session, definition: str, version: int | None) -> NotFound:
    """Why ``CREATE_STATEMENT`` made no run: no such (live) definition, or no such version."""
    names = workflow_definition_names(session)
    if version is None or definition not in names:
        return NotFound("workflow", definition, known=names)
    versions = session.scalars(
        select(WorkflowDefinitionVersion.version)
        .where(WorkflowDefinitionVersion.name == definition)
        .order_by(WorkflowDefinitionVersion.version)
    )
    return NotFound(f"version {version} of workflow", definition, known=[str(v) for v in versions])


def create_params(
    definition: str,
    input: dict[str, Any],
    policy: Policy,
    data_plane: DataPlane,
    retry_of: uuid.UUID | None,
    workflow_id: uuid.UUID | None = None,
    *,
    version: int | None = None,
    started_by: str | None = None,
    priority: int | None = None,
    tags: Sequence[str] = (),
    idempotency_key: str | None = None,
    request_digest: str | None = None,
    timeout_s: float | None = None,
) -> dict[str, Any]:
    """The parameters of ``CREATE_STATEMENT``; ``workflow_id``: one the caller chose (it
    listens for the run's end already); ``version``: a version of the definition to run
    instead of its current one; ``priority``: None for the definition's; ``timeout_s``: a
    time limit instead of the version's."""
    event: dict[str, Any] = {"workflow": definition, "policy": policy, "data_plane": data_plane}
    if retry_of is not None:
        event["retry_of"] = str(retry_of)
    if version is not None:
        event["version"] = version
    if started_by is not None:
        event["by"] = started_by
    if timeout_s is not None:
        event["timeout_s"] = timeout_s
    return {
        "id": workflow_id or uuid.uuid4(),
        "definition": definition,
        "version": version,
        "policy": policy.value,
        "data_plane": data_plane.value,
        "input": input,
        "retry_of": retry_of,
        "started_by": started_by,
        "priority": priority,
        "tags": list(dict.fromkeys(tags)),  # each once, in the order given
        "idempotency_key": idempotency_key,
        "request_digest": request_digest,
        "timeout_s": timeout_s,
        "event": event,
    }


# A run's status: what a long poll looks at before an announcement says the run has ended, and
# what the scheduler looks at when a cancellation wakes it.
STATUS_STATEMENT = select(Workflow.status).where(Workflow.id == bindparam("id"))


_ENDED_AMONG = select(Workflow.id).where(
    Workflow.id.in_(bindparam("ids", expanding=True)),
    Workflow.status.in_([s for s in WorkflowStatus if s.finished]),
)


def ended_among(connection: Connection, workflow_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``workflow_ids`` have ended, in one query: how one sweep a second covers every
    long poll of an API process, however many there are."""
    if not workflow_ids:
        return set()
    return set(connection.execute(_ENDED_AMONG, {"ids": list(workflow_ids)}).scalars())


def get_workflow(session: Session, workflow_id: uuid.UUID, *, lock: bool = False) -> Workflow:
    """The workflow ``workflow_id``; ``lock=True`` holds its row until the transaction ends."""
    found = session.get(Workflow, workflow_id, with_for_update=lock, populate_existing=lock)
    if found is None:
        raise NotFound("workflow run", workflow_id)
    return found


def events_after(
    session: Session, workflow_id: uuid.UUID, after: int, limit: int
) -> tuple[WorkflowStatus, list[Event]]:
    """The run's status and up to ``limit`` of its events with an id above ``after``, oldest
    first (what a client following the run asks for); ``NotFound`` if there is no such run."""
    status = session.scalar(select(Workflow.status).where(Workflow.id == workflow_id))
    if status is None:
        raise NotFound("workflow run", workflow_id)
    events = session.scalars(
        select(Event)
        .where(Event.workflow_id == workflow_id, Event.id > after)
        .order_by(Event.id)
        .limit(limit)
    )
    return status, list(events)


def list_workflows(
    session: Session,
    filters: WorkflowFilter | None = None,
    *,
    limit: int = 50,
    offset: int = 0,
) -> tuple[list[Workflow], int]:
    """One page of workflows matching ``filters``, newest first, and the total matching."""
    where = (filters or WorkflowFilter()).clauses()
    total = session.scalar(select(func.count()).select_from(Workflow).where(*where)) or 0
    page = session.scalars(
        select(Workflow)
        .where(*where)
        .order_by(Workflow.created_at.desc(), Workflow.id.desc())
        .limit(limit)
        .offset(offset)
    )
    return list(page), total


def cancel_workflow(session: Session, workflow_id: uuid.UUID, *, by: str | None = None) -> Workflow:
    """PENDING or RUNNING → CANCELLED; ``Conflict`` if it has already finished. ``by``: the
    name of the API key that asked, recorded in the run's error.

    The ending is the scheduler's own statement (``run_statements.FINISH``), so a cancel and a
    scheduler's end of the same run lock the same row and only the first one counts. The
    scheduler, woken by the caller, stops the work and cleans up its task runs.
    """
    reason = f"cancelled by {by}" if by else "cancelled by request"
    cancel = Finish(workflow_id, WorkflowStatus.CANCELLED, error=reason)
    ended = session.connection().exec_driver_sql(FINISH, finish_params(cancel)).scalar()
    workflow = get_workflow(session, workflow_id)
    if not ended:
        raise Conflict(
            f"workflow run {workflow_id} has already finished ({workflow.status}); "
            "only PENDING or RUNNING runs can be cancelled"
        )
    return workflow


# Pause or resume a run that has not ended; the event only when that changed something.
_PAUSE = text(
    """
    WITH prev AS (
        SELECT id, paused_at FROM workflows
        WHERE id = :id AND status IN ('PENDING', 'RUNNING')
        FOR UPDATE
    ), changed AS (
        UPDATE workflows w
        SET paused_at = CASE WHEN :paused THEN coalesce(w.paused_at, now()) END
        FROM prev p
        WHERE w.id = p.id AND (p.paused_at IS NULL) = :paused
        RETURNING w.id
    ), ev AS (
        INSERT INTO events (workflow_id, kind, data)
        SELECT id, :kind, jsonb_build_object('by', CAST(:by AS text)) FROM changed
    )
    SELECT count(*) FROM prev
    """
).bindparams(bindparam("id", type_=Uuid))


def pause_workflow(
    session: Session, workflow_id: uuid.UUID, *, paused: bool, by: str | None = None
) -> Workflow:
    """Pause (``paused``) or resume a PENDING or RUNNING run: a paused run's next steps wait,
    a paused PENDING run is not claimed. Asking again changes nothing; ``Conflict`` once the
    run has ended, ``NotFound`` if there is no such run."""
    kind = "workflow.paused" if paused else "workflow.unpaused"
    found = session.execute(
        _PAUSE, {"id": workflow_id, "paused": paused, "kind": kind, "by": by}
    ).scalar()
    workflow = get_workflow(session, workflow_id)
    session.refresh(workflow)
    if not found:
        verb = "paused" if paused else "resumed"
        raise Conflict(
            f"workflow run {workflow_id} has already finished ({workflow.status}); only "
            f"PENDING or RUNNING runs can be {verb}"
        )
    return workflow


def retry_workflow(
    session: Session,
    workflow_id: uuid.UUID,
    *,
    started_by: str | None = None,
    check_input: Callable[[dict[str, Any]], None] | None = None,
) -> Workflow:
    """A new PENDING run with the same definition version, input, policy, data plane and time
    limit as a FAILED, CANCELLED or TIMED_OUT one (which stays as it is); ``Conflict`` for any
    other state, or when
    the definition has been deleted since. ``check_input`` may refuse the old input (by
    raising), e.g. one that a changed policy no longer allows."""
    old = get_workflow(session, workflow_id, lock=True)
    if not old.status.finished or old.status is WorkflowStatus.COMPLETED:
        raise Conflict(
            f"workflow run {workflow_id} is {old.status}; only FAILED, CANCELLED or TIMED_OUT "
            "runs can be retried"
        )
    if old.definition not in workflow_definition_names(session):
        raise Conflict(
            f"workflow {old.definition!r} has been deleted, so run {workflow_id} cannot be "
            "retried; create the definition again and start a new run"
        )
    if check_input is not None:
        check_input(dict(old.input))
    return create_workflow(
        session,
        old.definition,
        dict(old.input),
        policy=old.policy,
        data_plane=old.data_plane,
        retry_of=old.id,
        version=old.definition_version,
        started_by=started_by,
        priority=old.priority,
        tags=old.tags,
        timeout_s=old.timeout_s,
    )


# The detail of a run is read as plain rows (attribute access by column name, which the API's
# schemas read as they read ORM objects). *Why:* through an ORM session this read was 44 % of
# the API's GIL-holding samples at 10 KB images; the rows are read-only and never modified.
# The API runs these on its event loop (``DETAIL_SQL``, ``RECENT_EVENTS_SQL``).
RECENT_EVENTS_STATEMENT = (
    select(Event.__table__)
    .where(Event.workflow_id == bindparam("id"))
    .order_by(Event.id.desc())
    .limit(bindparam("limit"))
)


def _rows_as_json(table: Any) -> Any:
    """A workflow's rows of ``table`` as one JSON array (by id): a column of the detail's
    single statement."""
    rows = func.json_agg(aggregate_order_by(table.table_valued(), table.c.id))
    return (
        select(func.coalesce(rows, text("'[]'::json")))
        .where(table.c.workflow_id == Workflow.__table__.c.id)
        .scalar_subquery()
    )


# The run (its columns plus ``task_runs_json`` and ``handoffs_json``: lists of dicts keyed by
# column, in creation order) in one round trip (the detail is read per finished workflow:
# three statements were three round trips for the API and Postgres).
DETAIL_STATEMENT = select(
    Workflow.__table__,
    _rows_as_json(TaskRun.__table__).label("task_runs_json"),
    _rows_as_json(Handoff.__table__).label("handoffs_json"),
).where(Workflow.id == bindparam("id"))


_PSYCOPG: Final = psycopg_dialect.dialect()  # type: ignore[no-untyped-call]


def _psycopg_text(statement: ClauseElement) -> str:
    return str(statement.compile(dialect=_PSYCOPG))


CREATE_SQL: Final = _psycopg_text(CREATE_STATEMENT)
IDEMPOTENT_SQL: Final = _psycopg_text(IDEMPOTENT_STATEMENT)
STATUS_SQL: Final = _psycopg_text(STATUS_STATEMENT)
DETAIL_SQL: Final = _psycopg_text(DETAIL_STATEMENT)
RECENT_EVENTS_SQL: Final = _psycopg_text(RECENT_EVENTS_STATEMENT)
