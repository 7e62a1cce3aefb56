"""Runs by tag, newest first, from an index of their own: ``workflow_tags``.

A list by tag matched the tag in the runs' GIN index: Postgres read every run with the tag and
sorted them to find the newest page, a cost that grew with the history (a tag on 2 % of a
million runs: twenty thousand rows for a page of fifty). ``workflow_tags`` holds a row per
(tag, run) with the run's ``created_at``, keyed ``(tag, created_at, workflow_id)``: a page by
tag walks its key from the cursor and reads only its own runs, at any size. Written by
triggers on ``workflows`` (each inserted run's tags; a run whose tags change, its rows again),
deleted with its run (``ON DELETE CASCADE``; retention deletes them in its batch). The GIN
index on ``workflows.tags`` is dropped (nothing else reads it); a list by status and tag keeps
reading the status's index, which carries the tags.

The table is filled in the transaction that creates the triggers (which holds the runs'
inserts until it ends, about a second per million tags on a 2-core machine); the GIN index is
dropped concurrently after it.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from alembic import op

from orchestrator.db.migrations.concurrently import build_concurrently, drop_concurrently

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_GIN: Final = ("ix_workflows_tags", "workflows", "USING gin (tags)")

# The inserted runs' tags (a statement's rows at once, as the API's grouped starts insert).
_TAGS_OF_INSERTED: Final = """
CREATE FUNCTION workflow_tags_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO workflow_tags (tag, created_at, workflow_id)
    SELECT DISTINCT t.tag, r.created_at, r.id FROM new_rows r, unnest(r.tags) t(tag)
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""

# A run whose tags changed: its rows again (only statements that set ``tags`` fire it).
_TAGS_OF_UPDATED: Final = """
CREATE FUNCTION workflow_tags_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM workflow_tags WHERE workflow_id = OLD.id;
    INSERT INTO workflow_tags (tag, created_at, workflow_id)
    SELECT DISTINCT t, NEW.created_at, NEW.id FROM unnest(NEW.tags) t
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute(
        "CREATE TABLE workflow_tags (tag varchar(64) NOT NULL, "
        "created_at timestamptz NOT NULL, "
        "workflow_id uuid NOT NULL "
        "CONSTRAINT fk_workflow_tags_workflow_id_workflows "
        "REFERENCES workflows (id) ON DELETE CASCADE, "
        "CONSTRAINT pk_workflow_tags PRIMARY KEY (tag, created_at, workflow_id))"
    )
    op.execute("CREATE INDEX ix_workflow_tags_workflow_id ON workflow_tags (workflow_id)")
    op.execute(_TAGS_OF_INSERTED)
    op.execute(_TAGS_OF_UPDATED)
    op.execute(
        "CREATE TRIGGER workflows_tags_insert AFTER INSERT ON workflows "
        "REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT "
        "EXECUTE FUNCTION workflow_tags_inserted()"
    )
    op.execute(
        "CREATE TRIGGER workflows_tags_update AFTER UPDATE OF tags ON workflows "
        "FOR EACH ROW WHEN (OLD.tags IS DISTINCT FROM NEW.tags) "
        "EXECUTE FUNCTION workflow_tags_updated()"
    )
    op.execute(
        "INSERT INTO workflow_tags (tag, created_at, workflow_id) "
        "SELECT DISTINCT t.tag, w.created_at, w.id FROM workflows w, unnest(w.tags) t(tag)"
    )
    op.execute("ANALYZE workflow_tags")
    with op.get_context().autocommit_block():  # (commits the above first)
        drop_concurrently(_GIN[0])


def downgrade() -> None:
    with op.get_context().autocommit_block():
        build_concurrently(*_GIN)
    op.execute("DROP TRIGGER IF EXISTS workflows_tags_update ON workflows")
    op.execute("DROP TRIGGER IF EXISTS workflows_tags_insert ON workflows")
    op.execute("DROP FUNCTION IF EXISTS workflow_tags_updated()")
    op.execute("DROP FUNCTION IF EXISTS workflow_tags_inserted()")
    op.drop_table("workflow_tags")
