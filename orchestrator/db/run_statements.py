"""The statements that carry a workflow run through its life: claim, place a step, record a
report, end, and a scheduler's resumption after a restart. One SQL statement each.

A task costs the scheduler a report to record and the next step to place. Through the ORM that
was a ``BEGIN``, a ``SELECT``, an ``UPDATE``, two or three ``INSERT``s and a ``COMMIT`` — seven
round trips and the unit of work's Python, most of a no-op workflow's latency on a 2-core
machine. Here each event is one statement whose data-modifying CTEs do every write at once (the
reports of a scheduler's loop turn: one statement for them all, ``REPORTS``), so it is atomic
without a transaction around it (``SchedulerStore`` sends them on an autocommit
connection; see ``docs/architecture.md``, *Commits*). The ending (``FINISH``) is also how the
API cancels a run, inside its request's transaction.

The text is psycopg's (``%(name)s`` parameters): the scheduler's connection runs it as it is,
and a SQLAlchemy connection through ``exec_driver_sql``. The dataclasses are what the
statements take and return.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, LiteralString

from psycopg.types.json import Jsonb

from orchestrator.contract.messages import Report
from orchestrator.contract.vocabulary import DataPlane, Policy, TaskRunStatus, WorkflowStatus

__all__ = [
    "CLAIM",
    "CLAIM_LIMITED",
    "CLAIM_LOCK",
    "FINISH",
    "LATE_REPORT",
    "LOST",
    "PLACE",
    "REPORTS",
    "RESERVE_IDS",
    "RESUME",
    "UNQUEUE",
    "WAITING",
    "Claimed",
    "Finish",
    "Handoff",
    "Placement",
    "Reported",
    "claimed_from_row",
    "finish_params",
    "placement_params",
    "reports_params",
]


@dataclass(frozen=True)
class Claimed:
    """A workflow a scheduler holds (just claimed, or resumed), with what planning needs."""

    id: uuid.UUID
    definition: str
    input: dict[str, Any]
    policy: Policy
    data_plane: DataPlane
    steps: list[dict[str, Any]] | None  # the definition's steps; None if it is gone
    task_defs: dict[str, dict[str, Any]]  # the definitions of the tasks those steps name
    # The last attempt Postgres has of each step (empty for a run never placed): a run that
    # ran before (resumed, taken over) goes on from there, never repeating an attempt number.
    attempts: dict[str, int] = field(default_factory=dict)
    priority: int = 0  # its steps that wait for a worker are placed highest first
    paused: bool = False  # its next steps wait until it is resumed
    timeout_s: float | None = None  # the run's time limit, from ``started_at``
    started_at: float | None = None  # unix seconds: when it was first claimed
    worker_wait_s: float | None = None  # its version's limit on a step's wait for a worker


@dataclass(frozen=True)
class Handoff:
    """A CDI hand-off to record beside a task run: a transfer of ownership, a read-only share,
    or a copy for a reader on another host."""

    from_container: str
    to_container: str
    nbytes: int
    duration_us: float
    from_host: str = ""  # the containers' CDI hosts ("": unknown)
    to_host: str = ""
    datum: str = ""  # "<step run>.<output>" that moved
    mode: str = "transfer"  # transfer, share or copy
    task_run_id: int | None = None  # default: the task run it is recorded with
    workflow_id: uuid.UUID | None = None  # default: that task run's workflow


@dataclass(frozen=True)
class Finish:
    """The end of a workflow: COMPLETED (with its output), FAILED, CANCELLED or TIMED_OUT
    (with the reason, and the steps under way then)."""

    workflow_id: uuid.UUID
    status: WorkflowStatus  # a finished one
    output: dict[str, Any] | None = None
    result_uri: str | None = None
    error: str | None = None
    steps: tuple[str, ...] = ()


@dataclass(frozen=True)
class Placement:
    """A task run to record: QUEUED (and the hand-offs that moved its objects), or one that
    ended without a worker: SKIPPED, or a switch COMPLETED with its choice as ``output``. Its
    id was reserved with ``RESERVE_IDS``; ``queued_at`` (epoch seconds) is when its
    instruction was pushed (or when it ended)."""

    task_run_id: int
    workflow_id: uuid.UUID
    ref: str
    task: str
    attempt: int
    worker: str | None
    queued_at: float
    handoffs: tuple[Handoff, ...] = ()
    status: TaskRunStatus = TaskRunStatus.QUEUED
    output: dict[str, Any] | None = None
    data: dict[str, Any] | None = None  # what it reads: {"reads": {name: datum}}


# A held run and what planning it needs: the steps of its definition's version (the one it was
# started with: a version saved since changes no run already started) and the tasks they name,
# and the last attempt of each step already recorded (one probe of the (workflow_id, ref,
# attempt) key's index; none for a new run).
# ``source`` is a CTE of workflow rows (id, definition, definition_version, input, policy,
# data_plane, created_at, priority, paused_at, timeout_s, started_at).
_PLAN_HEAD: Final[LiteralString] = """
SELECT c.id, c.definition, c.input, c.policy::text, c.data_plane::text, d.tasks,
       (SELECT coalesce(jsonb_object_agg(t.name, jsonb_build_object(
                    'module', t.module, 'timeout_s', t.timeout_s, 'retries', t.retries,
                    'retry_backoff_s', t.retry_backoff_s, 'max_concurrency', t.max_concurrency
                )), '{}'::jsonb)
        FROM task_definitions t
        WHERE t.name IN (SELECT s ->> 'task' FROM jsonb_array_elements(d.tasks) s)),
       (SELECT coalesce(jsonb_object_agg(a.ref, a.n), '{}'::jsonb)
        FROM (SELECT ref, max(attempt) AS n FROM task_runs r WHERE r.workflow_id = c.id
              GROUP BY ref) a),
       c.priority, c.paused_at IS NOT NULL,
       c.timeout_s, extract(epoch FROM c.started_at)::float8, d.worker_wait_s
