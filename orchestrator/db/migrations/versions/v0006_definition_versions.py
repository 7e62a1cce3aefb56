"""Workflow definitions have versions; a run records the version it runs; definitions can be
deleted (kept, marked ``deleted_at``, so the runs on record still say what they ran).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "workflow_definitions",
        sa.Column("version", sa.Integer(), server_default="1", nullable=False),
    )
    op.add_column(
        "workflow_definitions",
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "workflow_definition_versions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("tasks", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["name"],
            ["workflow_definitions.name"],
            name=op.f("fk_workflow_definition_versions_name_workflow_definitions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("name", "version", name=op.f("pk_workflow_definition_versions")),
    )
    # Every definition so far becomes its own version 1, and every run on record ran it.
    op.execute(
        "INSERT INTO workflow_definition_versions (name, version, description, tasks, created_at) "
        "SELECT name, 1, description, tasks, updated_at FROM workflow_definitions"
    )
    op.add_column(
        "workflows",
        sa.Column("definition_version", sa.Integer(), server_default="1", nullable=False),
    )
    op.alter_column("workflows", "definition_version", server_default=None)


def downgrade() -> None:
    op.drop_column("workflows", "definition_version")
    op.drop_table("workflow_definition_versions")
    op.drop_column("workflow_definitions", "deleted_at")
    op.drop_column("workflow_definitions", "version")
