"""Which schedulers are alive, and who takes over the workflows of one that died (Postgres).

The scheduler's loop keeps one ``SchedulerLiveness`` (its reconciler's side in Postgres).

Every scheduler holds, on a connection of its own, a Postgres advisory lock named after its id
for as long as it lives: the kernel closes a dead process's connection and Postgres drops its
locks, so "its lock is held" is the truth about "it runs" without heartbeats to write. One
scheduler at a time also holds the *lease* (another advisory lock): it alone takes over the
RUNNING workflows of schedulers whose lock has been missing for ``dead_after_s`` (as many as it
has room for; the rest at its next turns) and drives them again from their input, each step's
attempts going on from what Postgres has (``scheduler.claims.Claims.resume``). *Why a lease:*
two schedulers taking over the same rows would fight; the lease makes one do it, and whoever
holds it when its holder dies takes over at once. *Why a grace:* after a Postgres restart every lock
is gone until each scheduler has reconnected; a scheduler is declared dead only once its lock
has stayed missing that long, and the release checks again in the same statement.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any, Final, LiteralString

import psycopg
from sqlalchemy import Engine
from sqlalchemy.pool import PoolProxiedConnection

__all__ = ["LEASE_KEY", "LIVENESS_CLASS", "SchedulerLiveness", "alive_schedulers_sql"]

log = logging.getLogger(__name__)

LIVENESS_CLASS: Final = 0x0CD1F  # advisory lock (class, hashtext(scheduler id)) per scheduler
LEASE_CLASS: Final = 0x0CD20
LEASE_KEY: Final = 1
DEAD_AFTER_S: Final = 15.0

# A lock (class, key) taken with the two-int form shows in pg_locks as classid, objid and
# objsubid 2, in the database it was taken in.
_HELD: Final[LiteralString] = """
EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.classid = %(cls)s::oid AND l.objid = (hashtext({who}))::oid
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()))
"""


def alive_schedulers_sql(who: LiteralString) -> LiteralString:
    """A SQL condition: the scheduler named by expression ``who`` holds its liveness lock
    (parameter ``cls`` = ``LIVENESS_CLASS``)."""
    return _HELD.replace("{who}", who)


_ORPHANED: Final[LiteralString] = """
SELECT DISTINCT claimed_by FROM workflows w
WHERE status = 'RUNNING' AND claimed_by IS NOT NULL AND claimed_by <> %(me)s
  AND NOT """ + alive_schedulers_sql("w.claimed_by")

_TAKE_OVER: Final[LiteralString] = (
    """
WITH orphans AS (
    SELECT id, claimed_by FROM workflows w
    WHERE status = 'RUNNING' AND claimed_by = ANY(%(dead)s)
      AND NOT """
    + alive_schedulers_sql("w.claimed_by")
    + """
    ORDER BY created_at, id
    LIMIT %(room)s
    FOR UPDATE SKIP LOCKED
), taken AS (
    UPDATE workflows w SET claimed_by = %(me)s, claimed_at = now()
    FROM orphans o WHERE w.id = o.id
    RETURNING w.id, o.claimed_by AS was
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT id, 'workflow.taken_over', jsonb_build_object('from', was, 'by', %(me)s::text)
    FROM taken
)
SELECT id FROM taken
"""
)


class SchedulerLiveness:
    """A scheduler's liveness lock and, while it holds the lease, the take-over of dead
    schedulers' workflows. Only the scheduler's loop thread calls it."""

    def __init__(
        self, engine: Engine, scheduler_id: str, *, dead_after_s: float = DEAD_AFTER_S
    ) -> None:
        self._engine = engine
        self.scheduler_id = scheduler_id
        self.dead_after_s = dead_after_s
        self._pooled: PoolProxiedConnection | None = None
        self.leader = False
        self._missing_since: dict[str, float] = {}  # scheduler id -> monotonic, lock missing

    def start(self) -> None:
        """Take this scheduler's liveness lock (before it resumes its workflows, so no lease
        holder releases them meanwhile); ``psycopg.OperationalError`` while Postgres is away."""
        self._connection()

    def tick(self, room: int) -> list[uuid.UUID]:
        """Keep the locks; as lease holder, take over up to ``room`` workflows that dead
        schedulers left RUNNING (they are ours then: resume them). Their ids."""
        try:
            conn = self._connection()
            if not self.leader:
                self.leader = _try_lock(conn, LEASE_CLASS, LEASE_KEY)
                if self.leader:
                    log.info("scheduler %s holds the reconciler's lease", self.scheduler_id)
                    self._missing_since.clear()  # count anew: locks may be coming back
            if not self.leader:
                return []
            return self._take_over(conn, room) if room > 0 else []
        except psycopg.OperationalError:
            self.close()
            raise

    def close(self) -> None:
        """Drop the connection (and with it the locks)."""
        pooled, self._pooled = self._pooled, None
        self.leader = False
        if pooled is not None:
            pooled.invalidate()  # autocommit was changed, locks are held: never pool it again

    def _take_over(self, conn: psycopg.Connection[tuple[Any, ...]], room: int) -> list[uuid.UUID]:
        now = time.monotonic()
        params = {"me": self.scheduler_id, "cls": LIVENESS_CLASS}
        missing = {str(row[0]) for row in conn.execute(_ORPHANED, params).fetchall()}
        for gone in set(self._missing_since) - missing:
            del self._missing_since[gone]
        for name in missing:
            self._missing_since.setdefault(name, now)
        dead = [n for n, since in self._missing_since.items() if now - since >= self.dead_after_s]
        if not dead:
            return []
        rows = conn.execute(_TAKE_OVER, {**params, "dead": dead, "room": room}).fetchall()
        taken = [row[0] for row in rows]
        if taken:
            log.warning("took over %d workflow(s) of stopped scheduler(s) %s",
                        len(taken), ", ".join(sorted(dead)))  # fmt: skip
        return taken

    def _connection(self) -> psycopg.Connection[tuple[Any, ...]]:
        if self._pooled is None:
            pooled = self._engine.raw_connection()
            driver = pooled.driver_connection
            assert isinstance(driver, psycopg.Connection)
            driver.rollback()  # autocommit can change only outside a transaction
            driver.autocommit = True
            self._pooled = pooled
            self.leader = False
            if not _try_lock(driver, LIVENESS_CLASS, self.scheduler_id):
                log.error(
                    "another scheduler holds the id %r (its liveness lock is taken); give each "
                    "scheduler an id of its own",
                    self.scheduler_id,
                )
        driver = self._pooled.driver_connection
        assert isinstance(driver, psycopg.Connection)
        return driver


def _try_lock(conn: psycopg.Connection[tuple[Any, ...]], cls: int, key: int | str) -> bool:
    if isinstance(key, str):
        row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (cls, key)).fetchone()
    else:
        row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (cls, key)).fetchone()
    return bool(row and row[0])