FROM """
_PLAN_TAIL: Final[LiteralString] = """ c LEFT JOIN workflow_definition_versions d
    ON d.name = c.definition AND d.version = c.definition_version
ORDER BY c.priority DESC, c.created_at, c.id
"""

# A PENDING run a scheduler may take: not paused, its definition's queue not paused, and not
# claimed by a scheduler that is still on it (a claim older than ``reclaim_s``: it died).
_CLAIMABLE: Final[LiteralString] = """
w.status = 'PENDING' AND w.paused_at IS NULL
  AND (w.claimed_by IS NULL OR w.claimed_at < now() - make_interval(secs => %(reclaim_s)s::float8))
"""

# Mark the claimable rows RUNNING (with their event) and read what planning needs.
_CLAIM_TAIL: Final[LiteralString] = (
    """, claimed AS (
    UPDATE workflows w
    SET claimed_by = %(me)s, claimed_at = now(), status = 'RUNNING',
        started_at = coalesce(w.started_at, now())
    FROM claimable c WHERE w.id = c.id
    RETURNING w.id, w.definition, w.definition_version, w.input, w.policy, w.data_plane,
              w.created_at, w.priority, w.paused_at, w.timeout_s, w.started_at
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT id, 'workflow.running', '{"from": "PENDING", "to": "RUNNING"}'::jsonb FROM claimed
)"""
    + _PLAN_HEAD
    + "claimed"
    + _PLAN_TAIL
)

# Take up to ``limit`` PENDING workflows, highest priority first, oldest first within a
# priority, and mark them RUNNING. ``FOR UPDATE SKIP LOCKED`` makes concurrent schedulers skip
# each other's rows, so no workflow is claimed twice. A locking CTE is always materialised, so
# the LIMIT applies once. Runs of a definition with a concurrency limit are left to
# ``CLAIM_LIMITED``, which counts.
CLAIM: Final[LiteralString] = (
    """
