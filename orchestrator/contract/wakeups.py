"""Hints over Redis that something in Postgres changed: the scheduler's wake-ups and the
announcement that a workflow ended.

Each is sent after the commit it points at, and each may be lost (Redis restarts, a process
dies between its commit and its push): whoever listens also looks at Postgres now and then, so
a lost hint costs latency only. A failure to send one is therefore logged, never raised.

* Wake-ups (``keys.WAKE``, a list): a bare workflow id for a run to claim (created or
  retried), ``cancel:<id>`` for a cancelled one, ``pause:<id>`` for one paused or resumed,
  ``claim`` when runs may be claimable without a new one (a definition's queue resumed) and
  ``schedules`` when a schedule changed (the scheduler looks for due ticks at once). *Why
  several kinds:* a claim takes many runs at once, so most wake-ups name a run already
  claimed; only a cancellation or a pause makes the scheduler look a run up.
* Finish announcements (``keys.FINISHED``, a pub/sub channel): a workflow id once its end is
  committed, for the API's long polls.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Final, NamedTuple

import redis
import redis.asyncio

from orchestrator.contract import keys

__all__ = [
    "CLAIM",
    "SCHEDULES",
    "Wake",
    "announce_finished",
    "read_wake",
    "wake_for_starts",
    "wake_message",
    "wake_scheduler",
]

log = logging.getLogger(__name__)

_CANCEL: Final = "cancel:"
_PAUSE: Final = "pause:"
CLAIM: Final = "claim"  # runs may be claimable (a definition's queue resumed)
SCHEDULES: Final = "schedules"  # a schedule was made, changed or resumed


def wake_message(workflow_id: uuid.UUID, *, cancel: bool = False, pause: bool = False) -> str:
    """What goes on ``keys.WAKE`` for ``workflow_id`` (created or retried; ``cancel``:
    cancelled; ``pause``: paused or resumed)."""
    prefix = _CANCEL if cancel else _PAUSE if pause else ""
    return f"{prefix}{workflow_id}"


class Wake(NamedTuple):
    """A wake-up as the scheduler reads it; ``workflow_id`` is None for one it cannot read
    (then it simply looks for work), and for ``schedules``."""

    workflow_id: uuid.UUID | None
    cancel: bool
    pause: bool = False
    schedules: bool = False


def read_wake(message: str) -> Wake:
    """The wake-up ``message`` (``wake_message``, ``CLAIM`` or ``SCHEDULES``) says."""
    if message == SCHEDULES:
        return Wake(None, False, schedules=True)
    cancel, pause = message.startswith(_CANCEL), message.startswith(_PAUSE)
    try:
        return Wake(uuid.UUID(message.removeprefix(_CANCEL).removeprefix(_PAUSE)), cancel, pause)
    except ValueError:
        return Wake(None, cancel)


def wake_scheduler(
    client: redis.Redis,
    workflow_id: uuid.UUID | None,
    *,
    cancel: bool = False,
    pause: bool = False,
    what: str = CLAIM,
) -> None:
    """Tell the schedulers ``workflow_id`` was created, retried, (``cancel``) cancelled or
    (``pause``) paused or resumed; without a run, ``what`` (``CLAIM``, ``SCHEDULES``)."""
    message = what if workflow_id is None else wake_message(workflow_id, cancel=cancel, pause=pause)
    try:
        client.lpush(keys.WAKE, message)
    except redis.RedisError as exc:
        log.warning("could not wake the scheduler (%s): %s", message, exc)


async def wake_for_starts(client: redis.asyncio.Redis, workflow_ids: Sequence[uuid.UUID]) -> None:
    """Wake the schedulers once for ``workflow_ids``, started by one commit, from an event loop.
    *Why once:* a claim takes every run waiting, so one wake-up brings them all in."""
    if not workflow_ids:
        return
    try:
        await client.lpush(keys.WAKE, wake_message(workflow_ids[-1]))
    except redis.RedisError as exc:
        log.warning("could not wake the scheduler for %d new runs: %s", len(workflow_ids), exc)


def announce_finished(client: redis.Redis, workflow_id: uuid.UUID) -> None:
    """Tell requests waiting on ``workflow_id`` that it ended."""
    try:
        client.publish(keys.FINISHED, str(workflow_id))
    except redis.RedisError as exc:
        log.warning("could not announce the end of workflow %s: %s", workflow_id, exc)
