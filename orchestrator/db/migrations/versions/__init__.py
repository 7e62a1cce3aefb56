"""Alembic revisions, oldest first (file names carry the order)."""