WITH claimable AS (
    SELECT w.id FROM workflows w
    WHERE """
    + _CLAIMABLE
    + """
      AND NOT EXISTS (SELECT 1 FROM workflow_definitions d
                      WHERE d.name = w.definition
                        AND (d.paused_at IS NOT NULL OR d.max_concurrent_runs IS NOT NULL))
    ORDER BY w.priority DESC, w.created_at, w.id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)"""
    + _CLAIM_TAIL
)

# Every scheduler's ``CLAIM_LIMITED`` runs under this transaction-level advisory lock, taken in
# a statement before it: its count of a definition's RUNNING runs then sees every claim
# committed before it (a statement's snapshot is taken when it starts), so two schedulers can
# never both fill the same free place.
CLAIM_LOCK: Final[LiteralString] = "SELECT pg_advisory_xact_lock(%(cls)s, %(key)s)"

# ``CLAIM`` for every definition, those with a ``max_concurrent_runs`` included: of each such
# definition no more of its PENDING runs (in priority order) than it has free places; the
# priority order is over all claimable runs alike.
CLAIM_LIMITED: Final[LiteralString] = (
    """
WITH lim AS (
    SELECT d.name, d.max_concurrent_runs - (SELECT count(*) FROM workflows r
                                            WHERE r.definition = d.name
                                              AND r.status = 'RUNNING') AS free
    FROM workflow_definitions d
    WHERE d.max_concurrent_runs IS NOT NULL AND d.paused_at IS NULL
), ranked AS (
    SELECT w.id, w.definition,
           row_number() OVER (PARTITION BY w.definition
                              ORDER BY w.priority DESC, w.created_at, w.id) AS n
    FROM workflows w
    WHERE """
    + _CLAIMABLE
    + """ AND w.definition IN (SELECT name FROM lim)
), within AS (
    SELECT r.id FROM ranked r JOIN lim l ON l.name = r.definition WHERE r.n <= l.free
), claimable AS (
    SELECT w.id FROM workflows w
    WHERE """
    + _CLAIMABLE
    + """
      AND NOT EXISTS (SELECT 1 FROM workflow_definitions d
                      WHERE d.name = w.definition AND d.paused_at IS NOT NULL)
      AND (w.definition NOT IN (SELECT name FROM lim) OR w.id IN (SELECT id FROM within))
    ORDER BY w.priority DESC, w.created_at, w.id
    LIMIT %(limit)s
    FOR UPDATE OF w SKIP LOCKED
)"""
    + _CLAIM_TAIL
)

# Whether any definition has a concurrency limit (then claims go through ``CLAIM_LIMITED``).
LIMITS_EXIST: Final[LiteralString] = (
    "SELECT EXISTS (SELECT 1 FROM workflow_definitions "
    "WHERE max_concurrent_runs IS NOT NULL AND deleted_at IS NULL)"
)

# A scheduler's RUNNING workflows that it runs no more in memory (it restarted; a write of its
# was lost; it took them over from a dead scheduler): their open task runs fail with the
# reason, and they start over from their input.
RESUME: Final[LiteralString] = (
    """
