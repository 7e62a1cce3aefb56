"""One benchmark run: shared services, the images, then each system over every point.

Systems run one after another (never two at once: they would share the two cores), each
started before its first point and stopped after its last. Every result is then set against
the floor of the same point: overhead = p50 latency - floor p50, and throughput as a fraction
of the floor's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import psutil

from loadtest.images import SCENARIO2_SIZES, sized_images
from loadtest.plan import (
    DEFAULT_CONCURRENCY,
    DEFAULT_SIZES,
    DEFAULT_TASKS,
    PARALLEL,
    Point,
    plan_points,
)
from loadtest.resources import ResourceMeter
from loadtest.stats import PointResult, summarize_point, window
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, s3_client
from orchestrator.services import RunningServices

__all__ = [
    "ALL_SYSTEMS",
    "AVAILABLE",
    "BenchConfig",
    "BenchReport",
    "compare_to_floor",
    "machine_state",
    "median_over_rounds",
    "run_benchmark",
]

ALL_SYSTEMS: Final = (
    "floor",
    "floor-s3",
    "affinity",
    "transfer",
    "auto",
    "object-store",
    "celery",
    "ray",
    "conductor",
)
AVAILABLE: Final = ALL_SYSTEMS


@dataclass(frozen=True)
class BenchConfig:
    scenarios: tuple[str, ...]
    systems: tuple[str, ...] = AVAILABLE
    sizes: tuple[int, ...] = DEFAULT_SIZES
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    tasks: tuple[int, ...] = DEFAULT_TASKS
    mixed_sizes: tuple[int, ...] = SCENARIO2_SIZES
    link: str = "loopback"
    workers: int = 2
    min_workflows: int = 30
    parallel: int = PARALLEL  # users in scenarios 1 and 3
    data_dir: Path = Path(".data/bench")
    time_limit_s: float = 1800.0
    rounds: int = 1  # passes over every system, in turn; ratios use the same pass's floor

    def points(self) -> list[Point]:
        return [
            p
            for s in self.scenarios
            for p in plan_points(
                s,
                sizes=self.sizes,
                concurrency=self.concurrency,
                tasks=self.tasks,
                min_workflows=self.min_workflows,
                mixed_sizes=self.mixed_sizes,
                parallel=self.parallel,
            )
        ]


@dataclass
class BenchReport:
    results: list[PointResult]
    config: dict[str, Any]
    machine: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"results": [r.as_dict() for r in self.results]}
        if any(r.round > 1 for r in self.results):
            payload["summary"] = [r.as_dict() for r in median_over_rounds(self.results)]
        return {**payload, "config": self.config, "machine": self.machine}


def machine_state() -> dict[str, Any]:
    """What else the machine is doing: the figures mean little without it."""
    me = psutil.Process()
    ours = {me.pid, *(c.pid for c in me.children(recursive=True))}
    procs = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if p.pid not in ours]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.cpu_percent(None)
    time.sleep(1.0)
    busy = []
    for p in procs:
        try:
            cpu = p.cpu_percent(None)
        except psutil.Error:
            continue
        if cpu >= 5.0:
            busy.append(
                {
                    "pid": p.pid,
                    "cpu_percent": cpu,
                    "cmd": " ".join(p.info["cmdline"] or [p.info["name"] or ""])[:120],
                }
            )
    return {
        "cpus": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "other_busy_processes": busy,
    }


def make_system(name: str, services: BenchServices, ctx: RunContext) -> System:
    if name == "floor":
        from loadtest.systems.floor import FloorSystem

        return FloorSystem(ctx)
    if name == "floor-s3":
        from loadtest.systems.floor import FloorSystem

        return FloorSystem(ctx, services)
    if name == "celery":
        from loadtest.systems.celery_sys import CelerySystem

        return CelerySystem(services, ctx)
    if name == "ray":
        from loadtest.systems.ray_sys import RaySystem

        return RaySystem(services, ctx)
    if name == "conductor":
        from loadtest.systems.conductor_sys import ConductorSystem

        return ConductorSystem(services, ctx)
    if name in ("affinity", "transfer", "auto", "object-store"):
        from loadtest.systems.cdiflow_sys import CdiflowSystem

        return CdiflowSystem(name, services, ctx)
    raise ValueError(f"system {name!r} is not implemented yet (available: {AVAILABLE})")


def _upload(services: BenchServices, paths: dict[int, Path]) -> dict[int, str]:
    s3, bucket = s3_client(services.running), services.running.s3_bucket
    uris = {}
    for size, path in paths.items():
        key = f"bench/{path.name}"
        s3.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        uris[size] = f"s3://{bucket}/{key}"
    return uris


def compare_to_floor(results: list[PointResult]) -> list[PointResult]:
    """Each result with its overhead over, and throughput share of, the same point's floor."""

    def key(r: PointResult) -> tuple[Any, ...]:
        return (r.round, r.scenario, r.size, r.tasks, r.concurrency)

    floors = {key(r): r for r in results if r.system == "floor" and r.completed}
    out = []
    for r in results:
        floor = floors.get(key(r))
        if r.system == "floor" or floor is None or not r.completed:
            out.append(r)
            continue
        share = r.throughput_wps / floor.throughput_wps if floor.throughput_wps else None
        out.append(
            dataclasses.replace(
                r,
                overhead_p50_s=round(r.p50_latency_s - floor.p50_latency_s, 4),
                throughput_vs_floor=round(share, 3) if share is not None else None,
            )
        )
    return out


