"""``/api/workers``: the workers' latest heartbeats, from Redis."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping

from fastapi import APIRouter

from orchestrator.contract import keys
from orchestrator.controller.api.deps import RedisDep
from orchestrator.controller.strict_json import StrictJsonRoute
from orchestrator.schemas import InputCachePublic, WorkerPublic, error_responses

router = APIRouter(prefix="/workers", tags=["workers"], route_class=StrictJsonRoute)


def _number(fields: Mapping[str, str], name: str) -> float | None:
    # Heartbeats are written by another process: a missing or garbled field reads as unknown.
    try:
        value = float(fields[name])
    except (KeyError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _count(fields: Mapping[str, str], name: str) -> int | None:
    value = _number(fields, name)
    return None if value is None else int(value)


def worker_status(worker_id: str, fields: Mapping[str, str], now: float) -> WorkerPublic:
    """One worker's heartbeat hash as reported by the API; ``now`` in unix seconds.

    A worker is alive while its last heartbeat is younger than ``keys.WORKER_DEAD_AFTER_S``
    (three heartbeat intervals); one whose hash has expired or never held a heartbeat is not.
    """
    last = _number(fields, "last_heartbeat")
    age = None if last is None else max(0.0, now - last)
    return WorkerPublic(
        id=worker_id,
        host=fields.get("host") or None,
        cpu=_number(fields, "proc_cpu"),
        mem=_number(fields, "proc_mem"),
        rss_bytes=_count(fields, "proc_rss"),
        host_cpu=_number(fields, "cpu"),
        host_mem=_number(fields, "mem"),
        queue_depth=_count(fields, "queue_depth"),
        running=_count(fields, "running"),
        slots=_count(fields, "slots"),
        last_heartbeat=last,
        started_at=_number(fields, "started_at"),
        held_images=_count(fields, "held_images"),
        held_bytes=_count(fields, "held_bytes"),
        input_cache=_input_cache(fields),
        heartbeat_age_s=age,
        alive=age is not None and age < keys.WORKER_DEAD_AFTER_S,
    )


def _input_cache(fields: Mapping[str, str]) -> InputCachePublic | None:
    """The ``input_cache_*`` fields; None when the cache is off (or any is missing)."""
    names = ("hits", "misses", "saved_bytes", "s3_bytes", "holder", "entries", "bytes")
    counts = {name: _count(fields, f"input_cache_{name}") for name in names}
    values = {name: count for name, count in counts.items() if count is not None}
    if len(values) != len(names):
        return None
    return InputCachePublic(
        hits=values["hits"],
        misses=values["misses"],
        saved_bytes=values["saved_bytes"],
        s3_bytes=values["s3_bytes"],
        holder=bool(values["holder"]),
        entries=values["entries"],
        bytes=values["bytes"],
    )


@router.get("", responses=error_responses(503))
def list_workers(client: RedisDep) -> list[WorkerPublic]:
    """Every worker that has registered, by id, with ``alive`` false once it falls silent."""
    ids = sorted(str(i) for i in client.smembers(keys.WORKERS))
    with client.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hgetall(keys.worker_key(worker_id))
        hashes = pipe.execute()
    now = time.time()
    return [worker_status(i, h, now) for i, h in zip(ids, hashes, strict=True)]
