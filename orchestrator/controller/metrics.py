"""``GET /metrics``: the stack's state for Prometheus, read when scraped.

What it reports comes from where the state lives: Postgres (workflow runs on record by status
and ``workflow`` (the definition's name) and how long completed ones took, task runs by status
and how long they took by ``task``, runs ended and pruned, hand-offs), Redis (workers, their
queues and their processes' CPU and memory) and the CDI controller (objects and bytes by host),
plus the API process's own figures (``process_*``, ``python_*``, the long polls it holds).
Nothing else is counted in the API process itself: every API replica reports the same figures,
as ``kube-state-metrics`` does, and a restart loses nothing. ``cdiflow_source_up{source}`` says
which source answered; a source that does not answer leaves its figures out of that scrape
rather than failing it.

*Cost:* Postgres's figures are the tallies its triggers keep as runs change (``db.tallies``),
read in one query of a few hundred rows whatever the size of the history. A scrape's figures
are reused for ``CACHE_S`` seconds, so several scrapers cost one read.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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
from sqlalchemy.exc import SQLAlchemyError

from cdi.controller.client import ControllerClient
from cdi.errors import CDIError
from orchestrator.contract import keys
from orchestrator.contract.vocabulary import TaskRunStatus, WorkflowStatus
from orchestrator.controller.api.deps import Resources
from orchestrator.db import tallies
from orchestrator.db.tallies import Histogram

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
_RUN_STATUSES: Final = tuple(s for s in TaskRunStatus if s is not TaskRunStatus.SKIPPED)


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
            kept = tallies.all_time(conn)
        counts = GaugeMetricFamily("cdiflow_workflows",
                                   "Workflow runs on record by status and workflow (definition).",
                                   labels=["status", "workflow"])  # fmt: skip
        for (workflow, status), count in _by_workflow_and_status(kept).items():
            counts.add_metric([status, workflow], count)
        task_counts = GaugeMetricFamily("cdiflow_task_runs",
                                        "Task runs (attempts) on record by status.",
                                        labels=["status"])  # fmt: skip
        for status, count in _with_zeros(kept.with_prefix("task_runs:"), _RUN_STATUSES):
            task_counts.add_metric([status], count)
        ended = CounterMetricFamily("cdiflow_workflows_ended",
                                    "Workflow runs that ended, by status (pruning keeps them).",
                                    labels=["status"])  # fmt: skip
        for status, count in _with_zeros(
            kept.with_prefix("ended:"), [s for s in WorkflowStatus if s.finished]
        ):
            ended.add_metric([status], count)
        pruned = CounterMetricFamily("cdiflow_workflows_pruned",
                                     "Finished runs retention removed from Postgres.")  # fmt: skip
        pruned.add_metric([], kept.count("pruned"))
        archived = CounterMetricFamily("cdiflow_workflows_archived",
                                       "Pruned runs archived to S3 first.")  # fmt: skip
        archived.add_metric([], kept.count("archived"))
        took = HistogramMetricFamily(
            "cdiflow_workflow_duration_seconds",
            "Completed workflow runs by workflow (definition): from the start request to the end.",
            labels=["workflow"],
        )
        for workflow, histogram in sorted(kept.histograms_with_prefix("latency:").items()):
            took.add_metric([workflow], *_buckets(histogram))
        waited = HistogramMetricFamily(
            "cdiflow_task_queue_wait_seconds", "Task runs: from queued to started on a worker."
        )
        waited.add_metric([], *_buckets(kept.histogram("queue_wait")))
        ran = HistogramMetricFamily(
            "cdiflow_task_run_duration_seconds", "Completed task runs by task: their run time.",
            labels=["task"],
        )  # fmt: skip
        for task, histogram in sorted(kept.histograms_with_prefix("run:").items()):
            ran.add_metric([task], *_buckets(histogram))
        moves = CounterMetricFamily("cdiflow_handoffs", "CDI ownership hand-offs made.")
        moves.add_metric([], kept.count("handoffs"))
        moved_bytes = CounterMetricFamily(
            "cdiflow_handoff_bytes", "Bytes handed over by ownership (not copied)."
        )
        moved_bytes.add_metric([], kept.sums.get("handoffs", 0.0))
        return [counts, task_counts, ended, pruned, archived, took, waited, ran, moves,
                moved_bytes]  # fmt: skip

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


def _with_zeros(counts: Mapping[str, int], statuses: Iterable[str]) -> list[tuple[str, int]]:
    """Every status named (zero where none), then any other the tallies hold."""
    out = {str(s): 0 for s in statuses}
    out.update(counts)
    return list(out.items())


def _by_workflow_and_status(kept: tallies.Tally) -> dict[tuple[str, str], int]:
    """Runs on record by (workflow, status) (series ``workflow:<STATUS>:<definition>``): every
    status of each workflow that has runs on record, 0 included."""
    by_workflow: dict[str, dict[str, int]] = {}
    for key, count in kept.with_prefix("workflow:").items():
        status, _, workflow = key.partition(":")
        by_workflow.setdefault(workflow, {})[status] = count
    counts: dict[tuple[str, str], int] = {}
    for workflow, statuses in sorted(by_workflow.items()):
        if any(statuses.values()):  # not a definition whose runs were all pruned
            for status, count in _with_zeros(statuses, WorkflowStatus):
                counts[(workflow, status)] = count
    return counts


def _buckets(histogram: Histogram) -> tuple[list[tuple[str, float]], float]:
    """A histogram (kept in ms) as prometheus_client takes it: cumulative ``(le, count)``
    pairs in seconds ending with ``+Inf``, and the sum in seconds."""
    pairs = [
        (_le(b), float(histogram.at_or_under(round(b * 1000.0, 6)))) for b in DURATION_BUCKETS_S
    ]
    return [*pairs, ("+Inf", float(histogram.count))], histogram.total / 1000.0


def _le(bound: float) -> str:
    return repr(float(bound))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
