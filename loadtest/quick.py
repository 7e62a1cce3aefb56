"""``cdiflow bench workflows --quick``: orchestration overhead on one stack, per policy.

For each system (``affinity``, ``transfer``, ``auto`` on the CDI plane; ``object-store``) and
each workflow: ``noop_pipeline`` dataless (no image: the control plane alone, as the peers'
"3-task workflow with no data" figures are measured) and ``image_pipeline`` on one small image:

* sequential runs: one workflow at a time, each started and awaited with one request
  (``POST /api/workflows?wait_s=``, what a client that wants the result does: the API does
  no more work while the run runs); latency is the server's ``finished_at - created_at``
  (database clock);
* a burst: ``burst`` workflows started at once; throughput = completed / (last
  ``finished_at`` - first ``created_at``).

The *overhead per task* (the orchestrator issue's figure) is the marginal cost of a task,
measured for the dataless no-op pipeline: the slope of p50 latency between a 1-task and a
10-task no-op chain, ``(p50(10) - p50(1)) / 9``. A workflow's fixed cost (admission, claim,
end) is bounded by the 3-task goal instead. ``p50_overhead_per_task_ms`` is (latency - summed
task ``run_ms``) / tasks: both costs, the fixed one spread over the workflow's tasks.
``run_ms`` is what the worker measured around a task, *including* its data plane's reads and
writes, so for the object-store plane the S3 traffic and PNG coding count as run time, not
as overhead. The phase breakdown splits the latency along the task runs' timestamps.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from cdiflow.client import Client
from cdiflow.client.models import WorkflowDetail
from loadtest import cdiflow_api
from loadtest.cdiflow_api import connect, latency_ms, unix
from loadtest.images import make_jpeg
from loadtest.quick_graphs import (
    GRAPH_SYSTEMS,
    TILE_BYTES,
    GraphRow,
    TileRow,
    measure_graphs,
    measure_tiles,
)
from loadtest.stats import summarize
from loadtest.systems.services import BenchServices, s3_client
from orchestrator.child_process import free_port
from orchestrator.services import RunningServices
from orchestrator.stack import Stack

__all__ = ["PHASES", "QuickReport", "QuickRow", "phases_ms", "run_quick"]

QUICK_SYSTEMS: Final = ("affinity", "transfer", "auto", "object-store")
WORKFLOWS: Final = ("noop_pipeline", "image_pipeline")
DATALESS: Final = frozenset({"noop_pipeline"})  # started without an image
CHAIN: Final = (1, 10)  # no-op chain lengths whose latency slope is the marginal task cost
# Where a workflow's time goes, in order; they add up to its latency.
PHASES: Final = ("admit", "input", "dispatch", "run", "report", "output")


@dataclass
class QuickRow:
    system: str
    workflow: str
    size: int
    tasks: int
    n: int
    p50_latency_ms: float
    p99_latency_ms: float
    mean_latency_ms: float
    p50_run_ms: float  # summed task run_ms
    p50_overhead_per_task_ms: float
    burst: int
    burst_completed: int
    burst_p50_latency_ms: float
    throughput_wps: float
    phases_p50_ms: dict[str, float] = field(default_factory=dict)
    # Dataless no-op only: p50 of 1- and 10-task chains, and the slope between them.
    chain_p50_ms: dict[int, float] = field(default_factory=dict)
    marginal_ms_per_task: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class QuickReport:
    """The per-policy rows, and for the systems that run graphs their fork/join and fan-out
    rows and the tiled fan-out beside its process-pool floor (``loadtest.quick_graphs``)."""

    rows: list[QuickRow]
    graphs: list[GraphRow] = field(default_factory=list)
    tiles: list[TileRow] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "results": [r.as_dict() for r in self.rows],
            "graphs": [g.as_dict() for g in self.graphs],
            "tiles": [t.as_dict() for t in self.tiles],
        }


def phases_ms(detail: WorkflowDetail) -> dict[str, float]:
    """Split one finished workflow's latency along its timestamps (milliseconds).

    admit: created -> claimed by the scheduler; input: claimed -> first task queued (download,
    decode, CDI object); dispatch: task queued -> started on a worker (summed); run: task
    started -> finished (summed); report: task finished -> next task queued (summed);
    output: last task finished -> workflow finished (encode and upload the result, commit).
    """
    runs = sorted((r for r in detail.task_runs if r.status == "COMPLETED"), key=lambda r: r.id)
    created, started = unix(detail.created_at), unix(detail.started_at)
    finished = unix(detail.finished_at)
    out = {"admit": started - created, "dispatch": 0.0, "run": 0.0, "report": 0.0}
    out["input"] = unix(runs[0].queued_at) - started
    for i, r in enumerate(runs):
        out["dispatch"] += unix(r.started_at) - unix(r.queued_at)
        out["run"] += unix(r.finished_at) - unix(r.started_at)
        if i + 1 < len(runs):
            out["report"] += unix(runs[i + 1].queued_at) - unix(r.finished_at)
    out["output"] = finished - unix(runs[-1].finished_at)
    return {k: round(out[k] * 1000, 2) for k in PHASES}


def _check(details: list[WorkflowDetail], what: str) -> list[WorkflowDetail]:
    failed = [d for d in details if d.status != "COMPLETED"]
    if failed:
        raise RuntimeError(f"{what}: {len(failed)} workflow(s) failed, e.g. {failed[0].error}")
    return details


def _run_ms(detail: WorkflowDetail) -> float:
    return sum(r.run_ms or 0.0 for r in detail.task_runs)


def _measure(
    api: Client,
    system: str,
    workflow: str,
    image: str | None,
    size: int,
    repeat: int,
    burst: int,
) -> QuickRow:
    sequential = []
    for _ in range(repeat):
        sequential.append(cdiflow_api.run(api, workflow, image, system))
    _check(sequential, f"{system} {workflow}")
    with ThreadPoolExecutor(8) as pool:  # start the burst as fast as a client can
        started = pool.map(lambda _: cdiflow_api.start(api, workflow, image, system), range(burst))
        ids = [str(run.id) for run in started]
    burst_details = list(cdiflow_api.wait_all(api, ids).values())
    done = [d for d in burst_details if d.status == "COMPLETED"]
    span = max((unix(d.finished_at) for d in done), default=0.0) - min(
        unix(d.created_at) for d in burst_details
    )
    latency = summarize(latency_ms(d) for d in sequential)
    tasks = len([r for r in sequential[0].task_runs if r.status == "COMPLETED"])
    run = [_run_ms(d) for d in sequential]
    overhead = [(latency_ms(d) - _run_ms(d)) / tasks for d in sequential]
    phases = [phases_ms(d) for d in sequential]
    chains = _chains(api, system, repeat) if image is None else {}
    return QuickRow(
        system=system,
        workflow=workflow,
        size=size,
        tasks=tasks,
        n=latency.n,
        p50_latency_ms=round(latency.p50, 1),
        p99_latency_ms=round(latency.p99, 1),
        mean_latency_ms=round(latency.mean, 1),
        p50_run_ms=round(statistics.median(run), 1),
        p50_overhead_per_task_ms=round(statistics.median(overhead), 1),
        burst=burst,
        burst_completed=len(done),
        burst_p50_latency_ms=round(summarize(latency_ms(d) for d in done).p50, 1),
        throughput_wps=round(len(done) / span, 2) if span > 0 else 0.0,
        phases_p50_ms={k: round(statistics.median(p[k] for p in phases), 1) for k in PHASES},
        chain_p50_ms=chains,
        marginal_ms_per_task=(
            round((chains[CHAIN[1]] - chains[CHAIN[0]]) / (CHAIN[1] - CHAIN[0]), 2)
            if chains
            else None
        ),
    )


def _chains(api: Client, system: str, repeat: int) -> dict[int, float]:
    """p50 latency (ms) of dataless no-op chains of ``CHAIN`` lengths, run one at a time."""
    out = {}
    for length in CHAIN:
        name = cdiflow_api.ensure_noop_chain(api, length)
        cdiflow_api.run(api, name, None, system)  # warm-up
        runs = []
        for _ in range(repeat):
            runs.append(cdiflow_api.run(api, name, None, system))
        _check(runs, f"{system} {name}")
        out[length] = round(statistics.median(latency_ms(d) for d in runs), 2)
    return out


def run_quick(
    *,
    repeat: int = 30,
    burst: int = 20,
    warmup: int = 3,
    workers: int = 2,
    systems: tuple[str, ...] = QUICK_SYSTEMS,
    workflows: tuple[str, ...] = WORKFLOWS,
    image_size: int = 10_000,
    data_dir: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
    services: RunningServices | None = None,
    redis_db_from: int = 1,
    graphs: bool = True,
    tile_bytes: int = TILE_BYTES,
) -> QuickReport:
    """Start one stack, measure every (system, workflow), then (``graphs``) the fork/join,
    fan-out and tiled fan-out rows of the graph-running systems, stop the stack.

    ``services``: use these (tests) instead of starting embedded ones; the stack takes a fresh
    database on them and Redis database ``redis_db_from``.
    """
    folder = data_dir or Path(tempfile.mkdtemp(prefix="cdiflow-quick-"))
    rows: list[QuickRow] = []
    report = QuickReport(rows)
    shared = BenchServices(folder / "services", given=services, first_redis_db=redis_db_from)
    with shared:
        progress(f"services up; starting the stack ({workers} workers)")
        image_bytes = make_jpeg(image_size)
        bucket = shared.running.s3_bucket
        s3_client(shared.running).put_object(Bucket=bucket, Key="bench/quick.jpg", Body=image_bytes)
        image = f"s3://{bucket}/bench/quick.jpg"
        stack = Stack(
            folder / "stack", workers=workers, port=free_port(), services=shared.for_system("quick")
        )
        with stack, connect(stack.api_url, stack.api_key) as api:
            for workflow in workflows:
                given = None if workflow in DATALESS else image
                for system in systems:
                    for _ in range(warmup):
                        _check([cdiflow_api.run(api, workflow, given, system)], "warm-up")
                    began = time.monotonic()
                    size = 0 if given is None else len(image_bytes)
                    rows.append(_measure(api, system, workflow, given, size, repeat, burst))
                    progress(f"  {system:<13} {workflow:<15} {time.monotonic() - began:5.1f} s")
            graph_systems = [s for s in systems if s in GRAPH_SYSTEMS] if graphs else []
            if graph_systems:
                report.graphs = measure_graphs(api, graph_systems, repeat, progress)
                tile = make_jpeg(tile_bytes)
                key = "bench/quick-tiles.jpg"
                s3_client(shared.running).put_object(Bucket=bucket, Key=key, Body=tile)
                report.tiles = measure_tiles(
                    api, graph_systems, f"s3://{bucket}/{key}", tile, workers, repeat, progress
                )
    return report
