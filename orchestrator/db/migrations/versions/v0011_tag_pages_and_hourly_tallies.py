"""A runs-by-status index that carries the tags, and hourly tallies beside the per-minute ones.

*The index* ``(status, created_at, id) INCLUDE (tags)`` replaces ``(status, created_at, id)``:
a list by status and tag finds its page's keys in the index alone, walking the status
newest first and testing each entry's tags, not intersecting the tag's and the status's
whole sets of runs (what Postgres did without it: a cost that grew with the history). Built
concurrently before the one it replaces is dropped (``migrations.concurrently``).

*Hourly tallies.* ``tally_hours`` holds, per hour (UTC), series and bucket, the sum of the
hour's per-minute rows of ``tallies``: a trigger on ``tallies`` adds what each statement
inserted or changed there, so it stays that sum whichever process folds; deleting old
minutes (``tallies.PRUNE_MINUTES``) leaves the hours. A long window reads hours for all
but its first partial hour. The hours are backfilled from the minutes kept, in the
transaction that creates the trigger (which holds folds until it ends).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from alembic import op

from orchestrator.db.migrations.concurrently import build_concurrently, drop_concurrently

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NEW: Final = ("ix_workflows_status_created_at_id_tags", "workflows",
               "(status, created_at, id) INCLUDE (tags)")  # fmt: skip
_OLD: Final = ("ix_workflows_status_created_at_id", "workflows", "(status, created_at, id)")


def _add_to_hours(rows: str) -> str:
    """``rows`` (of ``tallies``' columns) summed by hour into ``tally_hours``; the all-time
    rows (``-infinity``) have no hour."""
    return f"""
    INSERT INTO tally_hours (hour, series, bucket, n, total, peak)
    SELECT date_trunc('hour', r.minute, 'UTC'), r.series, r.bucket, sum(r.n), sum(r.total),
           max(r.peak)
    FROM {rows} r WHERE r.minute > '-infinity' AND r.minute < 'infinity'
    GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (hour, series, bucket) DO UPDATE SET
        n = tally_hours.n + excluded.n,
        total = tally_hours.total + excluded.total,
        peak = greatest(tally_hours.peak, excluded.peak)"""


# What a statement inserted into ``tallies`` or changed there (an update: new minus old; a
# fold only raises a peak).
_HOURS_OF: Final = f"""
CREATE FUNCTION tally_hours_of() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        {_add_to_hours("new_rows")};
    ELSE
        {
    _add_to_hours(
        "(SELECT minute, series, bucket, n, total, peak FROM new_rows "
        "UNION ALL SELECT minute, series, bucket, -n, -total, NULL FROM old_rows)"
    )
};
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    with op.get_context().autocommit_block():
        build_concurrently(*_NEW)
        drop_concurrently(_OLD[0])

    # The columns of ``tallies``, an hour for a minute; room on each page for the current
    # hour's rows to be rewritten in place, as there.
    op.execute("CREATE TABLE tally_hours (LIKE tallies INCLUDING DEFAULTS) WITH (fillfactor = 70)")
    op.execute("ALTER TABLE tally_hours RENAME COLUMN minute TO hour")
    op.execute(
        "ALTER TABLE tally_hours ADD CONSTRAINT pk_tally_hours PRIMARY KEY (hour, series, bucket)"
    )
    op.execute(_HOURS_OF)
    op.execute(
        "CREATE TRIGGER tallies_hours_insert AFTER INSERT ON tallies "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION tally_hours_of()"
    )
    op.execute(
        "CREATE TRIGGER tallies_hours_update AFTER UPDATE ON tallies "
        "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
        "FOR EACH STATEMENT EXECUTE FUNCTION tally_hours_of()"
    )
    op.execute(_add_to_hours("tallies"))


def downgrade() -> None:
    for event in ("insert", "update"):
        op.execute(f"DROP TRIGGER IF EXISTS tallies_hours_{event} ON tallies")
    op.execute("DROP FUNCTION IF EXISTS tally_hours_of()")
    op.drop_table("tally_hours")
    with op.get_context().autocommit_block():
        build_concurrently(*_OLD)
        drop_concurrently(_NEW[0])
