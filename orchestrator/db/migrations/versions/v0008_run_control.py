"""Runs under control: a run may end TIMED_OUT past its time limit (``workflows.timeout_s``, the
start's or its definition's); a definition may set that limit and how long a step may wait
for a worker able to run it (``timeout_s``, ``worker_wait_s``, on the definition and each
version); a run says what it waits for (``workflows.status_detail``); a task run keeps the
task's traceback (``task_runs.traceback``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_DEFINITION_TABLES = ("workflow_definitions", "workflow_definition_versions")


def upgrade() -> None:
    op.execute("ALTER TYPE workflow_status ADD VALUE IF NOT EXISTS 'TIMED_OUT'")
    op.add_column("workflows", sa.Column("timeout_s", sa.Double(), nullable=True))
    op.add_column("workflows", sa.Column("status_detail", sa.Text(), nullable=True))
    for table in _DEFINITION_TABLES:
        op.add_column(table, sa.Column("timeout_s", sa.Double(), nullable=True))
        op.add_column(table, sa.Column("worker_wait_s", sa.Double(), nullable=True))
    op.add_column("task_runs", sa.Column("traceback", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_runs", "traceback")
    for table in _DEFINITION_TABLES:
        op.drop_column(table, "worker_wait_s")
        op.drop_column(table, "timeout_s")
    op.drop_column("workflows", "status_detail")
    op.drop_column("workflows", "timeout_s")
    # A run that timed out reads as failed; Postgres cannot drop an enum label, so the type is
    # built again without it.
    op.execute("UPDATE workflows SET status = 'FAILED' WHERE status = 'TIMED_OUT'")
    op.execute("ALTER TYPE workflow_status RENAME TO workflow_status_old")
    op.execute(
        "CREATE TYPE workflow_status AS ENUM "
        "('PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED')"
    )
    op.execute("ALTER TABLE workflows ALTER COLUMN status DROP DEFAULT")
    op.execute(
        "ALTER TABLE workflows ALTER COLUMN status TYPE workflow_status "
        "USING status::text::workflow_status"
    )
    op.execute("DROP TYPE workflow_status_old")