def median_over_rounds(results: list[PointResult]) -> list[PointResult]:
    """One row per system and point: the median of its rounds' latencies, throughputs and
    ratios to their own round's floor and the operations' CPU (``round`` = the number of
    rounds; counts are summed; resources, busy shares and errors are left to the per-round
    rows)."""
    groups: dict[tuple[Any, ...], list[PointResult]] = {}
    for r in results:
        groups.setdefault((r.system, r.scenario, r.size, r.tasks, r.concurrency), []).append(r)

    def median(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return round(statistics.median(present), 4) if present else None

    out = []
    for rows in groups.values():
        first = rows[0]
        out.append(
            dataclasses.replace(
                first,
                round=len(rows),
                completed=sum(r.completed for r in rows),
                failed=sum(r.failed for r in rows),
                mean_latency_s=median([r.mean_latency_s for r in rows]) or 0.0,
                p50_latency_s=median([r.p50_latency_s for r in rows]) or 0.0,
                p99_latency_s=median([r.p99_latency_s for r in rows]) or 0.0,
                throughput_wps=median([r.throughput_wps for r in rows]) or 0.0,
                overhead_p50_s=median([r.overhead_p50_s for r in rows]),
                throughput_vs_floor=median([r.throughput_vs_floor for r in rows]),
                ops_cpu_ms_per_workflow=median([r.ops_cpu_ms_per_workflow for r in rows]),
                errors=[],
                resources={},
                workers_busy={},
            )
        )
    return out


def run_benchmark(
    config: BenchConfig,
    *,
    progress: IO[str] | None = None,
    echo: Callable[[str], None] = lambda _: None,
    services: RunningServices | None = None,
    redis_db_from: int = 1,
) -> BenchReport:
    """Every system over every point of ``config``; raises nothing for failed workflows (they
    are counted), only for a system that cannot start. ``services``: use these (tests) rather
    than starting embedded ones, the systems taking Redis databases from ``redis_db_from`` up."""
    folder = config.data_dir.absolute()
    points = config.points()
    sizes = sorted({s for p in points for s in p.sizes})
    echo(
        f"{len(points)} point(s) x {len(config.systems)} system(s); rendering "
        f"{len(sizes)} image size(s)"
    )
    paths = sized_images(folder / "images", sizes)
    before = machine_state()
    results: list[PointResult] = []
    shared = BenchServices(
        folder / "services", config.link, given=services, first_redis_db=redis_db_from
    )
    with shared:
        inputs = Inputs(_upload(shared, paths), {s: paths[s] for s in sizes})
        ctx = RunContext(folder / "runs", config.workers, progress, config.time_limit_s)
        meter = ResourceMeter()
        passes = [(n, name) for n in range(1, config.rounds + 1) for name in config.systems]
        for round_no, name in passes:
            echo(f"== {name}: starting" + (f" (round {round_no})" if config.rounds > 1 else ""))
            began = time.monotonic()
            with make_system(name, shared, ctx) as system:
                # As the points will run: the largest images, as many in flight. *Why:* the
                # first workflows import modules, fill pools and grow every process's memory
                # to its working size; four small ones left part of that to the first point.
                warm = Point("warm-up", (max(sizes),), 3, config.parallel, 1)
                system.run_point(warm, inputs)
                system.after_point()
                echo(f"   started and warmed up in {time.monotonic() - began:.1f} s")
                for point in points:
                    meter.start()
                    records = system.run_point(point, inputs)
                    used = meter.stop(len(records), system.client_usage())
                    result = summarize_point(
                        records,
                        system=name,
                        scenario=point.scenario,
                        size=point.size,
                        tasks=point.tasks,
                        concurrency=point.concurrency,
                        link="none" if name == "floor" else config.link,
                    )
                    span = window(records)
                    busy = system.workers_busy(*span) if span else {}
                    ops = system.ops_cpu_ms(records, *span) if span else None
                    result = dataclasses.replace(
                        result,
                        resources=used,
                        round=round_no,
                        workers_busy=busy,
                        ops_cpu_ms_per_workflow=(
                            round(ops / result.completed, 2)
                            if ops is not None and result.completed
                            else None
                        ),
                    )
                    results.append(result)
                    echo(
                        f"   {point.label():<24} {result.completed}/{point.workflows} done, "
                        f"p50 {result.p50_latency_s:.3f} s, {result.throughput_wps:.2f} wf/s"
                        + (f", workers busy {_shares(busy)}" if busy else "")
                        + (f", errors: {result.errors[0]}" if result.errors else "")
                    )
                    system.after_point()
    after = machine_state()
    machine = {
        **before,
        "loadavg_after": after["loadavg"],
        "other_busy_processes_after": after["other_busy_processes"],
    }
    config_dict = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()
    }
    return BenchReport(compare_to_floor(results), config_dict, machine)


def _shares(busy: dict[str, float]) -> str:
    return ", ".join(f"{worker} {share:.0%}" for worker, share in busy.items())
