"""Workers and health: a worker's latest heartbeat, liveness and readiness."""

from __future__ import annotations

import enum

from pydantic import Field

from orchestrator.schemas.base import ResponseBody

__all__ = [
    "CheckPublic",
    "InputCachePublic",
    "LivenessPublic",
    "ReadinessPublic",
    "ReadinessScope",
    "WorkerPublic",
]


class ReadinessScope(enum.StrEnum):
    """What ``/api/readyz`` asks about (``?scope=``)."""

    WORKFLOWS = "workflows"
    """Can a workflow run: every part it needs (the default)."""
    API = "api"
    """Can this API process answer: Postgres and Redis, which nearly every route needs. A
    Kubernetes readiness probe asks this: a missing scheduler or no live worker must not take
    every API pod out of its Service (docs: deploy/k8s/README.md, *Probes*)."""


class InputCachePublic(ResponseBody):
    """The host's input cache as one worker sees it (docs/input-cache.md)."""

    hits: int = Field(description="This worker's inputs copied from the host's cache.")
    misses: int = Field(description="This worker's inputs fetched from S3 with the cache on.")
    saved_bytes: int = Field(description="S3 bytes this worker's hits did not fetch.")
    s3_bytes: int = Field(description="Input bytes this worker GET from S3.")
    holder: bool = Field(
        description="This worker holds the host's cache (one worker per host and uid does)."
    )
    entries: int = Field(description="Inputs the cache holds; 0 unless this worker holds it.")
    bytes: int = Field(description="Bytes those inputs' objects take; 0 unless it holds it.")


class WorkerPublic(ResponseBody):
    id: str
    host: str | None
    cpu: float | None = Field(
        description="The worker process's CPU, percent of one core (over 100 with several "
        "slots busy)."
    )
    mem: float | None = Field(
        description="The worker process's resident memory, percent of its host's memory."
    )
    rss_bytes: int | None = Field(default=None, description="The worker process's resident memory.")
    host_cpu: float | None = Field(
        default=None, description="CPU in use on the whole host, percent."
    )
    host_mem: float | None = Field(
        default=None, description="Memory in use on the whole host, percent."
    )
    queue_depth: int | None
    running: int | None
    slots: int | None = Field(description="Tasks the worker runs at once (--concurrency).")
    last_heartbeat: float | None = Field(description="Unix seconds.")
    started_at: float | None = Field(description="Unix seconds.")
    held_images: int | None = Field(
        default=None,
        description="Images the worker holds in memory between a workflow's tasks (affinity).",
    )
    held_bytes: int | None = Field(default=None, description="Bytes those images take.")
    input_cache: InputCachePublic | None = Field(
        default=None,
        description="The host's input cache as this worker sees it; null when it is off "
        "(CDIFLOW_INPUT_CACHE).",
    )
    heartbeat_age_s: float | None
    alive: bool


class LivenessPublic(ResponseBody):
    status: str = Field(description="'ok': this API process serves requests.")


class CheckPublic(ResponseBody):
    ok: bool = Field(description="False: this part keeps workflows from running.")
    detail: str = Field(description="What was seen: 'ok', or why it is unavailable.")


class ReadinessPublic(ResponseBody):
    status: str = Field(description="'ok' when every part answers, else 'unavailable'.")
    checks: dict[str, CheckPublic] | None = Field(
        default=None,
        description="postgres, redis, minion, scheduler, workers and s3 (scope 'api': postgres "
        "and redis), each with its answer; only for a caller with a key (of any role).",
    )