WITH mine AS (
    SELECT id, definition, definition_version, input, policy, data_plane, created_at, priority,
           paused_at, timeout_s, started_at
    FROM workflows
    WHERE status = 'RUNNING' AND claimed_by = %(me)s AND NOT (id = ANY(%(running)s::uuid[]))
    FOR UPDATE
), failed AS (
    UPDATE task_runs t SET status = 'FAILED', error = %(reason)s::text
    FROM mine m WHERE t.workflow_id = m.id AND t.status IN ('QUEUED', 'RUNNING')
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT id, 'workflow.resumed',
           jsonb_build_object('scheduler', %(me)s::text, 'reason', %(reason)s::text)
    FROM mine
)"""
    + _PLAN_HEAD
    + "mine"
    + _PLAN_TAIL
)

# Task run ids reserved ahead, so that an instruction goes out before its task run is recorded.
RESERVE_IDS: Final[LiteralString] = (
    "SELECT nextval(pg_get_serial_sequence('task_runs', 'id')) FROM generate_series(1, %(n)s)"
)

# Task runs placed (or ended without a worker: skipped, a switch), and every hand-off: those
# that moved the placed runs' objects and those that came back with a report. Arrays, one
# element a row, so a report that starts several steps is still one statement.
_PLACE_CTES: Final[LiteralString] = """
nxt AS (
    INSERT INTO task_runs (id, workflow_id, ref, task, attempt, worker_id, status, queued_at,
                           started_at, finished_at, output, data)
    SELECT p.id, p.workflow, p.ref, p.task, p.attempt, p.worker, p.status::task_run_status,
           to_timestamp(p.queued),
           CASE WHEN p.status <> 'QUEUED' THEN to_timestamp(p.queued) END,
           CASE WHEN p.status <> 'QUEUED' THEN to_timestamp(p.queued) END,
           p.output, p.data
    FROM unnest(%(p_ids)s::bigint[], %(p_workflows)s::uuid[], %(p_refs)s::text[],
                %(p_tasks)s::text[], %(p_attempts)s::int[], %(p_workers)s::text[],
                %(p_statuses)s::text[], %(p_queued)s::float8[], %(p_outputs)s::jsonb[],
                %(p_data)s::jsonb[])
         AS p(id, workflow, ref, task, attempt, worker, status, queued, output, data)
    RETURNING id
), moved AS (
    INSERT INTO handoffs (workflow_id, task_run_id, from_container, to_container, bytes,
                          duration_us, from_host, to_host, datum, mode)
    SELECT h.workflow, h.run, h.src, h.dst, h.nbytes, h.us, h.src_host, h.dst_host, h.datum,
           h.mode
    FROM unnest(%(h_workflows)s::uuid[], %(h_runs)s::bigint[], %(h_from)s::text[],
                %(h_to)s::text[], %(h_bytes)s::bigint[], %(h_us)s::float8[],
                %(h_from_hosts)s::text[], %(h_to_hosts)s::text[], %(h_datums)s::text[],
                %(h_modes)s::text[])
         AS h(workflow, run, src, dst, nbytes, us, src_host, dst_host, datum, mode)
)
"""

PLACE: Final[LiteralString] = "WITH " + _PLACE_CTES + "SELECT count(*) FROM nxt"

# The end of a workflow, unless it has ended already (a user cancelled it meanwhile, or the
# scheduler ended it before the cancel): then nothing changes and no row is counted. What it
# waited for no longer applies. The webhooks that asked to be told of such an end get a
# delivery to send, written with the end itself (``orchestrator.notify``): an end is never told
# twice nor lost.
_FINISH_CTES: Final[LiteralString] = """
fprev AS (
    SELECT id, status FROM workflows WHERE id = %(fin_id)s::uuid AND %(finish)s::bool
    FOR UPDATE
), fin AS (
    UPDATE workflows w
    SET status = %(fin_status)s::workflow_status, finished_at = now(), status_detail = NULL,
        output = coalesce(%(fin_output)s::jsonb, w.output),
        result_uri = coalesce(%(fin_result_uri)s::text, w.result_uri),
        error = coalesce(%(fin_error)s::text, w.error)
    FROM fprev p
    WHERE w.id = p.id AND p.status IN ('PENDING', 'RUNNING')
    RETURNING w.id, p.status::text AS prev, w.definition, w.definition_version, w.error,
              w.result_uri, w.tags, w.started_by, w.created_at, w.started_at, w.finished_at
), fin_hooks AS (
    INSERT INTO webhook_deliveries (webhook_id, event, workflow_id, payload, status)
    SELECT h.id, %(fin_kind)s::text, f.id, jsonb_build_object(
        'type', %(fin_kind)s::text, 'timestamp', now(), 'data', jsonb_build_object(
            'workflow_id', f.id, 'workflow', f.definition,
            'workflow_version', f.definition_version, 'status', %(fin_status)s::text,
            'error', f.error, 'result_uri', f.result_uri, 'tags', to_jsonb(f.tags),
            'started_by', f.started_by, 'created_at', f.created_at,
            'started_at', f.started_at, 'finished_at', f.finished_at)), 'PENDING'
    FROM fin f
    JOIN webhooks h ON %(fin_kind)s::text = ANY(h.events)
                   AND (h.definition IS NULL OR h.definition = f.definition)
)
"""
# The ending's event: the states, the reason, and the steps under way when it came.
_FINISH_EVENT: Final[LiteralString] = """
    SELECT id, %(fin_kind)s::text, jsonb_strip_nulls(jsonb_build_object(
        'from', prev, 'to', %(fin_status)s::text, 'error', %(fin_error)s::text,
        'steps', %(fin_steps)s::jsonb))
    FROM fin"""

FINISH: Final[LiteralString] = (
    "WITH "
    + _FINISH_CTES
    + ", fin_ev AS (INSERT INTO events (workflow_id, kind, data)"
    + _FINISH_EVENT
    + ") SELECT count(*) FROM fin"
)


# Workers' reports on task runs (and the hand-back of their objects, and the deliveries of
# the webhooks that follow steps), together with the next steps' placements and the ends of
# workflows: a loop turn's reports in one statement, one element of each array a report (its
# position in the batch ``n``, from 1). Their events go in with one insert, in the reports'
# order, each report's task event before the end it brought; the webhook deliveries likewise.
# *Why one insert:* the sub-statements of a WITH run in no set order, and two inserts gave an
# end an id (the order clients read events in) before its task's.
def _report_cte(only_open: LiteralString) -> LiteralString:
    """The ``rep`` CTE: the task runs' outcomes (``only_open``: a condition added to its
    WHERE)."""
    return (
        """
