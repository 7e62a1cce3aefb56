"""The webhook deliverer's statements: take due deliveries, record each attempt's outcome.

A delivery is taken by pushing its ``next_attempt_at`` a lease ahead (``FOR UPDATE SKIP
LOCKED``: several deliverers never take the same one) and counting the attempt; the HTTP
request is then sent outside any transaction. A deliverer that dies mid-request leaves the
delivery to be taken again once the lease has passed: a receiver may get an event twice
(the same ``webhook-id``), never not at all while attempts are left.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final, LiteralString

import psycopg
from sqlalchemy import Engine
from sqlalchemy.pool import PoolProxiedConnection

from orchestrator.errors import ServiceError

__all__ = ["DeliveryStore", "Due"]

_TAKE: Final[LiteralString] = """
WITH due AS (
    SELECT id FROM webhook_deliveries
    WHERE status = 'PENDING' AND next_attempt_at <= now()
    ORDER BY next_attempt_at, id
    LIMIT %(most)s
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE webhook_deliveries d
    SET attempts = d.attempts + 1,
        next_attempt_at = now() + make_interval(secs => %(lease_s)s::float8)
    FROM due WHERE d.id = due.id
    RETURNING d.id, d.webhook_id, d.event, d.payload, d.attempts
)
SELECT t.id, t.event, t.payload, t.attempts, h.id, h.name, h.url, h.secret
FROM taken t JOIN webhooks h ON h.id = t.webhook_id
ORDER BY t.id
"""

_DELIVERED: Final[LiteralString] = """
UPDATE webhook_deliveries
SET status = 'DELIVERED', delivered_at = now(), last_status = %(code)s, last_error = NULL
WHERE id = %(id)s
"""

# A failed attempt: again after ``backoff_s``, or FAILED once ``most`` attempts were made.
_FAILED: Final[LiteralString] = """
UPDATE webhook_deliveries
SET last_status = %(code)s, last_error = %(error)s,
    status = CASE WHEN attempts >= %(most)s THEN 'FAILED' ELSE 'PENDING' END::delivery_status,
    next_attempt_at = now() + make_interval(secs => %(backoff_s)s::float8)
WHERE id = %(id)s
"""


@dataclass(frozen=True)
class Due:
    """A delivery taken for an attempt, with its webhook."""

    id: int
    event: str
    payload: dict[str, Any]
    attempt: int
    webhook_id: uuid.UUID
    webhook: str  # its name, for the log
    url: str
    secret: str

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"Due(id={self.id}, event={self.event!r}, webhook={self.webhook!r})"


class DeliveryStore:
    """The deliverer's connection (its thread's alone)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._pooled: PoolProxiedConnection | None = None

    def take(self, most: int, lease_s: float) -> list[Due]:
        rows = self._run(_TAKE, {"most": most, "lease_s": lease_s})
        return [Due(*row) for row in rows]

    def delivered(self, delivery_id: int, code: int) -> None:
        self._run(_DELIVERED, {"id": delivery_id, "code": code})

    def failed(
        self, delivery_id: int, code: int | None, error: str, backoff_s: float, most: int
    ) -> None:
        params = {"id": delivery_id, "code": code, "error": error, "backoff_s": backoff_s}
        self._run(_FAILED, {**params, "most": most})

    def close(self) -> None:
        if self._pooled is not None:
            pooled, self._pooled = self._pooled, None
            pooled.invalidate()

    def _run(self, statement: LiteralString, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        try:
            if self._pooled is None:
                self._pooled = self._engine.raw_connection()
                driver = self._pooled.driver_connection
                assert isinstance(driver, psycopg.Connection)
                driver.rollback()
                driver.autocommit = True
            conn = self._pooled.driver_connection
            assert isinstance(conn, psycopg.Connection)
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []
        except psycopg.OperationalError as exc:
            self.close()
            raise ServiceError(
                f"Postgres failed a delivery's statement: {exc}", service="postgres"
            ) from exc
