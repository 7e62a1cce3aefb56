"""Announcements over Redis that any part of the orchestrator may make (hints, never truth).

A lost announcement costs latency only: whoever listens also looks at Postgres now and then.
"""

from __future__ import annotations

import logging
import uuid

import redis

from orchestrator import keys

__all__ = ["announce_finished"]

log = logging.getLogger(__name__)


def announce_finished(client: redis.Redis, workflow_id: uuid.UUID) -> None:
    """Tell requests waiting on ``workflow_id`` that it ended; call after the commit."""
    try:
        client.publish(keys.FINISHED, str(workflow_id))
    except redis.RedisError as exc:
        log.warning("could not announce the end of workflow %s: %s", workflow_id, exc)
