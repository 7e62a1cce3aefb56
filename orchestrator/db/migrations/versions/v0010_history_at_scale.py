"""History at scale: indexes for every list, filter and window; figures kept by triggers as
runs change (``tallies``); retention per definition and the state of its last pass.

*Indexes* are built with ``CREATE INDEX CONCURRENTLY`` outside the migration's transaction,
first: a table being indexed keeps taking writes (a concurrent build reads it twice and waits
for the transactions that were open at its start, but locks out no insert or update), so an
upgrade of a database with millions of runs does not stop the scheduler for the minutes a build
takes. Each build is idempotent (``IF NOT EXISTS``; an invalid index a failed build left is
dropped first), so an upgrade stopped half-way is simply run again. The indexes they replace
(the same keys without ``id``) are dropped concurrently after them.

*Tallies.* The triggers are created, and the counts by status backfilled, in one transaction:
creating a trigger holds writes to its table until the transaction ends, so no change falls
between the backfill and the first trigger. That transaction reads the rows once by status
(and the last two days' ends, for the overview's charts): about a second per million runs on a
busy 2-core machine, the only time an upgrade holds the scheduler's writes. The all-time
histograms and counters (``/metrics``) start at the upgrade; Prometheus takes that as a counter
reset.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from orchestrator.db.migrations.concurrently import build_concurrently, drop_concurrently

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Histogram bucket bounds in ms (``orchestrator.db.tallies.MS_BOUNDS``, compared by a test).
_BOUNDS: Final = (
    0.1, 0.11, 0.12, 0.13, 0.14, 0.15, 0.16, 0.18, 0.2, 0.22, 0.25, 0.28, 0.3, 0.35, 0.4, 0.45,
    0.5, 0.55, 0.6, 0.7, 0.8, 0.9, 1, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.8, 2, 2.2, 2.5, 2.8, 3,
    3.5, 4, 4.5, 5, 5.5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 25, 28, 30, 35, 40,
    45, 50, 55, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 180, 200, 220, 250, 280, 300,
    350, 400, 450, 500, 550, 600, 700, 800, 900, 1000, 1100, 1200, 1300, 1400, 1500, 1600, 1800,
    2000, 2200, 2500, 2800, 3000, 3500, 4000, 4500, 5000, 5500, 6000, 7000, 8000, 9000, 10000,
    11000, 12000, 13000, 14000, 15000, 16000, 18000, 20000, 22000, 25000, 28000, 30000, 35000,
    40000, 45000, 50000, 55000, 60000, 70000, 80000, 90000, 100000, 110000, 120000, 130000,
    140000, 150000, 160000, 180000, 200000, 220000, 250000, 280000, 300000, 350000, 400000,
    450000, 500000, 550000, 600000, 700000, 800000, 900000, 1000000,
)  # fmt: skip

# (name, table, definition) built concurrently, in this order.
_INDEXES: Final = (
    ("ix_workflows_created_at_id", "workflows", "(created_at, id)"),
    ("ix_workflows_status_created_at_id", "workflows", "(status, created_at, id)"),
    ("ix_workflows_definition_created_at_id", "workflows", "(definition, created_at, id)"),
    ("ix_workflows_policy_created_at_id", "workflows", "(policy, created_at, id)"),
    ("ix_workflows_schedule_id_created_at_id", "workflows",
     "(schedule_id, created_at, id) WHERE schedule_id IS NOT NULL"),
    ("ix_workflows_definition_finished_at", "workflows",
     "(definition, finished_at) WHERE finished_at IS NOT NULL"),
    ("ix_workflows_retry_of", "workflows", "(retry_of) WHERE retry_of IS NOT NULL"),
    ("ix_task_runs_ran", "task_runs",
     "USING gist (tstzrange(LEAST(started_at, finished_at), finished_at, '[]')) "
     "WHERE started_at IS NOT NULL AND finished_at IS NOT NULL"),
    ("ix_handoffs_task_run_id", "handoffs", "(task_run_id) WHERE task_run_id IS NOT NULL"),
    ("ix_webhook_deliveries_webhook_id_status_id", "webhook_deliveries",
     "(webhook_id, status, id)"),
    ("ix_webhook_deliveries_workflow_id", "webhook_deliveries",
     "(workflow_id) WHERE workflow_id IS NOT NULL"),
)  # fmt: skip
_REPLACED: Final = (
    ("ix_workflows_created_at", "workflows", "(created_at)"),
    ("ix_workflows_status_created_at", "workflows", "(status, created_at)"),
    ("ix_workflows_definition_created_at", "workflows", "(definition, created_at)"),
)

_FINISHED: Final = "('COMPLETED', 'FAILED', 'CANCELLED', 'TIMED_OUT')"

# The figures of runs that ended: counts by status (all time and per minute of the end) and
# the latency histogram of the completed ones (all time and per minute, and all time by
# definition).
_WORKFLOW_ENDS: Final = """
CREATE FUNCTION tally_workflow_ends(e_status text[], e_at timestamptz[], e_ms float8[],
                                    e_definition text[])
