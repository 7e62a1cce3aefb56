"""Alembic migrations of the orchestrator database; run them with ``orchestrator.db.migrate``."""
