"""Schedules as the API sees them: make, list, read, pause, resume, delete. Their firing is the
schedulers' (``db.schedule_store``).

Functions take the caller's ``Session`` and never commit: the caller owns the transaction.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from orchestrator.cron import Cron
from orchestrator.db.models import Schedule
from orchestrator.db.repository.definitions import (
    get_workflow_definition,
    get_workflow_definition_version,
)
from orchestrator.errors import Conflict, NotFound

__all__ = [
    "create_schedule",
    "delete_schedule",
    "get_schedule",
    "list_schedules",
    "pause_schedule",
]


def create_schedule(session: Session, values: dict[str, Any], *, paused: bool) -> Schedule:
    """A new schedule (``values``: the columns); its first tick is the first after now.
    ``InvalidRequest`` for an expression or zone that is not one, ``Conflict`` if the name
    is taken, ``NotFound`` if its definition (or the version it names) does not exist."""
    get_workflow_definition(session, values["definition"])
    if values.get("version") is not None:
        get_workflow_definition_version(session, values["definition"], values["version"])
    cron = Cron.of(values["cron"], values["timezone"])
    first = cron.next_after(datetime.now(UTC))
    row: Schedule | None = session.scalar(
        insert(Schedule)
        .values(**values, next_fire_at=first, paused_at=func.now() if paused else None)
        .on_conflict_do_nothing(index_elements=[Schedule.name])
        .returning(Schedule)
    )
    if row is None:
        raise Conflict(
            f"a schedule named {values['name']!r} exists already; delete it first or pick "
            "another name"
        )
    return row


def list_schedules(session: Session, definition: str | None = None) -> list[Schedule]:
    """Every schedule (of ``definition``), by name."""
    query = select(Schedule).order_by(Schedule.name)
    if definition is not None:
        query = query.where(Schedule.definition == definition)
    return list(session.scalars(query))


def get_schedule(session: Session, name: str, *, lock: bool = False) -> Schedule:
    """The schedule ``name``; ``lock``: its row is held until the transaction ends (a
    scheduler firing it waits, or is waited for)."""
    query = select(Schedule).where(Schedule.name == name)
    found = session.scalar(query.with_for_update() if lock else query)
    if found is None:
        names = list(session.scalars(select(Schedule.name).order_by(Schedule.name).limit(50)))
        raise NotFound("schedule", name, known=names)
    return found


def pause_schedule(session: Session, name: str, *, paused: bool) -> Schedule:
    """Pause (``paused``) or resume a schedule. A resumed one fires from the first tick after
    now: the ticks it was paused over are not caught up. Asking again changes nothing."""
    row = get_schedule(session, name, lock=True)
    if paused and row.paused_at is None:
        row.paused_at = func.now()
    elif not paused and row.paused_at is not None:
        cron = Cron.of(row.cron, row.timezone)
        row.paused_at = None
        row.next_fire_at = cron.next_after(datetime.now(UTC))
    session.flush()
    session.refresh(row)
    return row


def delete_schedule(session: Session, name: str) -> None:
    """Delete a schedule; the runs it made stay (their ``schedule_id`` is cleared)."""
    row = get_schedule(session, name, lock=True)
    session.delete(row)
    session.flush()