RETURNS void LANGUAGE sql AS $$
    INSERT INTO tally_deltas (minute, series, bucket, n, total, peak)
    SELECT m.minute, 'ended:' || e.status, -1, count(*), 0, NULL
    FROM unnest(e_status, e_at, e_ms) e(status, ended, ms)
    CROSS JOIN LATERAL (VALUES ('-infinity'::timestamptz), (date_trunc('minute', e.ended)))
         m(minute)
    GROUP BY 1, 2
    UNION ALL
    SELECT m.minute, m.series, history_bucket(e.ms), count(*), sum(e.ms), max(e.ms)
    FROM unnest(e_status, e_at, e_ms, e_definition) e(status, ended, ms, definition)
    CROSS JOIN LATERAL (VALUES ('-infinity'::timestamptz, 'latency'),
                               (date_trunc('minute', e.ended), 'latency'),
                               ('-infinity'::timestamptz, 'latency:' || e.definition))
         m(minute, series)
    WHERE e.status = 'COMPLETED'
    GROUP BY 1, 2, 3
$$
"""

# Task runs that finished (got their ``finished_at``): per minute, their number, queue waits
# and run times; all time, queue waits and completed runs' times by task.
_TASK_RUN_ENDS: Final = """
CREATE FUNCTION tally_task_run_ends(e_task text[], e_status text[], e_at timestamptz[],
                                    e_wait float8[], e_run float8[])
RETURNS void LANGUAGE sql AS $$
    WITH e AS (
        SELECT * FROM unnest(e_task, e_status, e_at, e_wait, e_run)
                      e(task, status, ended, wait, run)
    )
    INSERT INTO tally_deltas (minute, series, bucket, n, total, peak)
    SELECT date_trunc('minute', ended), 'task_finished', -1, count(*), 0, NULL FROM e GROUP BY 1
    UNION ALL
    SELECT m.minute, 'queue_wait', history_bucket(e.wait), count(*), sum(e.wait), max(e.wait)
    FROM e CROSS JOIN LATERAL (VALUES ('-infinity'::timestamptz), (date_trunc('minute', e.ended)))
         m(minute)
    WHERE e.wait IS NOT NULL GROUP BY 1, 2, 3
    UNION ALL
    SELECT date_trunc('minute', ended), 'task_run', history_bucket(run), count(*), sum(run),
           max(run)
    FROM e WHERE run IS NOT NULL GROUP BY 1, 2, 3
    UNION ALL
    SELECT '-infinity'::timestamptz, 'run:' || task, history_bucket(run), count(*), sum(run),
           max(run)
    FROM e WHERE run IS NOT NULL AND status = 'COMPLETED' GROUP BY 1, 2, 3
$$
"""


def _tally_trigger(
    table: str,
    ended: str,
    ends: str,
    *,
    counted: tuple[str, ...] = ("status",),
    series: tuple[str, ...] = (),
    also_inserted: str = "",
) -> str:
    """The trigger function of ``table``: its counts by status as rows come, change status and
    go, and the figures of the rows that ended (``ended``, a condition on a row ``{r}``) given
    to ``ends`` (a call over the ended rows ``n``). ``counted``: the columns the counts read,
    ``series``: more counts than ``<table>:<status>`` (expressions over a row ``r``);
    ``also_inserted``: more figures of new rows (a ``UNION ALL`` of rows of ``tally_deltas``)."""
    now, before = ended.format(r="n"), ended.format(r="o")
    names = ", ".join(f"({e})" for e in (f"'{table}:' || r.status", *series))
    each = f"CROSS JOIN LATERAL (VALUES {names}) s(series)"
    columns = ", ".join(counted)
    return f"""
