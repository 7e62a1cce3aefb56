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

import dataclasses
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from psycopg.types.json import Jsonb
from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Uuid,
    bindparam,
    false,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import aggregate_order_by
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.orm import Session
from sqlalchemy.sql import ClauseElement

from orchestrator.contract.vocabulary import DataPlane, Policy, WorkflowStatus
from orchestrator.db import tallies
from orchestrator.db.models import (
    Event,
    Handoff,
    Schedule,
    TaskRun,
    Workflow,
    WorkflowDefinitionVersion,
    WorkflowTag,
)
from orchestrator.db.repository.definitions import workflow_definition_names
from orchestrator.db.repository.paging import Cursor, Keyset, Page, capped_count
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
    "beyond_statement",
    "cancel_workflow",
    "create_many_params",
    "create_params",
    "create_workflow",
    "definition_not_found",
    "ended_among",
    "events_after",
    "get_workflow",
    "list_workflows",
    "page_statement",
    "pause_workflow",
    "retry_workflow",
]


@dataclass(frozen=True)
class WorkflowFilter:
    """Criteria for ``list_workflows``; ``None`` means "any".

    Each criterion is one clause, and each has an index that leads with its column and ends
    with the list's key ``(created_at, id)`` (``db.models.Workflow``), so a page of any one
    filter reads only its rows. A new criterion adds a field, its clause and such an index.
    """

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
            out.extend(_id_prefix(self.id_prefix))
        if self.tags:
            out.append(Workflow.tags.contains(list(self.tags)))
        if self.input_contains is not None:
            out.append(Workflow.input.contains(self.input_contains))
        if self.schedule is not None:
            made_by = select(Schedule.id).where(Schedule.name == self.schedule).scalar_subquery()
            out.append(Workflow.schedule_id == made_by)
        return out

    def by_status_alone(self) -> bool:
        """Whether it filters by status at most: the kept counts then give an exact total."""
        return not any(
            getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "status"
        )


_CANONICAL: Final = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"


def _id_prefix(prefix: str) -> list[ColumnElement[bool]]:
    """Runs whose id's canonical text starts with ``prefix``, as a range of the primary key
    (Postgres orders uuids as their hex digits read left to right): an index range, not a
    cast of every id to text."""
    prefix = prefix.lower()
    if len(prefix) > len(_CANONICAL) or any(
        (ch == "-") != (_CANONICAL[i] == "-") for i, ch in enumerate(prefix)
    ):
        return [false()]  # a hyphen where no id has one (or a digit where ids have one)
    digits = prefix.replace("-", "")
    shift = 4 * (32 - len(digits))
    low = int(digits, 16) << shift if digits else 0
    out = [Workflow.id >= uuid.UUID(int=low)]
    high = (int(digits, 16) + 1) << shift if digits else 1 << 128
    if high < 1 << 128:
        out.append(Workflow.id < uuid.UUID(int=high))
    return out


