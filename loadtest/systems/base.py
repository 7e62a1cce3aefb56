"""What every benchmarked system offers the runner: start, run one point, stop.

A system is started and stopped by the benchmark itself (``with system:``), runs every point
of the scenarios on the same images, and reports one ``WorkflowRecord`` per workflow. The
images are already in S3 (``Inputs.uris``) and on disk (``Inputs.paths``, for the floor).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cdi.hosts import HostNetwork
from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE
from loadtest.plan import Point, Target, client_usage_path
from loadtest.resources import LOCUST_COMPONENT, ExitedUsage
from loadtest.stats import WorkflowRecord
from orchestrator.started import StartStop

__all__ = ["Inputs", "RunContext", "System"]


@dataclass(frozen=True)
class Inputs:
    uris: dict[int, str]  # size -> s3://bucket/key
    paths: dict[int, Path]  # size -> local JPEG


@dataclass(frozen=True)
class RunContext:
    """Where a system keeps its files, how many workers it gets, where progress goes."""

    folder: Path
    workers: int
    progress: IO[str] | None
    time_limit_s: float = 1800.0  # one point, generous: a stuck point must still end
    intermediate: str = DEFAULT_INTERMEDIATE  # images between tasks, where they pass via S3
    # The most decoded-image bytes the run's points hold in flight at once (Ray sizes its
    # object store by it); 0: unknown.
    in_flight_bytes: int = 0
    # Several hosts (``--hosts``): network namespaces joined by an emulated link, every
    # system's workers spread over them; ``None``: one host.
    network: HostNetwork | None = None


class System(StartStop):
    name: str
    ctx: RunContext
    # Warm up until two batches of small workflows run at the same pace (a JIT compiler's
    # system), not only with one batch of the largest.
    warm_until_steady: bool = False
    # The S3 prefix under which its workflows' results are stored (``loadtest.verify``
    # checks them); empty for a system that stores none (the floor).
    results_prefix: str = ""
    # Whether its images pass through S3 between tasks (in ``RunContext.intermediate``).
    intermediates_via_s3: bool = False
    _client_usage_file: Path | None = None  # the current point's, once point_target made it

    def point_target(self, point: Point, inputs: Inputs, **extra: Any) -> tuple[Target, Path]:
        """The locust target of ``point`` for this system (its images, its shape, its records
        file; ``extra`` fills the system's own fields) and the point's folder."""
        folder = self.ctx.folder / "points" / self.name / point.label().replace(" ", "_")
        self._client_usage_file = client_usage_path(folder / "records.jsonl")
        self._client_usage_file.unlink(missing_ok=True)
        open_loop = point.arrival_rate > 0
        return Target(
            system=self.name,
            images=[(inputs.uris[s], s) for s in point.sizes],
            tasks=point.tasks,
            concurrency=1 if open_loop else point.concurrency,
            rounds=point.workflows if open_loop else point.rounds,
            records=str(folder / "records.jsonl"),
            intermediate=self.ctx.intermediate,
            arrival_rate=point.arrival_rate,
            **extra,
        ), folder

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    @abc.abstractmethod
    def run_point(self, point: Point, inputs: Inputs) -> list[WorkflowRecord]: ...

    def workers_busy(self, since: float, until: float) -> dict[str, float]:
        """Each worker's share of ``[since, until]`` (Unix s) spent running a task, where the
        system records that (``loadtest.stats.busy_shares``); empty where it does not."""
        return {}

    def ops_cpu_ms(
        self, records: Sequence[WorkflowRecord], since: float, until: float
    ) -> float | None:
        """CPU ms the image operations took in the point's workflows (``records``, run within
        ``[since, until]``), all together; ``None`` where the system does not report it. The
        default sums what the records carry."""
        values = [r.ops_cpu_ms for r in records]
        if not values or any(v is None for v in values):
            return None
        return sum(v for v in values if v is not None)

    def point_stats(self) -> dict[str, Any]:
        """What the system itself says about the point just run (Ray: bytes its object store
        spilled to disk); empty where it says nothing the benchmark reads."""
        return {}

    def client_usage(self) -> dict[str, ExitedUsage]:
        """CPU and peak memory of the point's client processes, which exit before the meter's
        end, by component: locust's, from the file it writes (``loadtest.locustfile``). Empty
        for systems driven otherwise (their driver lives as long as the system)."""
        path = self._client_usage_file
        if path is None or not path.exists():
            return {}
        try:
            usage = json.loads(path.read_text())
            measured = ExitedUsage(
                float(usage["cpu_s"]), float(usage["sys_s"]), int(usage["peak_rss"])
            )
        except (OSError, ValueError, KeyError, TypeError):
            return {}  # a locust killed mid-write: its share is unknown, as before
        return {LOCUST_COMPONENT: measured}

    def after_point(self) -> None:
        """Clean up between points (results pile up in the embedded S3's memory)."""
