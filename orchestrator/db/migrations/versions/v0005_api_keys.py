"""API keys (stored as SHA-256 digests) and who started each workflow (``started_by``).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column(
            "role", sa.Enum("viewer", "operator", "admin", name="api_key_role"), nullable=False
        ),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("configured", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("name", name=op.f("uq_api_keys_name")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.add_column("workflows", sa.Column("started_by", sa.String(length=64), nullable=True))


def downgrade() -> None:
    op.drop_column("workflows", "started_by")
    op.drop_table("api_keys")
    sa.Enum(name="api_key_role").drop(op.get_bind(), checkfirst=True)
