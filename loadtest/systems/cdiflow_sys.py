"""cdiflow under one policy / data plane: a fresh ``Stack`` on the run's shared services."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select

from loadtest.drive import run_locust
from loadtest.images import chain_workflow
from loadtest.plan import Point, poll_max_s
from loadtest.rest import SYSTEM_MODES, CdiflowApi
from loadtest.stats import WorkflowRecord, busy_shares
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes
from orchestrator.db.engine import make_engine
from orchestrator.db.models import TaskRun
from orchestrator.stack import Stack
from orchestrator.stack.probes import free_port

__all__ = ["CdiflowSystem"]


class CdiflowSystem(System):
    """``affinity``, ``transfer``, ``auto`` (CDI plane) or ``object-store``."""

    results_prefix = "results/"

    def __init__(self, name: str, services: BenchServices, ctx: RunContext) -> None:
        if name not in SYSTEM_MODES:
            raise ValueError(f"{name!r} is not a cdiflow system ({', '.join(SYSTEM_MODES)})")
        self.name = name
        self.intermediates_via_s3 = SYSTEM_MODES[name][1] == "object-store"
        self.services = services
        self.ctx = ctx
        self._stack: Stack | None = None
        self._chains: set[int] = set()

    def start(self) -> None:
        self._stack = Stack(
            self.ctx.folder / f"stack-{self.name}",
            workers=self.ctx.workers,
            port=free_port(),
            services=self.services.for_system(self.name),
        )
        self._stack.start()

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.stop()
            self._stack = None

    @property
    def stack(self) -> Stack:
        if self._stack is None:
            raise RuntimeError(f"{self.name} is not started")
        return self._stack

    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]:
        if point.tasks not in self._chains:
            with CdiflowApi(self.stack.api_url) as api:
                api.ensure_chain(point.tasks)
            self._chains.add(point.tasks)
        target, folder = self.point_target(
            point,
            inputs,
            api_url=self.stack.api_url,
            workflow=chain_workflow(point.tasks),
            poll_max_s=poll_max_s(point.concurrency),
        )
        return run_locust(
            target, folder, time_limit_s=self.ctx.time_limit_s, progress=self.ctx.progress
        )

    def workers_busy(self, since: float, until: float) -> dict[str, float]:
        query = select(TaskRun.worker_id, TaskRun.started_at, TaskRun.finished_at).where(
            TaskRun.worker_id.is_not(None), *self._ran_within(since, until)
        )
        runs = ((str(w), s.timestamp(), f.timestamp()) for w, s, f in self._rows(query) if s and f)
        return busy_shares(runs, since, until)

    def ops_cpu_ms(
        self, records: Sequence[WorkflowRecord], since: float, until: float
    ) -> float | None:
        # Every attempt's own CPU time, as its worker measured it (``task_runs.cpu_ms``).
        query = select(func.sum(TaskRun.cpu_ms)).where(*self._ran_within(since, until))
        rows = self._rows(query)
        return float(rows[0][0]) if rows and rows[0][0] is not None else None

    @staticmethod
    def _ran_within(since: float, until: float) -> tuple[Any, ...]:
        edges = (datetime.fromtimestamp(since, UTC), datetime.fromtimestamp(until, UTC))
        return (
            TaskRun.started_at.is_not(None),
            TaskRun.finished_at > edges[0],
            TaskRun.started_at < edges[1],
        )

    def _rows(self, query: Any) -> list[Any]:
        engine = make_engine(self.stack.services.database_url, pooled=False)
        try:
            with engine.connect() as conn:
                return list(conn.execute(query).all())
        finally:
            engine.dispose()

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("results/", "work/"))
