"""``GET /metrics``: the stack's state for Prometheus, read when scraped.

What it reports comes from where the state lives: Postgres (workflow runs by status and
``workflow`` (the definition's name) and how long completed ones took, task runs by status and
how long they took by ``task``, hand-offs), Redis (workers, their queues and their processes'
CPU and memory) and the CDI controller (objects and bytes by host), plus the API process's own
figures (``process_*``, ``python_*``, the long polls it holds). Nothing else is counted in the
API process itself: every API replica reports the same figures, as ``kube-state-metrics``
does, and a restart loses nothing. ``cdiflow_source_up{source}`` says which source answered; a
source that does not answer leaves its figures out of that scrape rather than failing it.

*Cost:* the duration histograms aggregate every completed run and task run (one pass over
each table). A scrape's figures are reused for ``CACHE_S`` seconds, so several scrapers (or a
short interval) cost one pass.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import redis
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from sqlalchemy import Connection, text
from sqlalchemy.exc import SQLAlchemyError

from cdi.controller.client import ControllerClient
from cdi.errors import CDIError
from orchestrator.contract import keys
from orchestrator.contract.vocabulary import WorkflowStatus
from orchestrator.controller.api.deps import Resources

__all__ = [
    "CACHE_S",
    "DURATION_BUCKETS_S",
    "LongPollCollector",
    "StackCollector",
    "metrics_registry",
]

log = logging.getLogger(__name__)

CACHE_S: Final = 5.0
DURATION_BUCKETS_S: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_CDI_TIMEOUT_S: Final = 2.0
_STATUSES: Final = tuple(str(status) for status in WorkflowStatus)
_RUN_STATUSES: Final = ("QUEUED", "RUNNING", "COMPLETED", "FAILED", "TIMED_OUT", "CANCELLED")


def _histogram_sql(table: str, seconds: str, where: str, group: str | None) -> str:
    """One pass over ``table``: per group, the count at or under each bucket, all, and sum."""
    buckets = ", ".join(f"count(*) FILTER (WHERE {seconds} <= {b})" for b in DURATION_BUCKETS_S)
    key = f"{group}, " if group else ""
    tail = f" GROUP BY {group}" if group else ""
    return (
        f"SELECT {key}{buckets}, count(*), coalesce(sum({seconds}), 0) "
        f"FROM {table} WHERE {where}{tail}"
    )


_WORKFLOW_SECONDS: Final = _histogram_sql(
    "workflows", "extract(epoch FROM finished_at - created_at)",
    "status = 'COMPLETED' AND finished_at IS NOT NULL", "definition",
)  # fmt: skip
_WORKFLOW_COUNTS: Final = (
    "SELECT definition, status::text, count(*) FROM workflows GROUP BY definition, status"
)
_TASK_SECONDS: Final = _histogram_sql(
    "task_runs", "run_ms / 1000.0", "status = 'COMPLETED' AND run_ms IS NOT NULL", "task"
)
_QUEUE_SECONDS: Final = _histogram_sql(
    "task_runs", "queue_wait_ms / 1000.0", "queue_wait_ms IS NOT NULL", None
)


class StackCollector(Collector):
    """Reads the stack's figures at each scrape (or reuses the last ones for ``CACHE_S``)."""

    def __init__(self, resources: Resources, *, cdi_url: str | None = None) -> None:
        self.resources = resources
        self.cdi_url = cdi_url if cdi_url is not None else os.environ.get("CDI_CONTROLLER_URL")
        self._lock = threading.Lock()
        self._cached: tuple[float, list[Metric]] | None = None

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            if self._cached is None or time.monotonic() - self._cached[0] > CACHE_S:
                self._cached = (time.monotonic(), self._read())
            return iter(list(self._cached[1]))

    def _read(self) -> list[Metric]:
        up = GaugeMetricFamily(
            "cdiflow_source_up", "Whether a source answered this scrape (1) or not (0).",
            labels=["source"],
        )  # fmt: skip
        found: list[Metric] = []
        sources = [("postgres", self._postgres), ("redis", self._redis)]
        if self.cdi_url:  # an API run without the CDI controller (tests) has no such source
            sources.append(("cdi", self._cdi))
        for source, read in sources:
            try:
                found += read()
            except (SQLAlchemyError, redis.RedisError, CDIError, OSError) as exc:
                log.warning("metrics: %s did not answer: %s", source, exc)
                up.add_metric([source], 0)
            else:
                up.add_metric([source], 1)
        return [up, *found]

    # -- Postgres --------------------------------------------------------------------------
    def _postgres(self) -> list[Metric]:
        with self.resources.autocommit() as conn:
            workflows = _by_workflow_and_status(conn)
            runs = _by_status(conn, "task_runs", _RUN_STATUSES)
            latency = conn.execute(text(_WORKFLOW_SECONDS)).all()
            queue_wait = conn.execute(text(_QUEUE_SECONDS)).one()
            task_seconds = conn.execute(text(_TASK_SECONDS)).all()
            handoffs, moved = conn.execute(
                text("SELECT count(*), coalesce(sum(bytes), 0) FROM handoffs")
            ).one()
        counts = GaugeMetricFamily("cdiflow_workflows",
                                   "Workflow runs by status and workflow (definition).",
                                   labels=["status", "workflow"])  # fmt: skip
        for (workflow, status), count in workflows.items():
            counts.add_metric([status, workflow], count)
        task_counts = GaugeMetricFamily("cdiflow_task_runs", "Task runs (attempts) by status.",
                                        labels=["status"])  # fmt: skip
        for status, count in runs.items():
            task_counts.add_metric([status], count)
        took = HistogramMetricFamily(
            "cdiflow_workflow_duration_seconds",
            "Completed workflow runs by workflow (definition): from the start request to the end.",
            labels=["workflow"],
        )
        for row in latency:
            took.add_metric([str(row[0])], *_buckets(row[1:]))
        waited = HistogramMetricFamily(
            "cdiflow_task_queue_wait_seconds", "Task runs: from queued to started on a worker."
        )
        waited.add_metric([], *_buckets(queue_wait))
        ran = HistogramMetricFamily(
            "cdiflow_task_run_duration_seconds", "Completed task runs by task: their run time.",
            labels=["task"],
        )  # fmt: skip
        for row in task_seconds:
            ran.add_metric([str(row[0])], *_buckets(row[1:]))
        moves = CounterMetricFamily("cdiflow_handoffs", "CDI ownership hand-offs made.")
        moves.add_metric([], handoffs)
        moved_bytes = CounterMetricFamily(
            "cdiflow_handoff_bytes", "Bytes handed over by ownership (not copied)."
        )
        moved_bytes.add_metric([], moved)
        return [counts, task_counts, took, waited, ran, moves, moved_bytes]

    # -- Redis -----------------------------------------------------------------------------
    def _redis(self) -> list[Metric]:
        client = self.resources.redis
        ids = sorted(str(i) for i in client.smembers(keys.WORKERS))
        with client.pipeline(transaction=False) as pipe:
            for worker_id in ids:
                pipe.hgetall(keys.worker_key(worker_id))
                pipe.llen(keys.worker_queue_key(worker_id))
                pipe.llen(keys.worker_inflight_key(worker_id))
            pipe.llen(keys.WAKE)
            replies = pipe.execute()
        now = time.time()
        alive = GaugeMetricFamily("cdiflow_worker_up", "Whether the worker heartbeats (1).",
                                  labels=["worker"])  # fmt: skip
        queued = GaugeMetricFamily("cdiflow_worker_queue_depth",
                                   "Instructions waiting in the worker's queue.",
                                   labels=["worker"])  # fmt: skip
        popped = GaugeMetricFamily("cdiflow_worker_in_flight",
                                   "Instructions the worker popped and has not acknowledged.",
                                   labels=["worker"])  # fmt: skip
        fields = {
            "running": GaugeMetricFamily("cdiflow_worker_running_tasks", "Tasks running now.",
                                         labels=["worker"]),
            "slots": GaugeMetricFamily("cdiflow_worker_slots", "Tasks it runs at once.",
                                       labels=["worker"]),
            "proc_cpu": GaugeMetricFamily("cdiflow_worker_cpu_percent",
                                          "The worker process's CPU, percent of one core.",
                                          labels=["worker"]),
            "proc_rss": GaugeMetricFamily("cdiflow_worker_resident_memory_bytes",
                                          "The worker process's resident memory.",
                                          labels=["worker"]),
            "held_bytes": GaugeMetricFamily("cdiflow_worker_held_image_bytes",
                                            "Bytes of images held between a workflow's tasks.",
                                            labels=["worker"]),
        }  # fmt: skip
        for n, worker_id in enumerate(ids):
            beat, depth, in_flight = replies[3 * n : 3 * n + 3]
            beat = {_text(k): _text(v) for k, v in beat.items()}
            last = _float(beat.get("last_heartbeat"))
            live = last is not None and now - last < keys.WORKER_DEAD_AFTER_S
            alive.add_metric([worker_id], 1 if live else 0)
            queued.add_metric([worker_id], depth)
            popped.add_metric([worker_id], in_flight)
            if not live:
                continue
            for field, family in fields.items():
                value = _float(beat.get(field))
                if value is not None:
                    family.add_metric([worker_id], value)
        wake = GaugeMetricFamily("cdiflow_scheduler_wake_backlog",
                                 "Wake-ups waiting for a scheduler to read them.")  # fmt: skip
        wake.add_metric([], replies[-1])
        return [alive, queued, popped, *fields.values(), wake]

    # -- CDI controller ------------------------------------------------------------------------
    def _cdi(self) -> list[Metric]:
        assert self.cdi_url
        with ControllerClient(self.cdi_url, timeout=_CDI_TIMEOUT_S) as client:
            objects = client.list_objects()
            minions = client.list_minions()
        count = GaugeMetricFamily("cdiflow_cdi_objects", "CDI objects alive, by host.",
                                  labels=["host"])  # fmt: skip
        size = GaugeMetricFamily("cdiflow_cdi_object_bytes", "Bytes of those objects, by host.",
                                 labels=["host"])  # fmt: skip
        hosts: dict[str, list[int]] = {m.host: [0, 0] for m in minions}
        for obj in objects:
            totals = hosts.setdefault(obj.host, [0, 0])
            totals[0] += 1
            totals[1] += obj.size
        for host, (n, nbytes) in sorted(hosts.items()):
            count.add_metric([host], n)
            size.add_metric([host], nbytes)
        up = GaugeMetricFamily("cdiflow_cdi_minion_up", "Whether the host's minion is alive.",
                               labels=["host"])  # fmt: skip
        for minion in minions:
            up.add_metric([minion.host], 1 if minion.alive else 0)
        return [count, size, up]


