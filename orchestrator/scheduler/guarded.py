"""What keeps one workflow's trouble from stopping the scheduler's loop, and what a failure
says about the scheduler's parts.

A step that raises is logged and left for a later pass (``redrive.Redrive.sweep`` places a run
with nothing under way again). The kind of failure is noted in ``Faults``, which the loop acts
on at its tick: Postgres failed a statement (what it holds may differ from memory: resync), or
the CDI minion went away (check it; if it restarted, its objects are gone).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import psycopg
import redis
from sqlalchemy.exc import DBAPIError, OperationalError

import cdi
from orchestrator.errors import ServiceError

__all__ = ["Faults", "guarded"]

log = logging.getLogger(__name__)


@dataclass
class Faults:
    """Failures the loop has yet to act on."""

    postgres: bool = False  # a statement failed on its connection: resync from Postgres
    minion: bool = False  # a CDI call found the minion gone: check it


def guarded(action: Callable[[], None], faults: Faults | None = None) -> None:
    """Run ``action``; an exception is logged, not raised: one bad workflow must not stop the
    others. What it says about Postgres or the minion goes into ``faults``."""
    try:
        action()
    except (ServiceError, OperationalError, psycopg.OperationalError) as exc:
        if isinstance(exc, ServiceError) and exc.service != "postgres":
            log.exception("scheduler step failed")
            return
        log.warning("Postgres failed (%s); resuming from what it has once it answers", exc)
        if faults is not None:
            faults.postgres = True
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            log.exception("scheduler step failed")
            return
        log.warning("Postgres dropped a connection (%s); resuming from what it has", exc)
        if faults is not None:
            faults.postgres = True
    except cdi.MinionUnavailable as exc:
        log.warning("the CDI minion is away (%s); checking it", exc)
        if faults is not None:
            faults.minion = True
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.warning("Redis failed a scheduler step (%s); a later pass goes on", exc)
    except Exception:
        log.exception("scheduler step failed")
