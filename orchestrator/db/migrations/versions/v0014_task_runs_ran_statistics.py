"""Statistics of the span each task run ran: ``st_task_runs_ran``.

``/api/task-runs`` finds the runs that ran within a window through ``ix_task_runs_ran``, a
partial GiST index on that span. Postgres plans with the statistics of a partial index's
expression only for uniqueness, never for selectivity, so it estimated every window's overlap
at its default 1 % of the table: at ten million workflows (31 million task runs) a window with
no rows was planned as 312,157 rows, with parallel workers and JIT, and took over 100 ms while
reading 17 buffers. Extended statistics on the same expression (Postgres 14 and later) give
the planner the spans' bounds and lengths: it estimates a window from what it holds. They cover
every row, so a task run cancelled before it started (no times: a span without bounds) counts in
every window's estimate. Filled by ``ANALYZE task_runs`` here (a sample of the table, seconds at
any size) and by autovacuum's analyses after.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The expression as ``ix_task_runs_ran`` and ``repository.task_runs`` spell it.
    op.execute(
        "CREATE STATISTICS st_task_runs_ran "
        "ON (tstzrange(LEAST(started_at, finished_at), finished_at, '[]')) FROM task_runs"
    )
    op.execute("ANALYZE task_runs")


def downgrade() -> None:
    op.execute("DROP STATISTICS IF EXISTS st_task_runs_ran")
