"""Hand-offs record the CDI hosts of their two containers (``from_host``, ``to_host``).

Null for hand-offs recorded before, and where a host is unknown; two different ones mean the
object's bytes crossed between hosts.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("handoffs", sa.Column("from_host", sa.String(128), nullable=True))
    op.add_column("handoffs", sa.Column("to_host", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("handoffs", "to_host")
    op.drop_column("handoffs", "from_host")
