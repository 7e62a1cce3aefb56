"""The scheduler's writes to Postgres on the hot path: one statement, one round trip, each.

A task costs the scheduler a report to record and the next step to place. Through the ORM that
was a ``BEGIN``, a ``SELECT``, an ``UPDATE``, two or three ``INSERT``s and a ``COMMIT`` — seven
round trips and the unit of work's Python, ~2/3 of a no-op workflow's latency on our 2-core
machine. Here each event is one SQL statement whose data-modifying CTEs do every write at once,
sent on an autocommit connection (a single statement is its own transaction, so it is atomic)
with ``synchronous_commit=off`` (see ``docs/architecture.md``, *Commits*). The engine's
connections prepare a statement on the server at its second use, so the text is parsed once.

Task run ids are reserved ahead (a block of the table's sequence per round trip) so that the
scheduler can push an instruction *before* it records the task run: the record then overlaps
the worker's run instead of delaying it. Only this loop thread reads this scheduler's reports,
after the record's statement has returned, so a report never finds its row missing.

Only the scheduler's loop thread uses a ``Journal``. Rare paths (resume after a restart, lost
workers, cancellation) stay on the ORM in ``scheduler.py``: clarity there costs nothing.
"""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Final, LiteralString

import psycopg
from psycopg.pq import ExecStatus
from psycopg.types.json import Jsonb
from sqlalchemy import Engine
from sqlalchemy.pool import PoolProxiedConnection

from orchestrator.errors import ServiceError
from orchestrator.messages import Report

__all__ = ["Claimed", "Finish", "Handoff", "Journal", "Placement"]

_FINISHED: Final = ("COMPLETED", "FAILED", "CANCELLED")
ID_BLOCK: Final = 64  # task run ids reserved per round trip


@dataclass(frozen=True)
class Claimed:
    """A workflow this scheduler just claimed (and marked RUNNING), with what planning needs."""

    id: uuid.UUID
    definition: str
    input: dict[str, Any]
    policy: str
    data_plane: str
    steps: list[dict[str, Any]] | None  # the definition's steps; None if it is gone
    task_defs: dict[str, dict[str, Any]]  # the definitions of the tasks those steps name


@dataclass(frozen=True)
class Handoff:
    """A CDI ownership transfer to record beside a task run."""

    from_container: str
    to_container: str
    nbytes: int
    duration_us: float


@dataclass(frozen=True)
class Finish:
    """The end of a workflow: COMPLETED (with its output) or FAILED (with the reason)."""

    workflow_id: uuid.UUID
    status: str
    output: dict[str, Any] | None = None
    result_uri: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Placement:
    """A QUEUED task run to record (and the hand-off that moved its object, if any); its id
    comes from ``Journal.next_task_run_id`` and ``queued_at`` (epoch seconds) is when its
    instruction was pushed."""

    task_run_id: int
    workflow_id: uuid.UUID
    ref: str
    task: str
    attempt: int
    worker: str
    queued_at: float
    handoff: Handoff | None = None


_CLAIM: Final[LiteralString] = """
WITH claimable AS (
    SELECT id FROM workflows
    WHERE status = 'PENDING'
      AND (claimed_by IS NULL OR claimed_at < now() - make_interval(secs => %(reclaim_s)s::float8))
    ORDER BY created_at, id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE workflows w
    SET claimed_by = %(me)s, claimed_at = now(), status = 'RUNNING',
        started_at = coalesce(w.started_at, now())
    FROM claimable c WHERE w.id = c.id
    RETURNING w.id, w.definition, w.definition_version, w.input, w.policy, w.data_plane,
              w.created_at
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT id, 'workflow.running', '{"from": "PENDING", "to": "RUNNING"}'::jsonb FROM claimed
)
SELECT c.id, c.definition, c.input, c.policy::text, c.data_plane::text, d.tasks,
       (SELECT coalesce(jsonb_object_agg(t.name, jsonb_build_object(
                    'module', t.module, 'timeout_s', t.timeout_s, 'retries', t.retries,
                    'retry_backoff_s', t.retry_backoff_s)), '{}'::jsonb)
        FROM task_definitions t
        WHERE t.name IN (SELECT s ->> 'task' FROM jsonb_array_elements(d.tasks) s))
FROM claimed c LEFT JOIN workflow_definition_versions d
    ON d.name = c.definition AND d.version = c.definition_version
ORDER BY c.created_at, c.id
"""

