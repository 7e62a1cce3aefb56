"""``cdiflow bench ar``: the AR application over every backend, side by side in one run.

For every detector count it runs detection alone in a process pool (``pool``, the fps
goal's reference) and the pipeline over each backend, after one ``floor`` run (the whole
application in one process). ``cdi-shm`` gets a minion of its own per run, so its CPU and
peak memory are that run's. Across two hosts (``hosts=2``: the paper's multi-host figures)
the pipelines run spread over them (``apps.ar.runtime``) and ``cdi-rpc`` gets a cluster of
its own per run, minions and gateways on both hosts; ``floor`` and ``pool`` stay one process
and N processes on the launcher's host, as they move nothing. With ``rounds`` > 1 the whole
set runs again in turn and each figure is the median of its rounds.

Each row: ``fps`` frames out per second, from the first role's start to the last one's end;
``latency_ms_p50`` from the start of a frame's decode to the end of its encode;
``cpu_ms_per_frame`` CPU per frame by role (all detectors together; for CDI the runtime's as
``minion``: minion and gateway of every host, and the controller across hosts);
``cpu_ms_per_frame_compute``, ``cpu_ms_per_frame_moving`` and ``cpu_ms_per_frame_other``
split that CPU (their sum is the sum over roles), each part measured in the roles' own
processes where it is spent, never a difference between runs: the application's own work
(decode, detect, draw, encode, timed on the role's thread); moving frames (the role's
thread inside its end of the pipeline, the role's other threads — the link's servers — and
the CDI runtime; ``None`` for the references, which move nothing); the roles' own loops
(message headers, boxes). ``peak_rss_mb`` peak
resident memory by role (the largest detector). Shared memory counts in every process that
touched it (a CDI object in the extractor's, a detector's, the combinator's): resident
memory is not additive across roles.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from apps.ar.config import RunConfig
from apps.ar.launch import PipelineResult, run_floor, run_pipeline, run_pool
from apps.ar.links import backend
from apps.ar.runtime import HOST_OF_ROLE, prepare
from cdi.hosts import HostNetwork
from workflows.ar.sample import SampleVideo, make_sample_video
from workflows.ar.video import probe

__all__ = ["BenchPlan", "run_bench", "sample_for_bench"]


@dataclass(frozen=True)
class BenchPlan:
    video: str
    backends: Sequence[str]
    detectors: Sequence[int]
    frames: int | None = None
    rounds: int = 1
    depth: int = 2
    hosts: int = 1
    """2: the pipelines across two hosts (``run_bench`` is given their network)."""
    busy_poll_us: int = 0
    """The minion's polling after a container starts waiting (see ``apps.ar.links.cdi_link``
    on why not to poll in this application)."""
    options: dict[str, str] = field(default_factory=dict)


def sample_for_bench(data_dir: Path, frames: int) -> Path:
    """The generated sample video of ``frames`` frames, made once per data folder."""
    path = data_dir / f"ar-sample-{frames}.mp4"
    if not path.exists():
        made = make_sample_video(path.with_suffix(".tmp.mp4"), SampleVideo(frames=frames))
        made.rename(path)
    return path


def _row(name: str, result: PipelineResult) -> dict[str, Any]:
    compute, moving, other = result.cpu_ms_per_frame_split()
    return {
        "backend": name,
        "detectors": result.config.detectors,
        "fps": result.fps,
        "latency_ms_p50": result.latency_ms_p50,
        "cpu_ms_per_frame": result.cpu_ms_per_frame(),
        "cpu_ms_per_frame_compute": compute,
        "cpu_ms_per_frame_moving": moving,
        "cpu_ms_per_frame_other": other,
        "peak_rss_mb": result.peak_rss_mb(),
        # Not in the published row shape: kept beside it (see ``_split_extras``).
        "_outside": None if name == "pool" else result.cpu_ms_per_frame_outside_compute(),
        "_detector_growth_mb": result.detector_growth_mb(),
        "_moving_by_part": None
        if name in ("floor", "pool")
        else result.moving_ms_per_frame_by_part(),
    }


def _one_round(
    plan: BenchPlan,
    base: RunConfig,
    network: HostNetwork | None,
    progress: Callable[[str], None],
) -> list[dict[str, Any]]:
    progress("floor: the whole application in one process")
    rows = [_row("floor", run_floor(replace(base, backend="floor", detectors=1)))]
    for count in plan.detectors:
        progress(f"pool: detection alone in {count} processes")
        rows.append(_row("pool", run_pool(replace(base, backend="pool", detectors=count))))
        for name in plan.backends:
            progress(f"{name}: {count} detector(s)")
            config = replace(base, backend=name, detectors=count, run_id=f"ar{os.getpid()}-{count}")
            rows.append(_row(name, _run_backend(plan, config, network)))
    return rows


def _run_backend(plan: BenchPlan, config: RunConfig, network: HostNetwork | None) -> PipelineResult:
    with prepare(config, network, ("--busy-poll-us", str(plan.busy_poll_us))) as ready:
        return run_pipeline(ready.config, ready.runtime_pids)


# A row's CPU figures, which add up: they all come from one round, the one whose total CPU
# per frame is the median (the lower of the two middle ones for an even count).
_CPU_KEYS = (
    "cpu_ms_per_frame",
    "cpu_ms_per_frame_compute",
    "cpu_ms_per_frame_moving",
    "cpu_ms_per_frame_other",
    "_outside",
    "_moving_by_part",
)


def _median_rows(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each row's figures, the median over rounds (rows match by position: same plan); its
    CPU figures those of its median round (``_CPU_KEYS``)."""
    merged = []
    for same in zip(*rounds, strict=True):
        row = dict(same[0])
        for key, value in row.items():
            if isinstance(value, float):
                row[key] = statistics.median(r[key] for r in same)
            elif isinstance(value, dict):
                row[key] = {k: statistics.median(r[key][k] for r in same) for k in value}
        totals = [sum(r["cpu_ms_per_frame"].values()) for r in same]
        middle = same[totals.index(statistics.median_low(totals))]
        row.update({key: middle[key] for key in _CPU_KEYS})
        merged.append(row)
    return merged


