"""Alembic environment: runs on a connection handed in by ``orchestrator.db.migrate``.

From the command line (to write a new revision after changing ``models.py``)::

    alembic -c orchestrator/db/alembic.ini -x url=postgresql+psycopg://... \
        revision --autogenerate -m "what changed"

The URL comes from ``-x url=``, else ``DATABASE_URL``.
"""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import Connection

from orchestrator.db.engine import make_engine
from orchestrator.db.models import Base
from orchestrator.errors import ConfigError

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or os.environ.get("DATABASE_URL")
    if not url:
        raise ConfigError("no database: pass -x url=postgresql+psycopg://... or set DATABASE_URL")
    return url


def _run(connection: Connection) -> None:
    # A transaction per revision: a revision may leave it for work that cannot run inside one
    # (``CREATE INDEX CONCURRENTLY``, in an ``autocommit_block``).
    context.configure(
        connection=connection, target_metadata=target_metadata, transaction_per_migration=True
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """Emit SQL to stdout instead of running it (``alembic upgrade head --sql``)."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    """Run against the connection from ``migrate()``, or one opened from the URL."""
    connection = config.attributes.get("connection")
    if isinstance(connection, Connection):
        _run(connection)
        return
    engine = make_engine(_url(), pooled=False)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