rep AS (
    UPDATE task_runs t SET
        status = r.status::task_run_status,
        worker_id = r.worker,
        started_at = to_timestamp(r.started),
        finished_at = to_timestamp(r.finished),
        queue_wait_ms = greatest(0.0,
            (r.started - extract(epoch FROM t.queued_at)::float8) * 1000.0),
        run_ms = r.run_ms,
        cpu_ms = r.cpu_ms,
        bytes_in = r.bytes_in,
        bytes_out = r.bytes_out,
        output = r.output,
        error = nullif(r.error, ''),
        traceback = nullif(r.traceback, ''),
        data = CASE WHEN r.data IS NULL THEN t.data
                    ELSE coalesce(t.data, '{}'::jsonb) || r.data END
    FROM unnest(%(r_ids)s::bigint[], %(r_statuses)s::text[], %(r_workers)s::text[],
                %(r_started)s::float8[], %(r_finished)s::float8[], %(r_run_ms)s::float8[],
                %(r_cpu_ms)s::float8[], %(r_bytes_in)s::bigint[], %(r_bytes_out)s::bigint[],
                %(r_outputs)s::jsonb[], %(r_errors)s::text[], %(r_tracebacks)s::text[],
                %(r_data)s::jsonb[]) WITH ORDINALITY
         AS r(id, status, worker, started, finished, run_ms, cpu_ms, bytes_in, bytes_out,
              output, error, traceback, data, n)
    WHERE t.id = r.id"""
        + only_open
        + """
    RETURNING t.workflow_id, t.ref, t.attempt, t.task, r.n, r.status, r.worker, r.error,
              'task.' || lower(r.status) AS kind
)"""
    )


# The deliveries of the webhooks that follow a report's step (``o``: their order).
_REPORT_HOOKS: Final[LiteralString] = """
    SELECT 2 * r.n AS o, h.id AS hook, r.kind, r.workflow_id, jsonb_build_object(
        'type', r.kind, 'timestamp', now(), 'data', jsonb_build_object(
            'workflow_id', r.workflow_id, 'workflow', w.definition, 'step', r.ref,
            'task', r.task, 'attempt', r.attempt, 'status', r.status,
            'worker', r.worker, 'error', r.error)) AS payload
    FROM rep r
    JOIN webhooks h ON r.kind = ANY(h.events)
    JOIN workflows w ON w.id = r.workflow_id
    WHERE h.definition IS NULL OR h.definition = w.definition"""
# A report's task event.
_REPORT_EVENT: Final[LiteralString] = """
    SELECT 2 * n AS o, workflow_id, kind, jsonb_build_object(
        'ref', ref, 'attempt', attempt, 'worker', worker, 'error', error) AS data
    FROM rep"""

# The ends of workflows that reports brought (``f_n``: the report's ``n``), each unless the
# run has ended already (a user cancelled it meanwhile): ``FINISH``'s, for several runs.
_ENDS_CTES: Final[LiteralString] = """
ends AS (
    SELECT * FROM unnest(%(f_ids)s::uuid[], %(f_n)s::bigint[], %(f_statuses)s::text[],
                         %(f_outputs)s::jsonb[], %(f_result_uris)s::text[],
                         %(f_errors)s::text[], %(f_steps)s::jsonb[])
        AS f(id, n, status, output, result_uri, error, steps)
), eprev AS (
    SELECT id, status FROM workflows WHERE id = ANY(%(f_ids)s::uuid[]) FOR UPDATE
), ended AS (
    UPDATE workflows w
    SET status = f.status::workflow_status, finished_at = now(), status_detail = NULL,
        output = coalesce(f.output, w.output),
        result_uri = coalesce(f.result_uri, w.result_uri),
        error = coalesce(f.error, w.error)
    FROM eprev p JOIN ends f ON f.id = p.id
    WHERE w.id = p.id AND p.status IN ('PENDING', 'RUNNING')
    RETURNING w.id, f.n, f.status, 'workflow.' || lower(f.status) AS kind, f.error AS reason,
              f.steps, p.status::text AS prev, w.definition, w.definition_version, w.error,
              w.result_uri, w.tags, w.started_by, w.created_at, w.started_at, w.finished_at
)
"""

REPORTS: Final[LiteralString] = (
    "WITH"
    + _report_cte("")
    + ","
    + _PLACE_CTES
    + ","
    + _ENDS_CTES
    + """, hooks AS (
    INSERT INTO webhook_deliveries (webhook_id, event, workflow_id, payload, status)
    SELECT hook, kind, workflow_id, payload, 'PENDING' FROM ("""
    + _REPORT_HOOKS
    + """
        UNION ALL
        SELECT 2 * f.n + 1, h.id, f.kind, f.id, jsonb_build_object(
            'type', f.kind, 'timestamp', now(), 'data', jsonb_build_object(
                'workflow_id', f.id, 'workflow', f.definition,
                'workflow_version', f.definition_version, 'status', f.status,
                'error', f.error, 'result_uri', f.result_uri, 'tags', to_jsonb(f.tags),
                'started_by', f.started_by, 'created_at', f.created_at,
                'started_at', f.started_at, 'finished_at', f.finished_at))
        FROM ended f
        JOIN webhooks h ON f.kind = ANY(h.events)
                       AND (h.definition IS NULL OR h.definition = f.definition)
    ) both_hooks ORDER BY o, hook
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT workflow_id, kind, data FROM ("""
    + _REPORT_EVENT
    + """
        UNION ALL
        SELECT 2 * n + 1, id, kind, jsonb_strip_nulls(jsonb_build_object(
            'from', prev, 'to', status, 'error', reason, 'steps', steps))
        FROM ended
    ) both_events ORDER BY o
)
SELECT id FROM ended"""  # every data-modifying CTE runs, read or not
)

# Reports a scheduler took but had not committed when it stopped (``keys.reports_taken_key``),
# read again as it starts: the outcome of each one's task run, unless that run has ended
# meanwhile. Only the task runs' own records: the runs go on from what Postgres has
# (``RESUME``).
LATE_REPORT: Final[LiteralString] = (
    "WITH"
    + _report_cte(" AND t.status IN ('QUEUED', 'RUNNING')")
    + """, hooks AS (
    INSERT INTO webhook_deliveries (webhook_id, event, workflow_id, payload, status)
    SELECT hook, kind, workflow_id, payload, 'PENDING' FROM ("""
    + _REPORT_HOOKS
    + """
    ) report_hooks ORDER BY o, hook
)
INSERT INTO events (workflow_id, kind, data)
SELECT workflow_id, kind, data FROM ("""
    + _REPORT_EVENT
    + """
) report_events ORDER BY o
RETURNING workflow_id"""
)

# A task run whose worker died or went silent, unless its report came first.
LOST: Final[LiteralString] = """
WITH lost AS (
    UPDATE task_runs SET status = 'FAILED', error = %(reason)s::text
    WHERE id = %(id)s AND status IN ('QUEUED', 'RUNNING')
    RETURNING workflow_id, ref
)
INSERT INTO events (workflow_id, kind, data)
SELECT workflow_id, 'task.lost', jsonb_build_object('ref', ref, 'reason', %(reason)s::text)
FROM lost
"""

# A run driven again from its input (``scheduler.redrive``): its open task runs fail with the
# reason, and the event says why.
REDRIVEN: Final[LiteralString] = """
WITH closed AS (
    UPDATE task_runs SET status = 'FAILED', error = %(reason)s::text
    WHERE workflow_id = %(id)s AND status IN ('QUEUED', 'RUNNING')
)
INSERT INTO events (workflow_id, kind, data)
VALUES (%(id)s, 'workflow.redriven', jsonb_build_object('reason', %(reason)s::text))
"""

# The current steps of the definitions a sub-workflow step runs, and the tasks they name.
SUB_DEFINITIONS: Final[LiteralString] = (
    "SELECT name, tasks FROM workflow_definitions "
    "WHERE name = ANY(%(names)s::text[]) AND deleted_at IS NULL"
)
TASK_DEFINITIONS: Final[LiteralString] = (
    "SELECT name, module, timeout_s, retries, retry_backoff_s, max_concurrency "
    "FROM task_definitions WHERE name = ANY(%(names)s::text[])"
)

# Which of a scheduler's RUNNING runs are paused now (a pause's wake-up is a hint).
PAUSED: Final[LiteralString] = (
    "SELECT id FROM workflows WHERE id = ANY(%(ids)s::uuid[]) AND paused_at IS NOT NULL"
)

# The status of each of a set of runs (those not found are missing).
STATUSES: Final[LiteralString] = (
    "SELECT id, status::text FROM workflows WHERE id = ANY(%(ids)s::uuid[])"
)

# What a run waits for, for a person to read (``status_detail``; null once it waits no more),
# and the event that says so; a run that has ended keeps no detail.
WAITING: Final[LiteralString] = """
WITH w AS (
    UPDATE workflows SET status_detail = %(detail)s::text
    WHERE id = %(id)s AND status = 'RUNNING'
    RETURNING id
)
INSERT INTO events (workflow_id, kind, data) SELECT id, %(kind)s::text, %(data)s::jsonb FROM w
"""

# A cancelled run's task runs that no worker took.
UNQUEUE: Final[LiteralString] = (
    "UPDATE task_runs SET status = 'CANCELLED' WHERE workflow_id = %(id)s AND status = 'QUEUED'"
)


def claimed_from_row(row: tuple[Any, ...]) -> Claimed:
    """A row of ``CLAIM`` or ``RESUME``."""
    return Claimed(
        id=row[0],
        definition=row[1],
        input=row[2] or {},
        policy=Policy(row[3]),
        data_plane=DataPlane(row[4]),
        steps=row[5],
        task_defs=row[6] or {},
        attempts={str(k): int(v) for k, v in (row[7] or {}).items()},
        priority=int(row[8]),
        paused=bool(row[9]),
        timeout_s=row[10],
        started_at=row[11],
        worker_wait_s=row[12],
    )


@dataclass(frozen=True)
class Reported:
    """A report to record (``REPORTS``): its hand-backs, what its task run made (``data``,
    merged into its ``data``), the next steps' task runs, or its workflow's end."""

    report: Report
    back: Sequence[Handoff] = ()
    placements: Sequence[Placement] = ()
    finish: Finish | None = None
    data: dict[str, Any] | None = None


def reports_params(batch: Sequence[Reported]) -> dict[str, Any]:
    """The parameters of ``REPORTS`` (and of ``LATE_REPORT``): one element a report."""
    reports = [b.report for b in batch]
    moved = [
        replace(
            h,
            task_run_id=h.task_run_id or b.report.task_run_id,
            workflow_id=h.workflow_id or uuid.UUID(b.report.workflow_id),
        )
        for b in batch
        for h in b.back
    ]
    ends = [(n, b.finish) for n, b in enumerate(batch, 1) if b.finish is not None]
    assert all(f.status.finished for _, f in ends)
    return {
        "r_ids": [r.task_run_id for r in reports],
        "r_statuses": [str(r.status) for r in reports],
        "r_workers": [r.worker_id for r in reports],
        "r_started": [float(r.started_at) for r in reports],
        "r_finished": [float(r.finished_at) for r in reports],
        "r_run_ms": [max(0.0, (r.finished_at - r.started_at) * 1000.0) for r in reports],
        "r_cpu_ms": [None if r.cpu_ms is None else float(r.cpu_ms) for r in reports],
        "r_bytes_in": [int(r.bytes_in) for r in reports],
        "r_bytes_out": [int(r.bytes_out) for r in reports],
        "r_outputs": [Jsonb(r.output) if r.output else None for r in reports],
        "r_errors": [r.error for r in reports],
        "r_tracebacks": [r.traceback for r in reports],
        "r_data": [Jsonb(b.data) if b.data else None for b in batch],
        **placement_params([p for b in batch for p in b.placements], moved),
        "f_ids": [f.workflow_id for _, f in ends],
        "f_n": [n for n, _ in ends],
        "f_statuses": [str(f.status) for _, f in ends],
        "f_outputs": [None if f.output is None else Jsonb(f.output) for _, f in ends],
        "f_result_uris": [f.result_uri for _, f in ends],
        "f_errors": [f.error for _, f in ends],
        "f_steps": [Jsonb(list(f.steps)) if f.steps else None for _, f in ends],
    }


def finish_params(finish: Finish | None) -> dict[str, Any]:
    """The parameters of ``FINISH``."""
    assert finish is None or finish.status.finished
    return {
        "finish": finish is not None,
        "fin_id": finish.workflow_id if finish else None,
        "fin_status": finish.status if finish else None,
        "fin_kind": f"workflow.{finish.status.lower()}" if finish else None,
        "fin_output": Jsonb(finish.output) if finish and finish.output is not None else None,
        "fin_result_uri": finish.result_uri if finish else None,
        "fin_error": finish.error if finish else None,
        "fin_steps": Jsonb(list(finish.steps)) if finish and finish.steps else None,
    }


def placement_params(
    placements: Sequence[Placement], handoffs: Sequence[Handoff] = ()
) -> dict[str, Any]:
    """The parameters of ``PLACE`` (and of the placements in ``REPORTS``): the rows, and every
    hand-off (``handoffs`` besides those of the placements, which name their task run)."""
    rows = list(placements)
    moved = [*handoffs, *(replace(h, task_run_id=p.task_run_id) for p in rows for h in p.handoffs)]
    workflows = {p.task_run_id: p.workflow_id for p in rows}
    default = rows[0].workflow_id if rows else None
    return {
        "p_ids": [p.task_run_id for p in rows],
        "p_workflows": [p.workflow_id for p in rows],
        "p_refs": [p.ref for p in rows],
        "p_tasks": [p.task for p in rows],
        "p_attempts": [p.attempt for p in rows],
        "p_workers": [p.worker for p in rows],
        "p_statuses": [str(p.status) for p in rows],
        "p_queued": [float(p.queued_at) for p in rows],
        "p_outputs": [None if p.output is None else Jsonb(p.output) for p in rows],
        "p_data": [None if p.data is None else Jsonb(p.data) for p in rows],
        "h_workflows": [h.workflow_id or workflows.get(h.task_run_id or 0, default) for h in moved],
        "h_runs": [h.task_run_id for h in moved],
        "h_from": [h.from_container for h in moved],
        "h_to": [h.to_container for h in moved],
        "h_bytes": [h.nbytes for h in moved],
        "h_us": [float(h.duration_us) for h in moved],
        "h_from_hosts": [h.from_host or None for h in moved],
        "h_to_hosts": [h.to_host or None for h in moved],
        "h_datums": [h.datum or None for h in moved],
        "h_modes": [h.mode or None for h in moved],
    }
