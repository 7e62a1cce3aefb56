"""The statements retention runs: which finished runs a definition's policy lets go, their
archive lines, their result URIs, and the deletion of a batch with its task runs, hand-offs,
events and webhook deliveries (a run's ``Idempotency-Key`` is a column of its row: it goes
with it).

A batch is one transaction: its runs are locked (``FOR UPDATE SKIP LOCKED``: a retry reading
one of them is never waited for, two pruners never take the same run), archived and their
results deleted if the policy says so, then deleted in one statement. The children go first,
in that statement (what the foreign keys would cascade to row by row), with the run's webhook
deliveries that are done (DELIVERED or FAILED; a PENDING one stays, to be sent), and the
retries that name a pruned run lose the link; the counts by status follow by the tables'
triggers, and the runs pruned and archived are counted (``db.tallies``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY, UUID

from orchestrator.contract.vocabulary import ResultRetention, WorkflowStatus

__all__ = [
    "LOCK",
    "DefinitionPolicy",
    "Victim",
    "archive_lines",
    "delete_batch",
    "policies",
    "record_pass",
    "result_uris",
    "take_batch",
]

LOCK: Final = 0x6364_6966_7072_756E  # "cdifprun": one batch at a time across API replicas
# The statuses a run may be pruned in: those that never change again.
_ENDED: Final = ", ".join(sorted(f"'{s}'" for s in WorkflowStatus if s.finished))

_POLICIES: Final = text(
    "SELECT name, retention_days, retention_results::text FROM workflow_definitions ORDER BY name"
)

# The oldest runs of a definition that ended before the cutoff (``ix_workflows_definition_
# finished_at``), locked for this transaction.
_TAKE: Final = text(
    f"""
    SELECT id, finished_at FROM workflows
    WHERE definition = :definition AND finished_at IS NOT NULL AND finished_at < :cutoff
      AND status IN ({_ENDED})
    ORDER BY finished_at, id
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
    """
)

_IDS = bindparam("ids", type_=ARRAY(UUID(as_uuid=True)))

# One JSON line per run: the run, its task runs, hand-offs, events and webhook deliveries, as
# stored. Built as text (``row_to_json`` joined by ``string_agg``; ``concat`` drops a NULL, so
# no rows make ``[]``): no ``jsonb`` value is built only to be printed, and the line has no
# line breaks (``json_agg`` puts one between elements; every JSON column is ``jsonb``, whose
# text has none).
_ARCHIVE: Final = text(
    """
    SELECT concat(
        '{"workflow":', row_to_json(w),
        ',"task_runs":[', (SELECT string_agg(row_to_json(t)::text, ',' ORDER BY t.id)
                       FROM task_runs t WHERE t.workflow_id = w.id), ']',
        ',"handoffs":[', (SELECT string_agg(row_to_json(h)::text, ',' ORDER BY h.id)
                       FROM handoffs h WHERE h.workflow_id = w.id), ']',
        ',"events":[', (SELECT string_agg(row_to_json(e)::text, ',' ORDER BY e.id)
                       FROM events e WHERE e.workflow_id = w.id), ']',
        ',"deliveries":[', (SELECT string_agg(row_to_json(d)::text, ',' ORDER BY d.id)
                       FROM webhook_deliveries d WHERE d.workflow_id = w.id), ']',
        '}')
    FROM workflows w WHERE w.id = ANY(:ids) ORDER BY w.finished_at, w.id
    """
).bindparams(_IDS)

# Every S3 URI the runs name as a result, with the run: the image result, and the named
# results of the run's output and of its task runs.
_RESULTS: Final = text(
    """
    SELECT id, result_uri FROM workflows WHERE id = ANY(:ids) AND result_uri IS NOT NULL
    UNION
    SELECT w.id, u #>> '{}' FROM workflows w,
        jsonb_path_query(coalesce(w.output -> 'results', '{}'::jsonb), 'strict $.**') u
    WHERE w.id = ANY(:ids) AND jsonb_typeof(u) = 'string'
    UNION
    SELECT t.workflow_id, u #>> '{}' FROM task_runs t,
        jsonb_path_query(coalesce(t.data -> 'results', '{}'::jsonb), 'strict $.**') u
    WHERE t.workflow_id = ANY(:ids) AND jsonb_typeof(u) = 'string'
    """
).bindparams(_IDS)

_DELETE: Final = text(
    f"""
    WITH ev AS (DELETE FROM events WHERE workflow_id = ANY(:ids)),
    ho AS (DELETE FROM handoffs WHERE workflow_id = ANY(:ids)),
    tr AS (DELETE FROM task_runs WHERE workflow_id = ANY(:ids)),
    dl AS (DELETE FROM webhook_deliveries WHERE workflow_id = ANY(:ids) AND status <> 'PENDING'),
    unlinked AS (UPDATE workflows SET retry_of = NULL
                 WHERE retry_of = ANY(:ids) AND NOT (id = ANY(:ids))),
    gone AS (
        DELETE FROM workflows WHERE id = ANY(:ids)
          AND status IN ({_ENDED})
        RETURNING id
    ), counted AS (
        INSERT INTO tally_deltas (minute, series, bucket, n)
        SELECT m, s, -1, k FROM (SELECT count(*) AS k FROM gone) g,
            (VALUES ('-infinity'::timestamptz, 'pruned'),
                    ('-infinity'::timestamptz, 'archived')) v(m, s)
        WHERE g.k > 0 AND (s = 'pruned' OR :archived)
    )
    SELECT count(*) FROM gone
    """
).bindparams(_IDS)

# The last pass: when, what it pruned, and what failed in it (null: nothing).
_RECORD: Final = text(
    """
    INSERT INTO retention_state (id, pass_at, pass_pruned, pass_seconds, error, error_at)
    VALUES (1, now(), :pruned, :seconds, CAST(:error AS text),
            CASE WHEN CAST(:error AS text) IS NULL THEN NULL ELSE now() END)
    ON CONFLICT (id) DO UPDATE SET
        pass_at = excluded.pass_at, pass_pruned = excluded.pass_pruned,
        pass_seconds = excluded.pass_seconds, error = excluded.error,
        error_at = excluded.error_at
    """
)


@dataclass(frozen=True)
class DefinitionPolicy:
    """A definition's own retention (``None``: the default)."""

    name: str
    days: int | None
    results: ResultRetention | None


