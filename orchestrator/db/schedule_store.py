"""The schedulers' side of schedules in Postgres: make the runs of due ticks, each exactly once.

Every scheduler looks for due schedules; one transaction locks those due (``FOR UPDATE SKIP
LOCKED``: two schedulers never handle the same schedule at once), works out in Python which
ticks to fire (``cron.Cron.to_fire``: the catch-up policy), inserts their runs and moves each
schedule's ``next_fire_at`` past them, and commits all of it at once. A scheduler killed
midway commits nothing, and the next one to look does the same ticks; the unique
``(schedule_id, scheduled_for)`` of ``workflows`` makes a tick's run once whatever happens.
The time is Postgres' (``now()``), so schedulers on machines whose clocks differ agree.

Only the scheduler's loop thread uses a ``ScheduleStore``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, LiteralString
from zoneinfo import ZoneInfo

import psycopg

from orchestrator.contract.vocabulary import CatchUp
from orchestrator.cron import Cron
from orchestrator.db.scheduler_store import SchedulerStore
from orchestrator.errors import OrchestratorError, ServiceError

__all__ = ["MOST_SCHEDULES", "MOST_TICKS", "Fired", "ScheduleStore"]

MOST_SCHEDULES: Final = 16  # schedules handled by one look
MOST_TICKS: Final = 100  # runs one look makes of one schedule (catching up goes on next look)

_DUE: Final[LiteralString] = """
SELECT s.id, s.name, s.cron, s.timezone, s.catchup::text, s.grace_s, s.next_fire_at, now()
FROM schedules s
WHERE s.paused_at IS NULL AND s.next_fire_at <= now()
ORDER BY s.next_fire_at
LIMIT %(most)s
FOR UPDATE SKIP LOCKED
"""

# The runs of the ticks to fire (one per (schedule, tick); a definition deleted since makes
# none and says so in ``last_error``), their events, and each schedule's next tick.
_FIRE: Final[LiteralString] = """
WITH fire AS (
    SELECT f.id, f.schedule_id, f.tick
    FROM unnest(%(ids)s::uuid[], %(schedules)s::uuid[], %(ticks)s::timestamptz[])
         AS f(id, schedule_id, tick)
), w AS (
    INSERT INTO workflows (id, definition, definition_version, status, policy, data_plane,
                           input, started_by, priority, tags, schedule_id, scheduled_for)
    SELECT f.id, d.name, coalesce(s.version, d.version), 'PENDING', s.policy, s.data_plane,
           s.input, s.created_by, coalesce(s.priority, d.priority), s.tags, s.id, f.tick
    FROM fire f
    JOIN schedules s ON s.id = f.schedule_id
    JOIN workflow_definitions d ON d.name = s.definition AND d.deleted_at IS NULL
    FOR KEY SHARE OF d
    ON CONFLICT DO NOTHING
    RETURNING id, definition, policy, data_plane, schedule_id, scheduled_for
), ev AS (
    INSERT INTO events (workflow_id, kind, data)
    SELECT w.id, 'workflow.created', jsonb_build_object(
        'workflow', w.definition, 'policy', w.policy, 'data_plane', w.data_plane,
        'schedule', s.name, 'scheduled_for', w.scheduled_for, 'by', s.created_by)
    FROM w JOIN schedules s ON s.id = w.schedule_id
), moved AS (
    UPDATE schedules s
    SET next_fire_at = u.next,
        last_fired_at = coalesce(u.fired, s.last_fired_at),
        last_run_id = coalesce((SELECT w.id FROM w WHERE w.schedule_id = s.id
                                ORDER BY w.scheduled_for DESC LIMIT 1), s.last_run_id),
        last_error = CASE
            WHEN u.fired IS NULL THEN s.last_error
            WHEN EXISTS (SELECT 1 FROM workflow_definitions d
                         WHERE d.name = s.definition AND d.deleted_at IS NULL) THEN NULL
            ELSE 'workflow definition ' || s.definition || ' is deleted: no run was made; '
                 || 'create it again, or delete this schedule'
        END
    FROM unnest(%(u_ids)s::uuid[], %(u_next)s::timestamptz[], %(u_fired)s::timestamptz[])
         AS u(id, next, fired)
    WHERE s.id = u.id
)
SELECT count(*) FROM w
"""

_NEXT_DUE: Final[LiteralString] = (
    "SELECT min(next_fire_at), now() FROM schedules WHERE paused_at IS NULL"
)


@dataclass(frozen=True)
class Fired:
    """What a look did: runs made, and how long until the next tick of any schedule is due
    (None: no active schedule)."""

    runs: int
    next_due_s: float | None


class ScheduleStore:
    """Makes the runs of due ticks, on the scheduler's own connection (``SchedulerStore``)."""

    def __init__(self, store: SchedulerStore) -> None:
        self._store = store

    def fire_due(self) -> Fired:
        """Make the runs of every due schedule's ticks (those another scheduler handles right
        now are left to it), in one transaction."""
        conn = self._store.connection()
        try:
            with conn.transaction():
                due = conn.execute(_DUE, {"most": MOST_SCHEDULES}).fetchall()
                made = self._fire(conn, due) if due else 0
            row = conn.execute(_NEXT_DUE).fetchone()
        except psycopg.OperationalError as exc:
            self._store.close()  # the next call reconnects
            raise ServiceError(
                f"Postgres failed a schedule's statement: {exc}", service="postgres"
            ) from exc
        next_due = None
        if row is not None and row[0] is not None:
            next_due = max(0.0, (row[0] - row[1]).total_seconds())
        return Fired(made, next_due)

    def _fire(self, conn: psycopg.Connection[tuple[Any, ...]], due: list[tuple[Any, ...]]) -> int:
        runs: list[tuple[uuid.UUID, uuid.UUID, datetime]] = []
        moves: list[tuple[uuid.UUID, datetime, datetime | None]] = []
        for schedule_id, _name, expression, zone, catchup, grace_s, first, now in due:
            try:
                cron = Cron(expression, ZoneInfo(zone))
                ticks, after = cron.to_fire(first, now, CatchUp(catchup), grace_s, MOST_TICKS)
            except (OrchestratorError, ValueError, KeyError):
                continue  # checked when it was made; a tz database that lost the zone: wait
            runs += [(uuid.uuid4(), schedule_id, tick) for tick in ticks]
            moves.append((schedule_id, after, ticks[-1] if ticks else None))
        params = {
            "ids": [r[0] for r in runs],
            "schedules": [r[1] for r in runs],
            "ticks": [r[2] for r in runs],
            "u_ids": [m[0] for m in moves],
            "u_next": [m[1] for m in moves],
            "u_fired": [m[2] for m in moves],
        }
        row = conn.execute(_FIRE, params).fetchone()
        return int(row[0]) if row else 0