CREATE FUNCTION tally_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- (also once per row a foreign key cascades from: then mostly with no rows)
        INSERT INTO tally_deltas (minute, series, bucket, n)
        SELECT '-infinity'::timestamptz, s.series, -1, -count(*) FROM old_rows r {each}
        GROUP BY s.series;
        RETURN NULL;
    END IF;
    IF NOT EXISTS (SELECT FROM new_rows) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tally_deltas (minute, series, bucket, n)
        SELECT '-infinity'::timestamptz, s.series, -1, count(*) FROM new_rows r {each}
        GROUP BY s.series {also_inserted};
        PERFORM {ends} FROM new_rows n WHERE {now} HAVING count(*) > 0;
    ELSE
        INSERT INTO tally_deltas (minute, series, bucket, n)
        SELECT '-infinity'::timestamptz, s.series, -1, sum(r.d)
        FROM (SELECT {columns}, 1 AS d FROM new_rows
              UNION ALL SELECT {columns}, -1 FROM old_rows) r {each}
        GROUP BY s.series HAVING sum(r.d) <> 0;
        PERFORM {ends} FROM new_rows n JOIN old_rows o ON o.id = n.id
        WHERE {now} AND NOT ({before}) HAVING count(*) > 0;
    END IF;
    RETURN NULL;
END
$$
"""


# Runs on record by status, and by status and definition (``/metrics``' ``workflow`` label).
_WORKFLOWS: Final = _tally_trigger(
    "workflows",
    f"{{r}}.status IN {_FINISHED} AND {{r}}.finished_at IS NOT NULL",
    "tally_workflow_ends(array_agg(n.status::text), array_agg(n.finished_at), "
    "array_agg(extract(epoch FROM n.finished_at - n.created_at) * 1000), "
    "array_agg(n.definition::text))",
    counted=("status", "definition"),
    series=("'workflow:' || r.status || ':' || r.definition",),
    also_inserted="UNION ALL SELECT date_trunc('minute', created_at), 'created', -1, count(*) "
    "FROM new_rows GROUP BY 1",
)
_TASK_RUNS: Final = _tally_trigger(
    "task_runs",
    "{r}.finished_at IS NOT NULL",
    "tally_task_run_ends(array_agg(n.task), array_agg(n.status::text), "
    "array_agg(n.finished_at), array_agg(n.queue_wait_ms), array_agg(n.run_ms))",
)

_HANDOFFS: Final = """
CREATE FUNCTION tally_handoffs() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tally_deltas (minute, series, bucket, n, total)
    SELECT '-infinity'::timestamptz, 'handoffs', -1, count(*), coalesce(sum(bytes), 0) FROM new_rows
    HAVING count(*) > 0;
    RETURN NULL;
END
$$
"""

# The last two days per minute (what the overview's charts show), through the triggers' own
# functions; their all-time rows are dropped (the histograms start at the upgrade); then the
# counts by status as they stand. Writes wait meanwhile (see the docstring).
_RECENT_ENDS: Final = (
    f"""
SELECT tally_workflow_ends(array_agg(status::text), array_agg(finished_at),
                           array_agg(extract(epoch FROM finished_at - created_at) * 1000),
                           array_agg(definition::text))
FROM workflows
WHERE status IN {_FINISHED} AND finished_at >= now() - interval '2 days'
""",
    """
SELECT tally_task_run_ends(array_agg(task), array_agg(status::text), array_agg(finished_at),
                           array_agg(queue_wait_ms), array_agg(run_ms))
FROM task_runs
WHERE started_at IS NOT NULL AND finished_at IS NOT NULL
  AND tstzrange(LEAST(started_at, finished_at), finished_at, '[]')
      && tstzrange(now() - interval '2 days', NULL)
  AND finished_at >= now() - interval '2 days'
""",
    "DELETE FROM tally_deltas WHERE minute = '-infinity'",
    """
