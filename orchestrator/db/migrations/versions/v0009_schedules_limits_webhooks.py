"""Schedules (cron), priorities and concurrency limits, idempotent starts and tags, webhooks
and their delivery log, paused runs and paused definitions.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-10
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NOW = sa.text("now()")


def _tz(name: str, *, nullable: bool = True, **more: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable, **more)  # type: ignore[arg-type]


def upgrade() -> None:
    op.add_column("task_definitions", sa.Column("max_concurrency", sa.Integer(), nullable=True))
    op.add_column(
        "workflow_definitions",
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
    )
    op.add_column(
        "workflow_definitions", sa.Column("max_concurrent_runs", sa.Integer(), nullable=True)
    )
    op.add_column("workflow_definitions", _tz("paused_at"))

    catchup = postgresql.ENUM("skip", "latest", "all", name="schedule_catchup", create_type=False)
    catchup.create(op.get_bind(), checkfirst=True)
    op.create_table(
        "schedules",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("definition", sa.String(length=64), nullable=False),
        sa.Column("cron", sa.String(length=255), nullable=False),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column("catchup", catchup, nullable=False),
        sa.Column("grace_s", sa.Double(), nullable=False),
        sa.Column("input", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "policy",
            postgresql.ENUM(name="workflow_policy", create_type=False),
            nullable=False,
        ),
        sa.Column(
            "data_plane", postgresql.ENUM(name="data_plane", create_type=False), nullable=False
        ),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=True),
        sa.Column(
            "tags", postgresql.ARRAY(sa.String(length=64)), server_default="{}", nullable=False
        ),
        _tz("next_fire_at", nullable=False),
        _tz("paused_at"),
        _tz("last_fired_at"),
        sa.Column("last_run_id", sa.Uuid(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        _tz("created_at", nullable=False, server_default=_NOW),
        sa.ForeignKeyConstraint(
            ["definition"],
            ["workflow_definitions.name"],
            name=op.f("fk_schedules_definition_workflow_definitions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_schedules")),
        sa.UniqueConstraint("name", name=op.f("uq_schedules_name")),
    )
    op.create_index(
        "ix_schedules_next_fire_at",
        "schedules",
        ["next_fire_at"],
        postgresql_where=sa.text("paused_at IS NULL"),
    )

    op.add_column(
        "workflows", sa.Column("priority", sa.Integer(), server_default="0", nullable=False)
    )
    op.add_column(
        "workflows",
        sa.Column(
            "tags", postgresql.ARRAY(sa.String(length=64)), server_default="{}", nullable=False
        ),
    )
    op.add_column("workflows", sa.Column("idempotency_key", sa.String(length=255), nullable=True))
    op.add_column("workflows", sa.Column("request_digest", sa.String(length=64), nullable=True))
    op.add_column("workflows", sa.Column("schedule_id", sa.Uuid(), nullable=True))
    op.add_column("workflows", _tz("scheduled_for"))
    op.add_column("workflows", _tz("paused_at"))
    op.create_foreign_key(
        op.f("fk_workflows_schedule_id_schedules"),
        "workflows",
        "schedules",
        ["schedule_id"],
        ["id"],
        ondelete="SET NULL",
    )
    op.create_unique_constraint(
        op.f("uq_workflows_schedule_id_scheduled_for"),
        "workflows",
        ["schedule_id", "scheduled_for"],
    )
    op.create_index(
        "ix_workflows_pending_priority",
        "workflows",
        [sa.text("priority DESC"), "created_at", "id"],
        postgresql_where=sa.text("status = 'PENDING'"),
    )
    op.create_index(
        "ix_workflows_running_definition",
        "workflows",
        ["definition"],
        postgresql_where=sa.text("status = 'RUNNING'"),
    )
    op.create_index(
        "uq_workflows_idempotency",
        "workflows",
        ["started_by", "idempotency_key"],
        unique=True,
        postgresql_where=sa.text("idempotency_key IS NOT NULL"),
    )
    op.create_index("ix_workflows_tags", "workflows", ["tags"], postgresql_using="gin")
    op.create_index(
        "ix_workflows_input",
        "workflows",
        ["input"],
        postgresql_using="gin",
        postgresql_ops={"input": "jsonb_path_ops"},
    )

    op.create_table(
        "webhooks",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("events", postgresql.ARRAY(sa.String(length=64)), nullable=False),
        sa.Column("definition", sa.String(length=64), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=True),
        _tz("created_at", nullable=False, server_default=_NOW),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhooks")),
        sa.UniqueConstraint("name", name=op.f("uq_webhooks_name")),
    )
    status = postgresql.ENUM("PENDING", "DELIVERED", "FAILED", name="delivery_status")
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("webhook_id", sa.Uuid(), nullable=False),
        sa.Column("event", sa.String(length=64), nullable=False),
        sa.Column("workflow_id", sa.Uuid(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("status", status, nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        _tz("next_attempt_at", nullable=False, server_default=_NOW),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        _tz("created_at", nullable=False, server_default=_NOW),
        _tz("delivered_at"),
        sa.ForeignKeyConstraint(
            ["webhook_id"],
            ["webhooks.id"],
            name=op.f("fk_webhook_deliveries_webhook_id_webhooks"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index(
        "ix_webhook_deliveries_webhook_id_id", "webhook_deliveries", ["webhook_id", "id"]
    )
    op.create_index(
        "ix_webhook_deliveries_due",
        "webhook_deliveries",
        ["next_attempt_at"],
        postgresql_where=sa.text("status = 'PENDING'"),
    )


def downgrade() -> None:
    op.drop_table("webhook_deliveries")
    sa.Enum(name="delivery_status").drop(op.get_bind(), checkfirst=True)
    op.drop_table("webhooks")
    for index in (
        "ix_workflows_input",
        "ix_workflows_tags",
        "uq_workflows_idempotency",
        "ix_workflows_running_definition",
        "ix_workflows_pending_priority",
    ):
        op.drop_index(index, table_name="workflows")
    op.drop_constraint(op.f("uq_workflows_schedule_id_scheduled_for"), "workflows", type_="unique")
    op.drop_constraint(op.f("fk_workflows_schedule_id_schedules"), "workflows", type_="foreignkey")
    for column in (
        "paused_at",
        "scheduled_for",
        "schedule_id",
        "request_digest",
        "idempotency_key",
        "tags",
        "priority",
    ):
        op.drop_column("workflows", column)
    op.drop_table("schedules")
    sa.Enum(name="schedule_catchup").drop(op.get_bind(), checkfirst=True)
    op.drop_column("workflow_definitions", "paused_at")
    op.drop_column("workflow_definitions", "max_concurrent_runs")
    op.drop_column("workflow_definitions", "priority")
    op.drop_column("task_definitions", "max_concurrency")
