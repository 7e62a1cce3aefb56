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

from cdi.link_emulator import DEFAULT_LINK, Link
from loadtest.hosts import bench_hosts
from loadtest.images import SCENARIO2_SIZES, sized_images
from loadtest.measure import Measurement, in_flight_bytes
from loadtest.pipeline_ops import DEFAULT_INTERMEDIATE
from loadtest.plan import (
    DEFAULT_CONCURRENCY,
    DEFAULT_SIZES,
    DEFAULT_TASKS,
    PARALLEL,
    Point,
    plan_points,
)
from loadtest.stats import PointResult
from loadtest.systems.base import Inputs, RunContext, System
from loadtest.systems.services import BenchServices, s3_client
from loadtest.verify import ReferenceBook
from orchestrator.services import RunningServices

__all__ = [
    "ALL_SYSTEMS",
    "AVAILABLE",
    "DEFAULT_SYSTEMS",
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
    "temporal",
    "conductor-redis",
)
AVAILABLE: Final = ALL_SYSTEMS
# What a run measures unless told: every system but ``conductor-redis``, a variant of a peer.
DEFAULT_SYSTEMS: Final = ALL_SYSTEMS[:-1]
# Every system's workers and the floor's processes apply them (``pipeline_ops``).
MEMORY_SETTINGS: Final = "workflows.memory.tune_for_images in every system's workers"


@dataclass(frozen=True)
class BenchConfig:
    scenarios: tuple[str, ...]
    systems: tuple[str, ...] = DEFAULT_SYSTEMS
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
    intermediate: str = DEFAULT_INTERMEDIATE  # images between tasks, where they pass via S3
    # Open loop: after each closed-loop point, the same point at these shares of the
    # system's closed-loop throughput (a fixed arrival rate); empty: closed loop only.
    loads: tuple[float, ...] = ()
    # Hosts the systems' workers are spread over (network namespaces), and the link between
    # them (``cdi.link_emulator``); 1: every system on this host as it is.
    hosts: int = 1
    host_link: Link = DEFAULT_LINK

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
    if name in ("conductor", "conductor-redis"):
        from loadtest.systems.conductor_sys import ConductorSystem

        return ConductorSystem(services, ctx, name)
    if name == "temporal":
        from loadtest.systems.temporal_sys import TemporalSystem

        return TemporalSystem(services, ctx)
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
    """Each result with its overhead over, and throughput share of, the same point's floor
    (an open-loop row: its latency against the floor's at the same load, no share)."""

    def key(r: PointResult) -> tuple[Any, ...]:
        return (r.round, r.scenario, r.size, r.tasks, r.concurrency, r.load)

    floors = {key(r): r for r in results if r.system == "floor" and r.completed}
    out = []
    for r in results:
        floor = floors.get(key(r))
        if r.system == "floor" or floor is None or not r.completed:
            out.append(r)
            continue
        share = r.throughput_wps / floor.throughput_wps if floor.throughput_wps else None
        if r.load is not None:  # an open loop runs at the rate it is given, not its own
            share = None
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
        key = (r.system, r.scenario, r.size, r.tasks, r.concurrency, r.load)
        groups.setdefault(key, []).append(r)

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
                p95_latency_s=median([r.p95_latency_s for r in rows]),
                notice_p50_ms=median([r.notice_p50_ms for r in rows]),
                notice_mean_ms=median([r.notice_mean_ms for r in rows]),
                arrival_rate_wps=median([r.arrival_rate_wps for r in rows]),
                throughput_wps=median([r.throughput_wps for r in rows]) or 0.0,
                overhead_p50_s=median([r.overhead_p50_s for r in rows]),
                throughput_vs_floor=median([r.throughput_vs_floor for r in rows]),
                ops_cpu_ms_per_workflow=median([r.ops_cpu_ms_per_workflow for r in rows]),
                errors=[],
                resources={},
                workers_busy={},
                verified={"ok": all(r.verified.get("ok", True) for r in rows)},
                peer_stats={},
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
    are counted) nor for results that fail their check (``PointResult.verified``), only for
    a system that cannot start. ``services``: use these (tests) rather than starting embedded
    ones, the systems taking Redis databases from ``redis_db_from`` up."""
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
    link: dict[str, Any] = {}
    with contextlib.ExitStack() as held:
        network = held.enter_context(bench_hosts(config, folder / "hosts", link, echo))
        held.enter_context(shared)
        inputs = Inputs(_upload(shared, paths), {s: paths[s] for s in sizes})
        ctx = RunContext(
            folder / "runs",
            config.workers,
            progress,
            config.time_limit_s,
            intermediate=config.intermediate,
            in_flight_bytes=in_flight_bytes(points, paths),
            network=network,
        )
        measure = Measurement(shared, inputs, ReferenceBook(paths), config.link, echo)
        passes = [(n, name) for n in range(1, config.rounds + 1) for name in config.systems]
        for round_no, name in passes:
            echo(f"== {name}: starting" + (f" (round {round_no})" if config.rounds > 1 else ""))
            began = time.monotonic()
            with make_system(name, shared, ctx) as system:
                measure.warm_up(system, max(sizes), min(sizes), config.parallel)
                echo(f"   started and warmed up in {time.monotonic() - began:.1f} s")
                for point in points:
                    closed = measure.point(system, point, round_no)
                    results.append(closed)
                    for load in config.loads:
                        if not closed.completed or not closed.throughput_wps:
                            break  # no pace to take a share of
                        rate = round(load * closed.throughput_wps, 4)
                        opened = dataclasses.replace(point, arrival_rate=rate, load=load)
                        results.append(measure.point(system, opened, round_no))
    after = machine_state()
    machine = {
        **before,
        "loadavg_after": after["loadavg"],
        "other_busy_processes_after": after["other_busy_processes"],
    }
    config_dict = {
        k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()
    }
    config_dict["memory_settings"] = MEMORY_SETTINGS
    if link:
        machine["host_link"] = link
    return BenchReport(compare_to_floor(results), config_dict, machine)
