"""Every Redis key the orchestrator uses, in one place.

Redis holds only what can be rebuilt from Postgres (wake-ups, queues, heartbeats), so losing it
costs latency, never correctness. Build keys with the helpers below rather than formatting
strings at the call site, so a rename happens here once. What goes on the wake-up list and the
finish channel is written and read in ``contract.wakeups``.
"""

from __future__ import annotations

import re
import uuid
from typing import Final

__all__ = [
    "CONTROL_TTL_S",
    "EPOCH",
    "FINISHED",
    "HEARTBEAT_INTERVAL_S",
    "SCHEDULERS",
    "SCHEDULER_STALE_S",
    "STREAM_PEERS_TTL_S",
    "WAKE",
    "WORKERS",
    "WORKER_DEAD_AFTER_S",
    "WORKER_FIELDS",
    "WORKER_PREFIX",
    "report_bell_key",
    "reports_taken_key",
    "scheduler_reports_key",
    "stream_peers_key",
    "task_leases_key",
    "worker_control_key",
    "worker_inflight_key",
    "worker_key",
    "worker_queue_key",
    "workflow_of_object",
]

# List of wake-ups (``contract.wakeups``): the controller LPUSHes one after committing a change
# the scheduler must act on (created, cancelled, retried); the scheduler BRPOPs it. A wake-up is
# a hint only: the scheduler also polls Postgres, since a push can be lost with Redis.
WAKE: Final = "cdiflow:wake"


# Pub/sub channel: a workflow id, published once the workflow's end (completed, failed,
# cancelled) is committed; the API wakes the requests waiting for it (long polls).
FINISHED: Final = "cdiflow:finished"

# Set of worker ids that have ever heartbeated; ``GET /api/workers`` lists these.
WORKERS: Final = "cdiflow:workers"

# Prefix of a worker's heartbeat hash, ``cdiflow:worker:<id>``; see ``worker_key``.
WORKER_PREFIX: Final = "cdiflow:worker:"

# Fields of the heartbeat hash, all written as strings by the worker:
#   cpu, mem         percent in use on the worker's host (floats, 0-100): placement's
#                    tie-breaker, as a busy host slows every worker on it
#   proc_cpu         the worker process's own CPU, percent of one core (float; may pass 100
#                    with several slots)
#   proc_rss         the worker process's resident memory, bytes (int)
#   proc_mem         that memory as a percent of its host's (float)
#   queue_depth      instructions waiting in the worker's queue (int)
#   running          tasks running now (int)
#   slots            tasks the worker runs at once, its --concurrency (int)
#   host             host name the worker runs on
#   last_heartbeat   unix seconds (float) of the latest heartbeat
#   started_at       unix seconds (float) the worker process started
#   held_images      images held in memory between a workflow's tasks (int)
#   held_bytes       bytes those images take (int)
#   tasks            the task code the worker loaded: ``workflows.loader.TaskCatalog`` JSON
#                    (modules with their @task settings, and modules that failed to import)
#   input_cache_*    the host's input cache as this worker sees it (docs/input-cache.md), all
#                    empty strings when the cache is off: ``hits``, ``misses`` (its own fetches
#                    through the cache, ints), ``saved_bytes`` (S3 bytes its hits spared),
#                    ``s3_bytes`` (input bytes it GET from S3), ``holder`` ("1" when this worker
#                    holds the host's cache, else "0"), ``entries`` and ``bytes`` (what it
#                    holds; 0 on the other workers)
WORKER_FIELDS: Final = (
    "cpu", "mem", "queue_depth", "running", "slots", "host", "last_heartbeat", "started_at",
    "held_images", "held_bytes", "tasks", "proc_cpu", "proc_rss", "proc_mem",
    "input_cache_hits", "input_cache_misses", "input_cache_saved_bytes", "input_cache_s3_bytes",
    "input_cache_holder", "input_cache_entries", "input_cache_bytes",
)  # fmt: skip

# Workers refresh their hash this often; one silent for WORKER_DEAD_AFTER_S is presumed dead.
HEARTBEAT_INTERVAL_S: Final = 2.0
WORKER_DEAD_AFTER_S: Final = 3 * HEARTBEAT_INTERVAL_S


def worker_key(worker_id: str) -> str:
    """The heartbeat hash of one worker: ``cdiflow:worker:<id>``."""
    return f"{WORKER_PREFIX}{worker_id}"