@dataclass(frozen=True)
class Victim:
    id: uuid.UUID
    finished_at: datetime


def policies(conn: Connection) -> list[DefinitionPolicy]:
    """Every definition (deleted ones too: their runs are on record) and its own policy."""
    return [
        DefinitionPolicy(str(name), days, None if results is None else ResultRetention(results))
        for name, days, results in conn.execute(_POLICIES)
    ]


def take_batch(conn: Connection, definition: str, cutoff: datetime, limit: int) -> list[Victim]:
    rows = conn.execute(_TAKE, {"definition": definition, "cutoff": cutoff, "limit": limit})
    return [Victim(row[0], row[1]) for row in rows]


def archive_lines(conn: Connection, ids: Sequence[uuid.UUID]) -> list[str]:
    return [str(row[0]) for row in conn.execute(_ARCHIVE, {"ids": list(ids)})]


def result_uris(conn: Connection, ids: Sequence[uuid.UUID], results: str) -> list[str]:
    """The results the runs stored: URIs under the ``results`` prefix named after the run
    (``<results><id>.png``, ``<results><id>/<step>.<output>``), whatever else a task's
    output says."""
    found = set()
    for run_id, uri in conn.execute(_RESULTS, {"ids": list(ids)}):
        if str(uri).startswith(f"{results}{run_id}"):
            found.add(str(uri))
    return sorted(found)


def delete_batch(conn: Connection, ids: Sequence[uuid.UUID], *, archived: bool) -> int:
    """Delete the runs (finished ones only) and everything that names them; how many went."""
    return int(conn.execute(_DELETE, {"ids": list(ids), "archived": archived}).scalar_one())


def record_pass(conn: Connection, pruned: int, seconds: float, error: str | None) -> None:
    conn.execute(_RECORD, {"pruned": pruned, "seconds": seconds, "error": error})
