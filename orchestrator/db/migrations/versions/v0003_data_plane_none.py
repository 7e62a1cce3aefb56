"""The ``data_plane`` type has the label of every ``DataPlane``: ``none`` (a dataless run's).

The table's type mirrors the one enum the code uses; a workflow is still started only on
``cdi`` or ``object-store``, so no row holds ``none``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TYPE data_plane ADD VALUE IF NOT EXISTS 'none'")


def downgrade() -> None:
    # Postgres cannot drop an enum label: build the type again without it.
    op.execute("ALTER TYPE data_plane RENAME TO data_plane_old")
    op.execute("CREATE TYPE data_plane AS ENUM ('cdi', 'object-store')")
    op.execute(
        "ALTER TABLE workflows ALTER COLUMN data_plane TYPE data_plane "
        "USING data_plane::text::data_plane"
    )
    op.execute("DROP TYPE data_plane_old")
