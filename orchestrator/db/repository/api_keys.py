"""API keys: issue, list, revoke, and install the configured admin key.

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
Only a key's SHA-256 digest is stored (``orchestrator.apikeys``); the key itself is returned
once, by ``create_api_key``.
"""

from __future__ import annotations

import uuid
from typing import Final

from sqlalchemy import bindparam, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.dialects.postgresql import psycopg as psycopg_dialect
from sqlalchemy.orm import Session

from orchestrator.apikeys import ADMIN_KEY_NAME, Role, generate_key, hash_key
from orchestrator.db.models import ApiKey
from orchestrator.errors import Conflict, NotFound

__all__ = [
    "KEY_BY_HASH_SQL",
    "KEY_BY_HASH_STATEMENT",
    "create_api_key",
    "delete_api_key",
    "install_configured_key",
    "list_api_keys",
]

# What authenticating a request reads; the API runs it on its event loop as psycopg's text
# (``KEY_BY_HASH_SQL``, in ``db/async_run_store.py``).
KEY_BY_HASH_STATEMENT = select(ApiKey.id, ApiKey.name, ApiKey.role).where(
    ApiKey.key_hash == bindparam("key_hash")
)
KEY_BY_HASH_SQL: Final = str(
    KEY_BY_HASH_STATEMENT.compile(dialect=psycopg_dialect.dialect())  # type: ignore[no-untyped-call]
)


def install_configured_key(session: Session, key: str) -> None:
    """Make ``key`` the admin key named ``admin`` (``configured``), replacing an earlier one.

    Every API process does this at start-up; concurrent starts agree (one upsert each).
    """
    digest = hash_key(key)
    statement = insert(ApiKey).values(
        id=uuid.uuid4(), name=ADMIN_KEY_NAME, role=Role.ADMIN, key_hash=digest, configured=True
    )
    session.execute(
        statement.on_conflict_do_update(
            index_elements=[ApiKey.name],
            set_={"key_hash": digest, "role": Role.ADMIN, "configured": True},
        )
    )


def create_api_key(
    session: Session, name: str, role: Role, *, created_by: str | None
) -> tuple[ApiKey, str]:
    """A new key (the row and the key itself, which is not stored); ``Conflict`` if a key
    of that name exists."""
    key = generate_key()
    row: ApiKey | None = session.scalar(
        insert(ApiKey)
        .values(id=uuid.uuid4(), name=name, role=role, key_hash=hash_key(key))
        .values(created_by=created_by)
        .on_conflict_do_nothing(index_elements=[ApiKey.name])
        .returning(ApiKey)
    )
    if row is None:
        raise Conflict(f"a key named {name!r} exists already; revoke it first or pick another name")
    return row, key


def list_api_keys(session: Session) -> list[ApiKey]:
    """Every key, by name (digests included: the caller decides what to show)."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.name)))


def delete_api_key(session: Session, key_id: uuid.UUID) -> ApiKey:
    """Revoke a key; ``NotFound`` if there is none by that id, ``Conflict`` for the configured
    admin key (it comes back at the next API start)."""
    row = session.get(ApiKey, key_id, with_for_update=True)
    if row is None:
        raise NotFound("API key", key_id)
    if row.configured:
        raise Conflict(
            f"key {row.name!r} is the admin key from the API's settings (CDIFLOW_ADMIN_KEY or "
            "CDIFLOW_ADMIN_KEY_FILE); change the setting and restart the API to replace it"
        )
    session.delete(row)
    session.flush()
    return row
