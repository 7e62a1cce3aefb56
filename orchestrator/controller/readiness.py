"""What ``/api/readyz`` checks: every part a workflow needs, each with a short deadline.

    postgres   SELECT 1 through the API's pool
    redis      PING
    minion     the host's CDI minion answers (``CDI_URL``; "not configured" without one)
    scheduler  some scheduler's loop turned within ``keys.SCHEDULER_STALE_S``
    workers    some worker sent a heartbeat within ``keys.WORKER_DEAD_AFTER_S`` (with none, a
               run waits for one: started, it stays RUNNING with nothing under way)
    s3         the bucket answers HeadBucket

The checks run side by side, so the answer takes as long as the slowest one (at most
``TIMEOUT_S`` each), not their sum. ``ReadinessScope.API`` asks only what the API process
itself needs to answer (``SCOPES``): a probe that decides whether the API takes requests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Final

import redis
from sqlalchemy import Engine, text

import cdi
from cdi.url import resolve_socket_path
from orchestrator.contract import keys
from orchestrator.errors import ServiceError
from orchestrator.schemas import ReadinessScope
from orchestrator.services.s3 import check_s3
from orchestrator.settings import Settings

__all__ = ["CHECKS", "SCOPES", "Check", "check_all"]

TIMEOUT_S: Final = 2.0
CHECKS: Final = ("postgres", "redis", "minion", "scheduler", "workers", "s3")
SCOPES: Final = {ReadinessScope.WORKFLOWS: CHECKS, ReadinessScope.API: ("postgres", "redis")}


@dataclass(frozen=True)
class Check:
    """One part's answer: ``ok`` False fails readiness; ``detail`` says what was seen."""

    ok: bool
    detail: str


def check_all(
    engine: Engine,
    client: redis.Redis,
    settings: Settings,
    scope: ReadinessScope = ReadinessScope.WORKFLOWS,
) -> dict[str, Check]:
    """Every check of ``scope`` (``SCOPES``), run side by side."""
    every: dict[str, Callable[[], Check]] = {
        "postgres": lambda: _postgres(engine),
        "redis": lambda: _redis(client),
        "minion": _minion,
        "scheduler": lambda: _scheduler(client),
        "workers": lambda: _workers(client),
        "s3": lambda: _s3(settings),
    }
    probes = {name: every[name] for name in SCOPES[scope]}
    with ThreadPoolExecutor(len(probes), thread_name_prefix="readyz") as pool:
        futures = {name: pool.submit(_safely, probe) for name, probe in probes.items()}
        return {name: future.result() for name, future in futures.items()}


def _safely(probe: Callable[[], Check]) -> Check:
    try:
        return probe()
    except Exception as exc:  # every failure is an answer: unavailable, and why
        reason = " ".join(str(exc).split())[:300]
        return Check(False, f"unavailable: {type(exc).__name__}: {reason}")


def _postgres(engine: Engine) -> Check:
    with engine.connect() as conn:
        conn.execute(text("SET LOCAL statement_timeout = 2000"))
        conn.execute(text("SELECT 1"))
    return Check(True, "ok")


def _redis(client: redis.Redis) -> Check:
    client.ping()
    return Check(True, "ok")


def _minion() -> Check:
    url = os.environ.get("CDI_URL")
    if not url:
        return Check(True, "not configured (CDI_URL is not set)")
    with cdi.Client(resolve_socket_path(url)) as probe:
        objects = probe.stat().get("objects", 0)
    return Check(True, f"ok ({objects} objects)")


def _scheduler(client: redis.Redis) -> Check:
    stamps = client.hgetall(keys.SCHEDULERS)
    if not stamps:
        return Check(False, "no scheduler has run its loop since Redis started")
    now = time.time()
    ages = {str(k): now - float(v) for k, v in stamps.items()}
    fresh = sorted(name for name, age in ages.items() if age < keys.SCHEDULER_STALE_S)
    if fresh:
        return Check(True, f"ok ({', '.join(fresh)})")
    newest = min(ages, key=ages.__getitem__)
    return Check(False, f"no loop turned for {ages[newest]:.0f} s (latest: {newest})")


def _workers(client: redis.Redis) -> Check:
    ids = sorted(str(i) for i in client.smembers(keys.WORKERS))
    with client.pipeline(transaction=False) as pipe:
        for worker_id in ids:
            pipe.hget(keys.worker_key(worker_id), "last_heartbeat")
        beats = pipe.execute()
    now = time.time()
    live = [w for w, beat in zip(ids, beats, strict=True) if _fresh(beat, now)]
    if live:
        shown = ", ".join(live[:_LISTED]) + (", ..." if len(live) > _LISTED else "")
        return Check(True, f"ok ({len(live)} live: {shown})")
    known = f" (known: {', '.join(ids[:_LISTED])})" if ids else ""
    return Check(
        False,
        f"no live worker: none sent a heartbeat in the last {keys.WORKER_DEAD_AFTER_S:g} s"
        f"{known}; runs wait until one does: start workers (cdiflow up --workers N, or "
        "cdiflow worker)",
    )


_LISTED: Final = 10  # workers a detail names


def _fresh(beat: str | bytes | None, now: float) -> bool:
    if beat is None:
        return False
    try:
        return now - float(beat) < keys.WORKER_DEAD_AFTER_S
    except ValueError:  # written by another process: a garbled stamp is no heartbeat
        return False


def _s3(settings: Settings) -> Check:
    secret = settings.aws_secret_access_key
    try:
        check_s3(
            settings.s3_endpoint_url,
            settings.s3_bucket,
            region=settings.aws_region,
            access_key_id=settings.aws_access_key_id,
            secret_access_key=secret.get_secret_value() if secret else None,
            timeout=TIMEOUT_S,
        )
    except ServiceError as exc:
        return Check(False, f"unavailable: {exc}")
    return Check(True, "ok")