INSERT INTO tally_deltas (minute, series, bucket, n)
SELECT date_trunc('minute', created_at), 'created', -1, count(*) FROM workflows
WHERE created_at >= now() - interval '2 days' GROUP BY 1
""",
)
_COUNTS: Final = """
WITH c AS (SELECT status, definition, count(*) AS n FROM workflows GROUP BY status, definition)
INSERT INTO tallies (minute, series, bucket, n)
SELECT '-infinity'::timestamptz, 'workflows:' || status, -1, sum(n) FROM c GROUP BY status
UNION ALL
SELECT '-infinity'::timestamptz, 'workflow:' || status || ':' || definition, -1, n FROM c
UNION ALL
SELECT '-infinity'::timestamptz, 'task_runs:' || status, -1, count(*) FROM task_runs GROUP BY status
"""


def upgrade() -> None:
    with op.get_context().autocommit_block():
        for name, table, definition in _INDEXES:
            build_concurrently(name, table, definition)
        for name, _, _ in _REPLACED:
            drop_concurrently(name)

    result_retention = postgresql.ENUM("keep", "delete", name="result_retention")
    result_retention.create(op.get_bind())
    op.add_column("workflow_definitions", sa.Column("retention_days", sa.Integer()))
    op.add_column(
        "workflow_definitions",
        sa.Column("retention_results", postgresql.ENUM(name="result_retention",
                                                       create_type=False)),
    )  # fmt: skip
    op.create_table(
        "retention_state",
        sa.Column("id", sa.SmallInteger(), nullable=False),
        sa.Column("pass_at", sa.DateTime(timezone=True)),
        sa.Column("pass_pruned", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("pass_seconds", sa.Double(), server_default="0", nullable=False),
        sa.Column("error", sa.Text()),
        sa.Column("error_at", sa.DateTime(timezone=True)),
        sa.CheckConstraint("id = 1", name=op.f("ck_retention_state_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_retention_state")),
    )
    for table in ("tallies", "tally_deltas"):
        keyed = table == "tallies"
        op.create_table(
            table,
            sa.Column("minute", sa.DateTime(timezone=True), nullable=False),
            sa.Column("series", sa.String(length=100), nullable=False),
            sa.Column("bucket", sa.SmallInteger(), nullable=False),
            sa.Column("n", sa.BigInteger(), server_default="0", nullable=False),
            sa.Column("total", sa.Double(), server_default="0", nullable=False),
            sa.Column("peak", sa.Double()),
            *(
                [sa.PrimaryKeyConstraint("minute", "series", "bucket", name=op.f("pk_tallies"))]
                if keyed
                else []
            ),
            # Room on each page for the current minute's rows, updated by every fold, to be
            # rewritten in place (HOT) rather than spread over the table.
            postgresql_with={"fillfactor": "70"} if keyed else {},
        )

    bounds = ",".join(format(b, "g") for b in _BOUNDS)
    negated = ",".join(format(-b, "g") for b in reversed(_BOUNDS))
    op.execute(
        "CREATE FUNCTION history_ms_bounds() RETURNS float8[] LANGUAGE sql IMMUTABLE "
        f"PARALLEL SAFE AS $$ SELECT '{{{bounds}}}'::float8[] $$"
    )
    # How many bounds lie below ``ms``: its bucket, (bound[i-1], bound[i]].
    op.execute(
        "CREATE FUNCTION history_bucket(ms float8) RETURNS smallint LANGUAGE sql IMMUTABLE "
        f"PARALLEL SAFE AS $$ SELECT ({len(_BOUNDS)} - width_bucket(-ms, "
        f"'{{{negated}}}'::float8[]))::smallint $$"
    )
    op.execute(_WORKFLOW_ENDS)
    op.execute(_WORKFLOWS)
    op.execute(_TASK_RUN_ENDS)
    op.execute(_TASK_RUNS)
    op.execute(_HANDOFFS)
    for table, function in (("workflows", "tally_workflows"), ("task_runs", "tally_task_runs")):
        op.execute(
            f"CREATE TRIGGER {table}_tally_insert AFTER INSERT ON {table} "
            f"REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_tally_update AFTER UPDATE ON {table} "
            "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
        op.execute(
            f"CREATE TRIGGER {table}_tally_delete AFTER DELETE ON {table} "
            f"REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION {function}()"
        )
    op.execute(
        "CREATE TRIGGER handoffs_tally_insert AFTER INSERT ON handoffs "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tally_handoffs()"
    )
    for statement in (*_RECENT_ENDS, _COUNTS):
        op.execute(statement)


def downgrade() -> None:
    for table in ("workflows", "task_runs"):
        for event in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER IF EXISTS {table}_tally_{event} ON {table}")
    op.execute("DROP TRIGGER IF EXISTS handoffs_tally_insert ON handoffs")
    for function in ("tally_workflows()", "tally_task_runs()", "tally_handoffs()",
                     "tally_workflow_ends(text[], timestamptz[], float8[], text[])",
                     "tally_task_run_ends(text[], text[], timestamptz[], float8[], float8[])",
                     "history_bucket(float8)", "history_ms_bounds()"):  # fmt: skip
        op.execute(f"DROP FUNCTION IF EXISTS {function}")
    op.drop_table("tally_deltas")
    op.drop_table("tallies")
    op.drop_table("retention_state")
    op.drop_column("workflow_definitions", "retention_results")
    op.drop_column("workflow_definitions", "retention_days")
    op.execute("DROP TYPE IF EXISTS result_retention")
    with op.get_context().autocommit_block():
        for name, table, definition in _REPLACED:
            build_concurrently(name, table, definition)
        for name, _, _ in _INDEXES:
            drop_concurrently(name)