# One statement (one round trip) for any number of starts: the definition must exist, each run
# and its event are written together. *Why:* starting workflows is the API's hottest write; the
# ORM took four round trips, and starts that arrive together share one statement and one
# commit (``db.async_run_store``). Its parameters are arrays, one element a start
# (``create_many_params``); the API runs it on its event loop (``CREATE_SQL``). A run whose id
# exists already, or whose caller's ``Idempotency-Key`` is taken (by an earlier start, or by one
# before it in the same statement), is left as it is (no row returned, no event): a start sent
# again after its connection dropped does nothing the second time. A run records the
# definition's current version, or its ``version`` when one is asked for (it must exist), and
# its time limit: the start's, else that version's. The definitions' rows are share-locked
# (``FOR KEY SHARE``, which the foreign key's check takes anyway): a delete, which locks its row
# first, then counts these runs or refuses them.
CREATE_STATEMENT = text(
    """
    WITH given AS (
        SELECT * FROM unnest(
            CAST(:ids AS uuid[]), CAST(:definitions AS varchar[]), CAST(:versions AS integer[]),
            CAST(:policies AS workflow_policy[]), CAST(:data_planes AS data_plane[]),
            CAST(:inputs AS jsonb[]), CAST(:retry_ofs AS uuid[]),
            CAST(:started_bys AS varchar[]), CAST(:priorities AS integer[]),
            CAST(:tags AS jsonb[]), CAST(:idempotency_keys AS varchar[]),
            CAST(:request_digests AS varchar[]), CAST(:timeouts AS float8[]),
            CAST(:events AS jsonb[])
        ) WITH ORDINALITY AS g(id, definition, version, policy, data_plane, input, retry_of,
                               started_by, priority, tags, idempotency_key, request_digest,
                               timeout_s, event, n)
    ), w AS (
        INSERT INTO workflows (id, definition, definition_version, status, policy, data_plane,
                               input, retry_of, started_by, priority, tags, idempotency_key,
                               request_digest, timeout_s)
        SELECT g.id, d.name, coalesce(g.version, d.version), 'PENDING', g.policy, g.data_plane,
               g.input, g.retry_of, g.started_by, coalesce(g.priority, d.priority),
               CAST(ARRAY(SELECT jsonb_array_elements_text(g.tags)) AS varchar[]),
               g.idempotency_key, g.request_digest,
               coalesce(g.timeout_s, CASE
                   WHEN g.version IS NULL THEN d.timeout_s
                   ELSE (SELECT v.timeout_s FROM workflow_definition_versions v
                         WHERE v.name = d.name AND v.version = g.version)
               END)
        FROM given g
        JOIN workflow_definitions d ON d.name = g.definition AND d.deleted_at IS NULL
        WHERE g.version IS NULL OR EXISTS (
                SELECT 1 FROM workflow_definition_versions v
                WHERE v.name = d.name AND v.version = g.version)
        ORDER BY g.n
        FOR KEY SHARE OF d
        ON CONFLICT DO NOTHING
        RETURNING *
    ), ev AS (
        INSERT INTO events (workflow_id, kind, data)
        SELECT w.id, 'workflow.created', g.event FROM w JOIN given g ON g.id = w.id
        ORDER BY g.n
    )
    SELECT * FROM w
    """
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
    created: Workflow | None = session.scalars(query, create_many_params([params])).one_or_none()
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
    """One start's values for ``CREATE_STATEMENT`` (``create_many_params``); ``workflow_id``:
    one the caller chose (it
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


# ``create_params``'s keys and the array parameters of ``CREATE_STATEMENT`` they fill.
_ARRAYS: Final = {
    "id": "ids", "definition": "definitions", "version": "versions", "policy": "policies",
    "data_plane": "data_planes", "input": "inputs", "retry_of": "retry_ofs",
    "started_by": "started_bys", "priority": "priorities", "tags": "tags",
    "idempotency_key": "idempotency_keys", "request_digest": "request_digests",
    "timeout_s": "timeouts", "event": "events",
}  # fmt: skip
_JSON: Final = ("input", "tags", "event")


def create_many_params(starts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of ``CREATE_STATEMENT`` for ``starts`` (each ``create_params``'s), in
    their order."""
    return {
        name: [Jsonb(s[key]) if key in _JSON else s[key] for s in starts]
        for key, name in _ARRAYS.items()
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


_NEWEST_FIRST: Final = Keyset(Workflow.created_at, Workflow.id)
_BY_TAG: Final = Keyset(WorkflowTag.created_at, WorkflowTag.workflow_id)


def list_workflows(
    session: Session,
    filters: WorkflowFilter | None = None,
    *,
    limit: int = 50,
    cursor: Cursor | None = None,
    offset: int = 0,
) -> Page[Workflow]:
    """One page of workflows matching ``filters``, newest first, from ``cursor`` (the first
    page without one; ``offset`` skips that many more, for clients that page by offset), with
    the cursors of the pages beside it and the total matching (``paging``)."""
    filters = filters or WorkflowFilter()
    matching, order = _matching(filters)  # (an index may hold all it reads)
    rows = list(session.scalars(page_statement(filters, cursor, limit, offset)))
    more = len(rows) > limit
    rows = rows[:limit]
    if cursor is not None and cursor.newer:
        if not more:  # back at the newest: that is the first page, full
            return list_workflows(session, filters, limit=limit)
        rows.reverse()
        newer: Cursor | None = _place(rows[0], newer=True)
        older = _place(rows[-1])
        older_next = older if order.any_beyond(session, matching, older) else None
    else:
        older_next = _place(rows[-1]) if more else None
        newer = None
        if cursor is not None or offset:
            anchor = _place(rows[0], newer=True) if rows else _flip(cursor)
            if anchor is not None and order.any_beyond(session, matching, anchor):
                newer = anchor
    if filters.by_status_alone():
        counts = tallies.counts(session, "workflows:")
        total = counts.get(filters.status, 0) if filters.status else sum(counts.values())
        exact = True
    elif filters.id_prefix:  # a range of the primary key: counted in it, in its order
        total, exact = capped_count(session, matching)
    else:
        # Counted newest first, along the list's own index: the count reads the newest
        # matches, the rows the pages read (cached), not the oldest pages of the table, which
        # a scan in table order would read first.
        total, exact = capped_count(session, matching.order_by(*order.order(None)))
    return Page(rows, older_next, newer, total, exact)


def _matching(filters: WorkflowFilter) -> tuple[Select[Any], Keyset]:
    """The ids of the runs that match, and the newest-first order to walk them in.

    By tag without a status: the tag's entries in ``workflow_tags``, which hold the runs'
    ``created_at`` in their key, so a page walks the tag's newest entries from the cursor
    (any other criterion tested on each entry's run). With a status, or without a tag: the
    runs, by the index of the criterion (the status's carries the tags)."""
    if filters.tags and filters.status is None:
        first, *others = filters.tags
        clauses = dataclasses.replace(filters, tags=tuple(others)).clauses()
        keys = select(WorkflowTag.workflow_id.label("id")).where(WorkflowTag.tag == first)
        if clauses:
            keys = keys.join(Workflow, Workflow.id == WorkflowTag.workflow_id).where(*clauses)
        return keys, _BY_TAG
    return select(Workflow.id).where(*filters.clauses()), _NEWEST_FIRST


def page_statement(
    filters: WorkflowFilter, cursor: Cursor | None, limit: int, offset: int = 0
) -> Select[Any]:
    """The query of one page (``limit + 1`` rows: the last says whether more follow).

    By a tag, the page's keys first, then their rows: from the tag's entries (``_matching``),
    or with a status from the status's index, which carries the tags and yields the keys by
    itself, testing the tags of each entry as it walks newest first (where the rows' query
    would intersect the tag's and the status's whole sets of runs). Without a tag, the rows
    in one query, from the criterion's index."""
    if not filters.tags:
        matching = select(Workflow).where(*filters.clauses())
        return _NEWEST_FIRST.page_query(matching, cursor, limit, offset)
    keys, order = _matching(filters)
    on_page = select(Workflow).where(
        Workflow.id.in_(select(order.page_query(keys, cursor, limit, offset).subquery().c.id))
    )
    return on_page.order_by(*_NEWEST_FIRST.order(cursor))


def beyond_statement(filters: WorkflowFilter, edge: Cursor) -> Select[Any]:
    """The probe of whether rows match past ``edge`` (a page's place), the way it points."""
    keys, order = _matching(filters)
    return order.beyond_statement(keys, edge)


def _place(row: Workflow, *, newer: bool = False) -> Cursor:
    return Cursor(row.created_at, row.id, newer=newer)


def _flip(cursor: Cursor | None) -> Cursor | None:
    """An empty page's way back: the rows newer than where it was asked from."""
    return None if cursor is None else Cursor(cursor.created_at, cursor.id, newer=True)


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