def task_leases_key(task: str) -> str:
    """The leases on a task's places under its concurrency limit, ``cdiflow:leases:<task>``: a
    sorted set of step runs out, each scored with when its lease lapses
    (``scheduler.limits``)."""
    return f"cdiflow:leases:{task}"


def worker_queue_key(worker_id: str) -> str:
    """A worker's own instruction list, ``cdiflow:queue:<id>``: the scheduler LPUSHes, the
    worker moves items into its in-flight list (BLMOVE, or up to its free slots' worth in one
    script call: ``orchestrator.worker.intake``) and runs them."""
    return f"cdiflow:queue:{worker_id}"


def worker_control_key(worker_id: str) -> str:
    """A worker's control list, ``cdiflow:control:<id>``: a scheduler LPUSHes a
    ``contract.messages.Stop`` for a task run the worker must stop, and the worker BLPOPs it
    (on a thread of its own: its slots may all be busy). It expires when nobody reads it."""
    return f"cdiflow:control:{worker_id}"


def stream_peers_key(workflow_id: str) -> str:
    """Where a run's streaming steps find each other, ``cdiflow:streams:<run>``: a hash of
    ``<channel>.pub`` and ``<channel>.sub.<ref>`` -> the CDI container of the worker running
    that end (``orchestrator.worker.streams``). It expires ``STREAM_PEERS_TTL_S`` after the
    last step of the run joined."""
    return f"cdiflow:streams:{workflow_id}"


STREAM_PEERS_TTL_S: Final = 24 * 3600


# A control list no worker pops (its worker is gone) expires this long after its last stop.
CONTROL_TTL_S: Final = 60


def worker_inflight_key(worker_id: str) -> str:
    """Instructions a worker has popped but not acknowledged, ``cdiflow:inflight:<id>``;
    the scheduler requeues them elsewhere if the worker dies."""
    return f"cdiflow:inflight:{worker_id}"


# A random token set once; if it disappears, Redis lost its data and the schedulers re-send
# what they had in flight (queues are rebuilt from Postgres and scheduler memory).
EPOCH: Final = "cdiflow:epoch"


# Hash: scheduler id -> unix seconds (float) of its loop's latest housekeeping tick, written
# every tick (about once a second); ``/api/readyz`` calls a scheduler whose stamp is older than
# SCHEDULER_STALE_S stalled or gone.
SCHEDULERS: Final = "cdiflow:schedulers"
SCHEDULER_STALE_S: Final = 10.0


def scheduler_reports_key(scheduler_id: str) -> str:
    """Reports of finished task runs for one scheduler, ``cdiflow:reports:<id>``: workers LPUSH
    ``contract.messages.Report`` JSON (and ring ``report_bell_key``); the scheduler moves up to
    a batch of them at a time into ``reports_taken_key`` (LMOVE, in one script)."""
    return f"cdiflow:reports:{scheduler_id}"


def report_bell_key(reply_to: str) -> str:
    """The bell of a report list, ``<reply_to>:bell``: the worker's report script LPUSHes a
    ring with each report. The scheduler blocks on its bell and the wake-up list at once
    (BRPOP), so that no report leaves Redis by a blocking pop: reports only move, by LMOVE,
    into its taken list."""
    return f"{reply_to}:bell"


def reports_taken_key(reply_to: str) -> str:
    """The reports a scheduler took from ``reply_to`` for its loop turn, ``<reply_to>:taken``;
    emptied once the turn's writes are committed, and read again by a scheduler that starts
    (its previous process may have died mid-turn)."""
    return f"{reply_to}:taken"


# CDI objects (not Redis keys, but named here too): a workflow's objects are
# "wf-<workflow id>-<generation>", or "wf-<workflow id>-<token>-<generation>" once the scheduler
# drove the run again (``scheduler.runs.RunState.next_object_key``); a named output adds
# ".<output>" (and a list's element ".<i>"), a copy for a reader on another host ".copy".
_OBJECT_KEY: Final = re.compile(
    r"wf-([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12})(?:-[0-9a-f]{6})?-\d+(?:\.[A-Za-z0-9_.-]+)?"
)


def workflow_of_object(key: str) -> uuid.UUID | None:
    """The workflow a CDI object belongs to, when its key follows the scheduler's naming."""
    match = _OBJECT_KEY.fullmatch(key)
    return uuid.UUID(match[1]) if match else None