# The next step's task run, and the hand-off that moved its object to the worker.
_PLACE_CTES: Final[LiteralString] = """
nxt AS (
    INSERT INTO task_runs (id, workflow_id, ref, task, attempt, worker_id, status, queued_at)
    SELECT %(p_id)s::bigint, %(p_workflow)s::uuid, %(p_ref)s::text, %(p_task)s::text,
           %(p_attempt)s::int, %(p_worker)s::text, 'QUEUED', to_timestamp(%(p_queued)s::float8)
    WHERE %(place)s::bool
    RETURNING id, workflow_id
), fwd AS (
    INSERT INTO handoffs (workflow_id, task_run_id, from_container, to_container, bytes,
                          duration_us)
    SELECT workflow_id, id, %(f_from)s::text, %(f_to)s::text, %(f_bytes)s::bigint,
           %(f_us)s::float8
    FROM nxt WHERE %(f_moved)s::bool
)
"""

_PLACE: Final[LiteralString] = "WITH " + _PLACE_CTES + "SELECT count(*) FROM nxt"

_RESERVE: Final[LiteralString] = (
    "SELECT nextval(pg_get_serial_sequence('task_runs', 'id')) FROM generate_series(1, %(n)s)"
)

# The end of a workflow (unless it has already ended: a user cancelled it meanwhile).
_FINISH_CTES: Final[LiteralString] = """
fprev AS (
    SELECT id, status FROM workflows WHERE id = %(fin_id)s::uuid AND %(finish)s::bool
    FOR UPDATE
), fin AS (
    UPDATE workflows w
    SET status = %(fin_status)s::workflow_status, finished_at = now(),
        output = coalesce(%(fin_output)s::jsonb, w.output),
        result_uri = coalesce(%(fin_result_uri)s::text, w.result_uri),
        error = coalesce(%(fin_error)s::text, w.error)
    FROM fprev p
    WHERE w.id = p.id AND p.status NOT IN ('COMPLETED', 'FAILED', 'CANCELLED')
    RETURNING w.id, p.status::text AS prev
), fin_ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT id, %(fin_kind)s::text, jsonb_strip_nulls(jsonb_build_object(
        'from', prev, 'to', %(fin_status)s::text, 'error', %(fin_error)s::text))
    FROM fin
)
"""

_FINISH: Final[LiteralString] = "WITH " + _FINISH_CTES + "SELECT count(*) FROM fin"

_REPORT: Final[LiteralString] = (
    """
WITH rep AS (
    UPDATE task_runs SET
        status = %(status)s::task_run_status,
        worker_id = %(worker)s,
        started_at = to_timestamp(%(started)s::float8),
        finished_at = to_timestamp(%(finished)s::float8),
        queue_wait_ms = greatest(0.0,
            (%(started)s::float8 - extract(epoch FROM queued_at)::float8) * 1000.0),
        run_ms = %(run_ms)s,
        cpu_ms = %(cpu_ms)s,
        bytes_in = %(bytes_in)s,
        bytes_out = %(bytes_out)s,
        output = %(output)s,
        error = %(error)s
    WHERE id = %(task_run_id)s
    RETURNING workflow_id, ref, attempt
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT workflow_id, %(kind)s::text, jsonb_build_object(
        'ref', ref, 'attempt', attempt, 'worker', %(worker)s::text, 'error', %(error_text)s::text)
    FROM rep
), back AS (
    INSERT INTO handoffs (workflow_id, task_run_id, from_container, to_container, bytes,
                          duration_us)
    SELECT workflow_id, %(task_run_id)s::bigint, %(b_from)s::text, %(b_to)s::text,
           %(b_bytes)s::bigint, %(b_us)s::float8
    FROM rep WHERE %(b_moved)s::bool
),"""
    + _PLACE_CTES
    + ","
    + _FINISH_CTES
    + "SELECT count(*) FROM fin"  # every data-modifying CTE runs, read or not
)