class LongPollCollector(Collector):
    """The long polls this API process holds (``GET /api/workflows/{id}?wait_s=``): its own
    figure, like ``process_*``, read at each scrape."""

    def __init__(self, waiting: Callable[[], int]) -> None:
        self.waiting = waiting

    def collect(self) -> Iterator[Metric]:
        polls = GaugeMetricFamily(
            "cdiflow_api_long_polls", "Requests this API process holds until a run ends."
        )
        polls.add_metric([], self.waiting())
        yield polls


def metrics_registry(*collectors: Collector) -> CollectorRegistry:
    """A registry with ``collectors`` and the API process's own figures."""
    registry = CollectorRegistry(auto_describe=False)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def _by_workflow_and_status(conn: Connection) -> dict[tuple[str, str], int]:
    """Runs by (workflow, status): every status of each workflow that has runs, 0 included."""
    counts: dict[tuple[str, str], int] = {}
    for workflow, status, count in conn.execute(text(_WORKFLOW_COUNTS)):
        for each in _STATUSES:
            counts.setdefault((str(workflow), each), 0)
        counts[(str(workflow), str(status))] = int(count)
    return counts


def _by_status(conn: Connection, table: str, statuses: Iterable[str]) -> dict[str, int]:
    counts = dict.fromkeys(statuses, 0)
    rows = conn.execute(text(f"SELECT status::text, count(*) FROM {table} GROUP BY status"))
    for status, count in rows:
        counts[str(status)] = int(count)
    return counts


def _buckets(row: Sequence[Any]) -> tuple[list[tuple[str, float]], float]:
    """A histogram row (each bucket's count, the count, the sum) as prometheus_client takes
    it: cumulative ``(le, count)`` pairs ending with ``+Inf``, and the sum."""
    *counts, total, seconds = row
    pairs = [(_le(b), float(c)) for b, c in zip(DURATION_BUCKETS_S, counts, strict=True)]
    return [*pairs, ("+Inf", float(total))], float(seconds)


def _le(bound: float) -> str:
    return repr(float(bound))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
