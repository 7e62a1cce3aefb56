"""cdiflow under one policy / data plane: a fresh ``Stack`` on the run's shared services."""

from __future__ import annotations

from collections.abc import Sequence

from cdiflow.client.models import TaskRunInWorkflow
from loadtest.cdiflow_api import SYSTEM_MODES, connect, ensure_chain, task_runs_within, unix
from loadtest.drive import run_locust
from loadtest.images import chain_workflow
from loadtest.plan import Point, poll_max_s
from loadtest.stats import WorkflowRecord, busy_shares
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, clear_prefixes
from orchestrator.child_process import free_port
from orchestrator.stack import Stack

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
        self._window_runs: tuple[tuple[float, float], list[TaskRunInWorkflow]] | None = None

    def start(self) -> None:
        self._stack = Stack(
            self.ctx.folder / f"stack-{self.name}",
            workers=self.ctx.workers,
            port=free_port(),
            services=self.services.for_system(self.name),
            # Several hosts: a minion per host, worker n on host ((n - 1) mod hosts) + 1, in
            # its namespace; the API and the scheduler on host 1.
            hosts=len(self.ctx.network.hosts) if self.ctx.network else 1,
            network=self.ctx.network,
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
            with connect(self.stack.api_url, self.stack.api_key) as api:
                ensure_chain(api, point.tasks)
            self._chains.add(point.tasks)
        target, folder = self.point_target(
            point,
            inputs,
            api_url=self.stack.api_url,
            api_key=self.stack.api_key,
            workflow=chain_workflow(point.tasks),
            poll_max_s=poll_max_s(point.concurrency),
        )
        return run_locust(
            target, folder, time_limit_s=self.ctx.time_limit_s, progress=self.ctx.progress
        )

    def workers_busy(self, since: float, until: float) -> dict[str, float]:
        runs = (
            (r.worker_id, unix(r.started_at), unix(r.finished_at))
            for r in self._task_runs(since, until)
            if r.worker_id and r.finished_at
        )
        return busy_shares(runs, since, until)

    def ops_cpu_ms(
        self, records: Sequence[WorkflowRecord], since: float, until: float
    ) -> float | None:
        # Every attempt's own CPU time, as its worker measured it (``task_runs.cpu_ms``).
        spent = [r.cpu_ms for r in self._task_runs(since, until) if r.cpu_ms is not None]
        return float(sum(spent)) if spent else None

    def _task_runs(self, since: float, until: float) -> list[TaskRunInWorkflow]:
        """The task runs of ``[since, until]``, read once for both figures of a point."""
        if self._window_runs is None or self._window_runs[0] != (since, until):
            with connect(self.stack.api_url, self.stack.api_key) as api:
                self._window_runs = ((since, until), task_runs_within(api, since, until))
        return self._window_runs[1]

    def after_point(self) -> None:
        clear_prefixes(self.services.running, ("results/", "work/"))
