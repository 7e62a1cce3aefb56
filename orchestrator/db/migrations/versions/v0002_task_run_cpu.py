"""Task runs record the CPU time of the task function itself (``task_runs.cpu_ms``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("task_runs", sa.Column("cpu_ms", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("task_runs", "cpu_ms")