def _split_extras(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The published rows, and the figures kept beside them."""
    results, outside, growth, moving = [], [], [], []
    for row in rows:
        key = {"backend": row["backend"], "detectors": row["detectors"]}
        if row["_outside"] is not None:
            outside.append({**key, "cpu_ms_per_frame": row["_outside"]})
        if row["_moving_by_part"] is not None:
            moving.append({**key, "cpu_ms_per_frame": row["_moving_by_part"]})
        if row["_detector_growth_mb"] is not None:
            growth.append({**key, "mb": row["_detector_growth_mb"]})
        results.append({k: v for k, v in row.items() if not k.startswith("_")})
    return results, {
        "outside_compute": outside,
        "detector_growth": growth,
        "moving_by_part": moving,
    }


def _goals(rows: list[dict[str, Any]], frame_mb: float) -> list[dict[str, Any]]:
    """CDI (CDI-SHM, or CDI-RPC across hosts) against its goals, per detector count, from this
    run's rows: moving costs as a
    share of gRPC's and TCP's, fps as a share of the pool's, and how much more a detector's
    memory grew than a TCP detector's, which holds one frame buffer (frames; the detector's own
    working memory is in both and cancels)."""
    by = {(r["backend"], r["detectors"]): r for r in rows}
    goals = []
    for (name, count), row in by.items():
        if not name.startswith("cdi-"):
            continue
        goal: dict[str, Any] = {"backend": name, "detectors": count}
        for other in ("grpc", "tcp"):
            if (other, count) in by and by[(other, count)]["cpu_ms_per_frame_moving"]:
                theirs = by[(other, count)]["cpu_ms_per_frame_moving"]
                goal[f"moving_vs_{other}"] = row["cpu_ms_per_frame_moving"] / theirs
        if ("pool", count) in by:
            goal["fps_vs_pool"] = row["fps"] / by[("pool", count)]["fps"]
        tcp = by.get(("tcp", count))
        if tcp is not None and tcp["_detector_growth_mb"] and row["_detector_growth_mb"]:
            extra = row["_detector_growth_mb"] - tcp["_detector_growth_mb"]
            goal["detector_frames_over_tcp"] = extra / frame_mb
        goals.append(goal)
    return goals


def run_bench(
    plan: BenchPlan,
    network: HostNetwork | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Run ``plan`` (across hosts: on ``network``'s first two); the JSON document ``cdiflow
    bench ar --json`` prints."""
    if (network is not None) != (plan.hosts == 2):
        raise ValueError("a plan across two hosts needs their network, and only it does")
    for name in plan.backends:
        backend(name, plan.hosts)  # an unavailable backend fails before anything runs
    info = probe(plan.video)
    base = RunConfig(
        backend="floor",
        video=plan.video,
        width=info.width,
        height=info.height,
        frames=plan.frames,
        depth=plan.depth,
        options=dict(plan.options),
    )
    rounds = []
    for number in range(plan.rounds):
        if plan.rounds > 1:
            progress(f"round {number + 1} of {plan.rounds}")
        rounds.append(_one_round(plan, base, network, progress))
    rows = _median_rows(rounds)
    results, extras = _split_extras(rows)
    frames = plan.frames or info.frames
    hosts: dict[str, Any] = {"count": 1}
    if network is not None:
        hosts = {
            "count": 2,
            "kind": network.kind,
            "reason": network.reason,
            "placement": {role: network.hosts[i].name for role, i in HOST_OF_ROLE.items()},
        }
    return {
        "results": results,
        "video": {
            "path": plan.video,
            "width": info.width,
            "height": info.height,
            "frames": frames,
            "frame_mb": info.frame_bytes / 1e6,
            "message_mb": base.message_size / 1e6,
        },
        "hosts": hosts,
        "rounds": plan.rounds,
        "depth": plan.depth,
        "goals": _goals(rows, info.frame_bytes / 1e6),
        **extras,
    }
