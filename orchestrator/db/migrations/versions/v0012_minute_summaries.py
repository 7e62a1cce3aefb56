"""Each kept minute's overview figures, summed as its tallies change: ``tally_minutes``.

The overview's chart shows, for each minute of its window, the runs completed, failed and
started and the p50 and p95 of the minute's completions. Read from ``tallies``, that is a
minute's counts and latency buckets walked to its percentiles at every poll: a six-hour window
of a busy history reads thousands of rows. ``tally_minutes`` keeps those five figures a minute,
written by a trigger on ``tallies`` whenever a statement (a fold) inserts or changes a kept
minute's counts of runs started or ended or its latency, so it always equals what the minute's
kept rows say, whichever process folds. A window reads a row a minute from it, and reads from
``tallies`` and ``tally_deltas`` only the minutes with figures not yet folded
(``repository.stats``). Minutes older than the two days kept are not summed (no window reaches
them); ``tallies.PRUNE_MINUTES`` drops them with the rest. Backfilled from the kept minutes in
the transaction that creates the triggers (which holds folds until it ends).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The series a minute's summary is made of (``repository.stats`` reads them live the same way).
_SUMMED: Final = (
    "series IN ('created', 'latency', 'ended:COMPLETED', 'ended:FAILED', 'ended:CANCELLED', "
    "'ended:TIMED_OUT')"
)

# The summaries of the minutes ``ms``, from their kept rows (``tallies``): counts, and the
# latency's p50 and p95 interpolated within their buckets as ``tallies.within`` does.
_REFRESH: Final = f"""
CREATE FUNCTION tally_minutes_refresh(ms timestamptz[]) RETURNS void LANGUAGE sql AS $$
    WITH m AS (SELECT DISTINCT unnest(ms) AS minute),
    kept AS (
        SELECT t.minute, t.series, t.bucket, t.n, t.peak FROM tallies t JOIN m USING (minute)
        WHERE t.{_SUMMED}
    ), counts AS (
        SELECT minute,
               sum(n) FILTER (WHERE series = 'ended:COMPLETED') AS completed,
               sum(n) FILTER (WHERE series IN ('ended:FAILED', 'ended:CANCELLED',
                                               'ended:TIMED_OUT')) AS failed,
               sum(n) FILTER (WHERE series = 'created') AS created
        FROM kept WHERE bucket = -1 GROUP BY minute
    ), c AS (
        SELECT minute, bucket, n,
               sum(n) OVER (PARTITION BY minute ORDER BY bucket) AS upto,
               sum(n) OVER (PARTITION BY minute) AS total,
               max(peak) OVER (PARTITION BY minute) AS top
        FROM kept WHERE series = 'latency' AND bucket >= 0
    ), at AS (
        SELECT c.minute, q.q,
               least(low + (coalesce(high, nullif(c.top, 0), low) - low)
                     * greatest(0, q.q * c.total - (c.upto - c.n)) / c.n, c.top) AS value
        FROM c CROSS JOIN (VALUES (0.5::float8), (0.95::float8)) q(q)
        CROSS JOIN (SELECT history_ms_bounds() AS ms) b
        CROSS JOIN LATERAL (
            SELECT CASE WHEN c.bucket > 0 THEN b.ms[c.bucket] ELSE 0 END AS low,
                   b.ms[c.bucket + 1] AS high  -- NULL above the last bound
        ) edges
        WHERE c.n > 0 AND c.upto - c.n < q.q * c.total AND c.upto >= q.q * c.total
    ), quantiles AS (
        SELECT minute, max(value) FILTER (WHERE q = 0.5) AS p50_ms,
               max(value) FILTER (WHERE q = 0.95) AS p95_ms
        FROM at GROUP BY minute
    )
    INSERT INTO tally_minutes (minute, completed, failed, created, p50_ms, p95_ms)
    SELECT m.minute, coalesce(counts.completed, 0), coalesce(counts.failed, 0),
           coalesce(counts.created, 0), quantiles.p50_ms, quantiles.p95_ms
    FROM m LEFT JOIN counts USING (minute) LEFT JOIN quantiles USING (minute)
    ORDER BY m.minute
    ON CONFLICT (minute) DO UPDATE SET
        completed = excluded.completed, failed = excluded.failed, created = excluded.created,
        p50_ms = excluded.p50_ms, p95_ms = excluded.p95_ms
$$
"""

# The kept minutes a statement on ``tallies`` touched in the summed series, summed again.
_MINUTES_OF: Final = f"""
CREATE FUNCTION tally_minutes_of() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM tally_minutes_refresh(ARRAY(
        SELECT DISTINCT minute FROM new_rows
        WHERE minute >= now() - interval '2 days' AND minute < 'infinity' AND {_SUMMED}
    ));
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(
        "CREATE TABLE tally_minutes (minute timestamptz PRIMARY KEY, completed bigint NOT NULL, "
        "failed bigint NOT NULL, created bigint NOT NULL, p50_ms float8, p95_ms float8) "
        "WITH (fillfactor = 70)"  # the current minute's row is rewritten in place
    )
    op.execute(_REFRESH)
    op.execute(_MINUTES_OF)
    for event, tables in (
        ("insert", "NEW TABLE AS new_rows"),
        ("update", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
    ):
        op.execute(
            f"CREATE TRIGGER tallies_minutes_{event} AFTER {event.upper()} ON tallies "
            f"REFERENCING {tables} FOR EACH STATEMENT EXECUTE FUNCTION tally_minutes_of()"
        )
    op.execute(
        "SELECT tally_minutes_refresh(ARRAY(SELECT DISTINCT minute FROM tallies "
        f"WHERE minute >= now() - interval '2 days' AND minute < 'infinity' AND {_SUMMED}))"
    )


def downgrade() -> None:
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS tallies_minutes_{event} ON tallies")
    op.execute("DROP FUNCTION IF EXISTS tally_minutes_of()")
    op.execute("DROP FUNCTION IF EXISTS tally_minutes_refresh(timestamptz[])")
    op.drop_table("tally_minutes")
