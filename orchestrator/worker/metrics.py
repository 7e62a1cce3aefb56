"""A worker's Prometheus metrics, served on ``--metrics-port`` (``prometheus_client``).

Per task (the module path the instruction names): runs by outcome, their run time and the
task functions' own CPU time; now: tasks running and images held; and the worker process's
own CPU, memory and open files (``process_*``), which the API's ``/metrics`` reports only as
of the last heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable
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

from orchestrator.contract.messages import Instruction, Report
from orchestrator.metrics_http import serve_metrics

__all__ = ["WorkerMetrics"]

_BUCKETS_S: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class WorkerMetrics:
    """The worker's counters; ``serve(port)`` exposes them over HTTP."""

    def __init__(self, *, running: Callable[[], int], held: Callable[[], tuple[int, int]]) -> None:
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
