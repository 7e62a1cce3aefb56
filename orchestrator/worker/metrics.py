"""A worker's Prometheus metrics, served on ``--metrics-port`` (``prometheus_client``).

Per task (the module path the instruction names): runs by outcome, their run time and the
task functions' own CPU time; now: tasks running and images held; the workflow inputs it read
from S3 and, with the input cache on, its hits, misses and the S3 bytes hits spared (and the
entries and bytes the host's cache holds, from the worker that holds it); and the worker process's
own CPU, memory and open files (``process_*``), which the API's ``/metrics`` reports only as
of the last heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from orchestrator.contract.messages import Instruction, Report
from orchestrator.metrics_http import serve_metrics
from orchestrator.worker.input_cache_host import InputStats

__all__ = ["WorkerMetrics"]

_BUCKETS_S: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class WorkerMetrics:
    """The worker's counters; ``serve(port)`` exposes them over HTTP."""

    def __init__(
        self,
        *,
        running: Callable[[], int],
        held: Callable[[], tuple[int, int]],
        inputs: InputStats | None = None,
        cached: Callable[[], tuple[int, int]] | None = None,
    ) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        self.tasks = Counter("cdiflow_worker_tasks", "Task runs by task and outcome.",
                             ["task", "status"], registry=registry)  # fmt: skip
        self.seconds = Histogram("cdiflow_worker_task_seconds", "Task runs' run time.", ["task"],
                                 buckets=_BUCKETS_S, registry=registry)  # fmt: skip
        self.cpu = Counter("cdiflow_worker_task_cpu_seconds",
                           "CPU time of the task functions themselves.", ["task"],
                           registry=registry)  # fmt: skip
        Gauge("cdiflow_worker_running_tasks", "Tasks running now.",
              registry=registry).set_function(running)  # fmt: skip
        Gauge("cdiflow_worker_held_images", "Images held between a workflow's tasks.",
              registry=registry).set_function(lambda: held()[0])  # fmt: skip
        Gauge("cdiflow_worker_held_image_bytes", "Bytes of those images.",
              registry=registry).set_function(lambda: held()[1])  # fmt: skip
        if inputs is not None:
            registry.register(_InputCollector(inputs, cached))

    def observe(self, ins: Instruction, report: Report) -> None:
        """Count one reported task run."""
        self.tasks.labels(ins.task, report.status).inc()
        self.seconds.labels(ins.task).observe(max(0.0, report.finished_at - report.started_at))
        if report.cpu_ms is not None:
            self.cpu.labels(ins.task).inc(report.cpu_ms / 1000.0)

    def serve(self, port: int, host: str) -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread (``OSError`` if it cannot
        listen there)."""
        serve_metrics(lambda: self.registry, host, port)


class _InputCollector(Collector):
    """The input fetches (``InputStats``) and the host's input cache, read at each scrape."""

    def __init__(self, stats: InputStats, cached: Callable[[], tuple[int, int]] | None) -> None:
        self.stats = stats
        self.cached = cached

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self.stats
        counters = (
            ("input_s3_bytes", "Bytes of workflow inputs GET from S3.", s.s3_bytes),
            ("input_cache_hits", "Inputs copied from the host's input cache.", s.hits),
            ("input_cache_misses", "Inputs fetched from S3 with the input cache on.", s.misses),
            ("input_cache_saved_bytes", "S3 bytes the cache's hits did not fetch.", s.saved_bytes),
        )
        for name, text, value in counters:
            yield CounterMetricFamily(f"cdiflow_worker_{name}", text, value=value)
        if self.cached is not None:
            entries, used = self.cached()
            yield GaugeMetricFamily("cdiflow_worker_input_cache_entries",
                                    "Inputs the host's cache holds (its holder's worker only).",
                                    value=entries)  # fmt: skip
            yield GaugeMetricFamily("cdiflow_worker_input_cache_bytes",
                                    "Bytes of those inputs' objects.", value=used)  # fmt: skip
