"""Indexes built and dropped without holding a table's writes (``CREATE INDEX CONCURRENTLY``),
for revisions that index tables with millions of rows. Run inside
``op.get_context().autocommit_block()``: a concurrent build cannot run in a transaction."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

__all__ = ["build_concurrently", "drop_concurrently"]


def build_concurrently(name: str, table: str, definition: str) -> None:
    """Build index ``name`` unless it is there and valid: a build that failed part-way left
    an invalid one, dropped first, so an upgrade stopped half-way is simply run again."""
    invalid = op.get_bind().scalar(
        sa.text(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = :name"
        ),
        {"name": name},
    )
    if invalid:
        drop_concurrently(name)
    op.execute(f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {definition}")


def drop_concurrently(name: str) -> None:
    op.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
