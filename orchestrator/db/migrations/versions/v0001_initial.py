"""Initial schema: definitions, workflows, task runs, hand-offs and events.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "task_definitions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("module", sa.String(length=255), nullable=False),
        sa.Column("timeout_s", sa.Double(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("retry_backoff_s", sa.Double(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_task_definitions")),
    )
    op.create_table(
        "workflow_definitions",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("tasks", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_workflow_definitions")),
    )
    op.create_table(
        "workflows",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("definition", sa.String(length=64), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", name="workflow_status"
            ),
            nullable=False,
        ),
        sa.Column(
            "policy",
            sa.Enum("affinity", "transfer", "auto", name="workflow_policy"),
            nullable=False,
        ),
        sa.Column("data_plane", sa.Enum("cdi", "object-store", name="data_plane"), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result_uri", sa.Text(), nullable=True),
        sa.Column("retry_of", sa.Uuid(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_by", sa.String(length=128), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["definition"],
            ["workflow_definitions.name"],
            name=op.f("fk_workflows_definition_workflow_definitions"),
            ondelete="RESTRICT",
        ),
        sa.ForeignKeyConstraint(
            ["retry_of"],
            ["workflows.id"],
            name=op.f("fk_workflows_retry_of_workflows"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workflows")),
    )
    op.create_index("ix_workflows_created_at", "workflows", ["created_at"], unique=False)
    op.create_index(
        "ix_workflows_definition_created_at",
        "workflows",
        ["definition", "created_at"],
        unique=False,
    )
    op.create_index(
        "ix_workflows_status_created_at", "workflows", ["status", "created_at"], unique=False
    )
    op.create_table(
        "events",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=True),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column(
            "data", postgresql.JSONB(astext_type=sa.Text()), server_default="{}", nullable=False
        ),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("fk_events_workflow_id_workflows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
    )
    op.create_index("ix_events_at", "events", ["at"], unique=False)
    op.create_index("ix_events_workflow_id_id", "events", ["workflow_id", "id"], unique=False)
    op.create_table(
        "task_runs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("ref", sa.String(length=64), nullable=False),
        sa.Column("task", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "QUEUED",
                "RUNNING",
                "COMPLETED",
                "FAILED",
                "TIMED_OUT",
                "CANCELLED",
                name="task_run_status",
            ),
            nullable=False,
        ),
        sa.Column("worker_id", sa.String(length=128), nullable=True),
        sa.Column(
            "queued_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("queue_wait_ms", sa.Double(), nullable=True),
        sa.Column("run_ms", sa.Double(), nullable=True),
        sa.Column("bytes_in", sa.BigInteger(), nullable=True),
        sa.Column("bytes_out", sa.BigInteger(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("output", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("fk_task_runs_workflow_id_workflows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_task_runs")),
        sa.UniqueConstraint(
            "workflow_id", "ref", "attempt", name=op.f("uq_task_runs_workflow_id_ref_attempt")
        ),
    )
    op.create_index("ix_task_runs_status", "task_runs", ["status"], unique=False)
    op.create_table(
        "handoffs",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=False),
        sa.Column("task_run_id", sa.BigInteger(), nullable=True),
        sa.Column("from_container", sa.String(length=128), nullable=False),
        sa.Column("to_container", sa.String(length=128), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("duration_us", sa.Double(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["task_run_id"],
            ["task_runs.id"],
            name=op.f("fk_handoffs_task_run_id_task_runs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["workflow_id"],
            ["workflows.id"],
            name=op.f("fk_handoffs_workflow_id_workflows"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_handoffs")),
    )
    op.create_index("ix_handoffs_workflow_id", "handoffs", ["workflow_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_handoffs_workflow_id", table_name="handoffs")
    op.drop_table("handoffs")
    op.drop_index("ix_task_runs_status", table_name="task_runs")
    op.drop_table("task_runs")
    op.drop_index("ix_events_workflow_id_id", table_name="events")
    op.drop_index("ix_events_at", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_workflows_status_created_at", table_name="workflows")
    op.drop_index("ix_workflows_definition_created_at", table_name="workflows")
    op.drop_index("ix_workflows_created_at", table_name="workflows")
    op.drop_table("workflows")
    op.drop_table("workflow_definitions")
    op.drop_table("task_definitions")
    # drop_table leaves the enum types behind.
    for enum_name in ("task_run_status", "data_plane", "workflow_policy", "workflow_status"):
        sa.Enum(name=enum_name).drop(op.get_bind(), checkfirst=True)
