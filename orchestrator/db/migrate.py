"""Bring the database schema to the newest Alembic revision, at start-up, from any process."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from orchestrator.db.engine import make_engine
from orchestrator.errors import ServiceError

__all__ = ["MIGRATIONS_DIR", "alembic_config", "current_revision", "head_revision", "migrate"]

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Arbitrary constant shared by every cdiflow process: the advisory lock serialising migrations
# (0x6364_6966 is "cdif"). Held by the migrating session, so a crashed migrator (its connection
# gone) cannot leave it held.
_MIGRATION_LOCK = 0x6364_6966_6D69_6772
_LOCK_POLL_S = 0.2


def alembic_config() -> Config:
    """An Alembic config pointing at the bundled migrations (no ini file needed)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    return config


def head_revision() -> str | None:
    """The newest revision shipped with this code."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at (``None`` before the first migration)."""
    return MigrationContext.configure(connection).get_current_revision()


def migrate(database_url: str) -> str | None:
    """Upgrade the database at ``database_url`` to the head revision; return that revision.

    Safe to call from several processes at once: each takes a Postgres advisory lock first, so
    one migrates while the others wait, then find nothing left to do. The others wait between
    short statements (``pg_try_advisory_lock``), never inside one: a statement waiting on the
    lock would hold a snapshot that a ``CREATE INDEX CONCURRENTLY`` of the migrator waits for.
    Each revision runs in its own transaction (Postgres DDL is transactional), so a failure
    leaves the schema at the last revision that completed; a revision that builds indexes
    concurrently does that outside its transaction, idempotently, and is run again whole.
    Raises ``ServiceError`` when the database cannot be reached, a migration fails, or the
    database is at a revision this code does not know.
    """
    engine = make_engine(database_url, pooled=False)
    try:
        with engine.connect() as conn:
            _lock(conn)
            try:
                before = current_revision(conn)
                conn.commit()  # Alembic begins a transaction of its own per revision
                config = alembic_config()
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
                after = current_revision(conn)
                conn.commit()
            finally:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": _MIGRATION_LOCK})
                conn.commit()
    except SQLAlchemyError as exc:
        raise ServiceError(
            f"could not migrate the database: {exc.__class__.__name__}: {exc}",
            service="postgres",
        ) from exc
    except CommandError as exc:  # typically a revision newer than this code knows
        raise ServiceError(
            f"could not migrate the database: {exc}; is it used by a newer cdiflow?",
            service="postgres",
        ) from exc
    finally:
        engine.dispose()
    if before != after:
        log.info("database migrated from %s to %s", before or "empty", after)
    return after


def _lock(conn: Connection) -> None:
    """Take the migration lock for this session, waiting between attempts."""
    while True:
        taken = conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": _MIGRATION_LOCK})
        conn.commit()
        if taken:
            return
        time.sleep(_LOCK_POLL_S)
