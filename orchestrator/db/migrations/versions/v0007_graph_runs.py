"""Workflows as graphs: a step run may be SKIPPED (a switch chose another branch); step refs
grow to name a sub-workflow's steps (``enhance/deblur``) and a fan-out's elements
(``tile[12]``); a task run records the named data it read and made (``data``); a hand-off says
which datum it moved and how (``datum``, ``mode``: transfer, share or copy).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TYPE task_run_status ADD VALUE IF NOT EXISTS 'SKIPPED'")
    op.alter_column("task_runs", "ref", type_=sa.String(length=255), existing_nullable=False)
    op.add_column(
        "task_runs",
        sa.Column("data", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )
    op.add_column("handoffs", sa.Column("datum", sa.String(length=255), nullable=True))
    op.add_column("handoffs", sa.Column("mode", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("handoffs", "mode")
    op.drop_column("handoffs", "datum")
    op.drop_column("task_runs", "data")
    op.execute("DELETE FROM task_runs WHERE status = 'SKIPPED' OR length(ref) > 64")
    op.alter_column("task_runs", "ref", type_=sa.String(length=64), existing_nullable=False)
    # Postgres cannot drop an enum label: build the type again without it.
    op.execute("ALTER TYPE task_run_status RENAME TO task_run_status_old")
    op.execute(
        "CREATE TYPE task_run_status AS ENUM "
        "('QUEUED', 'RUNNING', 'COMPLETED', 'FAILED', 'TIMED_OUT', 'CANCELLED')"
    )
    op.execute("ALTER TABLE task_runs ALTER COLUMN status DROP DEFAULT")
    op.execute(
        "ALTER TABLE task_runs ALTER COLUMN status TYPE task_run_status "
        "USING status::text::task_run_status"
    )
    op.execute("DROP TYPE task_run_status_old")
