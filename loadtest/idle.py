"""``cdiflow bench idle``: what a running cdiflow stack costs while it has nothing to do.

A stack that waits for work still wakes up: the scheduler's housekeeping tick, the workers'
heartbeats and blocking pops, the API's server loop and finish watch, the CDI processes' gRPC
threads, Redis's and Postgres's own timers. That CPU is paid on every machine that runs the
stack, and during a load test it is part of every workflow's cost (at 2 MB a workflow takes a
third of a second of the stack's time). This starts the stack the load test starts (embedded
Postgres, Redis and S3, the ``affinity`` policy), lets it settle, and reads the CPU of every
process for ``seconds`` with the load test's meter (``loadtest.resources``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import click

from loadtest.cli import one_run_per_folder, terminated_by_signal
from loadtest.resources import ResourceMeter
from loadtest.runner import machine_state
from loadtest.systems.base import RunContext
from loadtest.systems.cdiflow_sys import CdiflowSystem
from loadtest.systems.services import BenchServices
from orchestrator.services import RunningServices

__all__ = ["bench_idle_command", "measure_idle"]


def measure_idle(
    data_dir: Path,
    seconds: float,
    settle_s: float,
    workers: int,
    *,
    services: RunningServices | None = None,
    redis_db: int = 1,
) -> dict[str, Any]:
    """Start the stack, wait ``settle_s``, meter ``seconds``; CPU ms per second by component.
    ``services``: running ones to use (tests), the stack taking Redis database ``redis_db``."""
    folder = data_dir.absolute()
    before = machine_state()
    with BenchServices(folder / "services", given=services, first_redis_db=redis_db) as shared:
        ctx = RunContext(folder / "runs", workers, None)
        with CdiflowSystem("affinity", shared, ctx):
            time.sleep(settle_s)  # start-up work (imports, first connections) is not idling
            meter = ResourceMeter()
            meter.start()
            time.sleep(seconds)
            used = meter.stop(1)  # one "workflow": the per-workflow figures are the window's
    components = {
        name: {
            "cpu_ms_per_s": round(u["cpu_s"] * 1000 / seconds, 2),
            "sys_ms_per_s": round(u["sys_ms_per_workflow"] / seconds, 2),
            "peak_rss_mib": u["peak_rss_mib"],
        }
        for name, u in used.items()
    }
    total = sum(c["cpu_ms_per_s"] for c in components.values())
    return {
        "machine": {**before, "loadavg_after": [round(x, 2) for x in os.getloadavg()]},
        "seconds": seconds,
        "workers": workers,
        "total_cpu_ms_per_s": round(total, 2),
        "components": components,
    }


def idle_table(result: dict[str, Any]) -> str:
    load = result["machine"]["loadavg"][0], result["machine"]["loadavg_after"][0]
    lines = [
        f"idle stack, {result['workers']} workers, {result['seconds']:g} s metered "
        f"(load {load[0]:.2f} -> {load[1]:.2f}): "
        f"{result['total_cpu_ms_per_s']:.2f} ms of CPU a second "
        f"({result['total_cpu_ms_per_s'] / 10:.2f} % of one core)",
        f"  {'component':<22}{'CPU ms/s':>10}{'of it sys':>11}{'peak MiB':>10}",
    ]
    for name, c in result["components"].items():
        lines.append(
            f"  {name:<22}{c['cpu_ms_per_s']:>10.2f}{c['sys_ms_per_s']:>11.2f}"
            f"{c['peak_rss_mib']:>10.0f}"
        )
    return "\n".join(lines)


@click.command("idle")
@click.option("--seconds", default=30.0, show_default=True, type=click.FloatRange(1, 3600))
@click.option(
    "--settle",
    "settle_s",
    default=5.0,
    show_default=True,
    type=click.FloatRange(0, 600),
    help="Seconds between the stack being ready and the start of the measurement.",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".data/bench-idle"),
    show_default=True,
    help="Folder for the stack's services and logs (a run of its own).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_idle_command(
    seconds: float, settle_s: float, workers: int, data_dir: Path, as_json: bool
) -> None:
    """What a running stack with no work costs: CPU a second, by component."""
    signal.signal(signal.SIGTERM, terminated_by_signal)  # unwind: stop what was started
    with one_run_per_folder(data_dir):
        result = measure_idle(data_dir, seconds, settle_s, workers)
    click.echo(json.dumps(result, indent=1) if as_json else idle_table(result))