class Journal:
    """Records claims, reports, placements and endings, one round trip each."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pooled: PoolProxiedConnection | None = None
        self._ids: deque[int] = deque()

    def close(self) -> None:
        if self._pooled is not None:
            pooled, self._pooled = self._pooled, None
            pooled.invalidate()  # autocommit was changed: never hand it back to the pool

    # ------------------------------------------------------------------ statements
    def claim(self, scheduler_id: str, limit: int, reclaim_after_s: float) -> list[Claimed]:
        """Take up to ``limit`` PENDING workflows, oldest first, and mark them RUNNING.

        ``FOR UPDATE SKIP LOCKED`` makes concurrent schedulers skip each other's rows, so no
        workflow is claimed twice; a claim older than ``reclaim_after_s`` is taken over.
        """
        rows = self._run(_CLAIM, {"me": scheduler_id, "limit": limit, "reclaim_s": reclaim_after_s})
        return [
            Claimed(
                id=row[0],
                definition=row[1],
                input=row[2] or {},
                policy=row[3],
                data_plane=row[4],
                steps=row[5],
                task_defs=row[6] or {},
            )
            for row in rows
        ]

    def next_task_run_id(self) -> int:
        """A task run id nobody else gets (reserved from the table's sequence in blocks)."""
        if not self._ids:
            self._ids.extend(int(row[0]) for row in self._run(_RESERVE, {"n": ID_BLOCK}))
        return self._ids.popleft()

    def place(self, placement: Placement) -> None:
        """Record a QUEUED task run."""
        self._run(_PLACE, _placement_params(placement))

    def report(
        self,
        report: Report,
        back: Handoff | None,
        placement: Placement | None,
        finish: Finish | None = None,
    ) -> bool:
        """Record ``report`` (and the hand-back of its object), place the next step or end the
        workflow, in one transaction; whether ``finish`` ended the workflow (False: it had
        ended already)."""
        params = {
            "task_run_id": report.task_run_id,
            "status": report.status,
            "worker": report.worker_id,
            "started": float(report.started_at),
            "finished": float(report.finished_at),
            "run_ms": max(0.0, (report.finished_at - report.started_at) * 1000.0),
            "cpu_ms": report.cpu_ms,
            "bytes_in": report.bytes_in,
            "bytes_out": report.bytes_out,
            "output": Jsonb(report.output) if report.output else None,
            "error": report.error or None,
            "error_text": report.error,
            "kind": f"task.{report.status.lower()}",
            **_handoff_params("b", back),
            **_placement_params(placement),
            **_finish_params(finish),
        }
        return bool(self._run(_REPORT, params)[0][0])

    def finish(self, finish: Finish) -> bool:
        """End a workflow; False if it had already ended (a user cancelled it meanwhile)."""
        rows = self._run(_FINISH, _finish_params(finish))
        return bool(rows and rows[0][0])

    # ------------------------------------------------------------------ connection
    def _run(self, sql: LiteralString, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        conn = self._connection()
        try:
            with conn.cursor() as cur:
                cur.execute(sql, params)
                # The result's status, not ``cur.description``: that builds a Column per field
                # on every call (3 % of the scheduler's GIL samples at 10 KB, py-spy).
                result = cur.pgresult
                return cur.fetchall() if result and result.status == ExecStatus.TUPLES_OK else []
        except psycopg.OperationalError as exc:
            self.close()  # the next call reconnects
            raise ServiceError(
                f"Postgres failed the scheduler's write: {exc}", service="postgres"
            ) from exc

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._pooled is None:
            self._pooled = self._engine.raw_connection()
            driver = self._pooled.driver_connection
            assert isinstance(driver, psycopg.Connection)
            driver.rollback()  # autocommit can change only outside a transaction
            driver.autocommit = True
        driver = self._pooled.driver_connection
        assert isinstance(driver, psycopg.Connection)
        return driver


def _handoff_params(prefix: str, handoff: Handoff | None) -> dict[str, Any]:
    return {
        f"{prefix}_moved": handoff is not None,
        f"{prefix}_from": handoff.from_container if handoff else None,
        f"{prefix}_to": handoff.to_container if handoff else None,
        f"{prefix}_bytes": handoff.nbytes if handoff else None,
        f"{prefix}_us": float(handoff.duration_us) if handoff else None,
    }


def _finish_params(finish: Finish | None) -> dict[str, Any]:
    assert finish is None or finish.status in _FINISHED
    return {
        "finish": finish is not None,
        "fin_id": finish.workflow_id if finish else None,
        "fin_status": finish.status if finish else None,
        "fin_kind": f"workflow.{finish.status.lower()}" if finish else None,
        "fin_output": Jsonb(finish.output) if finish and finish.output is not None else None,
        "fin_result_uri": finish.result_uri if finish else None,
        "fin_error": finish.error if finish else None,
    }


def _placement_params(placement: Placement | None) -> dict[str, Any]:
    return {
        "place": placement is not None,
        "p_id": placement.task_run_id if placement else None,
        "p_queued": placement.queued_at if placement else None,
        "p_workflow": placement.workflow_id if placement else None,
        "p_ref": placement.ref if placement else None,
        "p_task": placement.task if placement else None,
        "p_attempt": placement.attempt if placement else None,
        "p_worker": placement.worker if placement else None,
        **_handoff_params("f", placement.handoff if placement else None),
    }
