"""``cdiflow bench workflows``: workflow latency and throughput, cdiflow beside the baselines.

``--quick``: orchestration overhead on one cdiflow stack (no-op and image pipelines, every
policy). ``--scenario 1|2|3|all``: the load test, each system started, driven through locust
and stopped by the benchmark. Mounted by ``cdiflow`` under ``bench``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import click

from cdi.errors import CDIError
from cdi.link_emulator import Link
from cdi.minion.config import parse_bytes
from orchestrator.stack.state import DataDirLock

__all__ = ["bench_workflows_command", "one_run_per_folder", "parse_sizes", "terminated_by_signal"]

_LOCK_FILE = "bench.lock"


def terminated_by_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise click.BadParameter(f"{what}: write whole numbers separated by commas") from exc
    if not values or any(v < 1 for v in values):
        raise click.BadParameter(f"{what}: give at least one number, each 1 or more")
    return values


def _shares(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise click.BadParameter("open loop: write shares such as 0.5,0.8,0.95") from exc
    if not values or any(not 0 < v <= 2 for v in values):
        raise click.BadParameter("open loop: give at least one share, each above 0 and <= 2")
    return values


def parse_sizes(text: str) -> tuple[int, ...]:
    """Image sizes as the benchmarks' options give them (``10KB,2MB``)."""
    try:
        values = tuple(parse_bytes(v) for v in text.split(",") if v.strip())
    except CDIError as exc:  # ConfigError: not a size
        raise click.BadParameter(str(exc)) from exc
    if not values or any(v < 1000 for v in values):
        raise click.BadParameter("sizes: give at least one, each 1KB or more")
    return values


@click.command("workflows")
@click.option(
    "--quick",
    is_flag=True,
    help="Orchestration overhead on one stack: no-op and image pipelines per policy.",
)
@click.option(
    "--scenario",
    type=click.Choice(["1", "2", "3", "all"]),
    help="1: image sizes, 10 in parallel; 2: concurrency; 3: pipeline length.",
)
@click.option(
    "--sizes",
    default="10KB,100KB,500KB,2MB",
    show_default=True,
    help="Scenario 1 image sizes (scenario 3 uses one size if you give one).",
)
@click.option(
    "--concurrency",
    default="1,50,100,200,500",
    show_default=True,
    help="Scenario 2 concurrent workflows.",
)
@click.option(
    "--tasks",
    default="1,3,6,10",
    show_default=True,
    help="Scenario 3 pipeline lengths (image tasks).",
)
@click.option(
    "--systems",
    default=None,
    help="Comma-separated; default: floor,floor-s3,affinity,transfer,auto,object-store,celery,"
    "ray,conductor,temporal (--quick: affinity,transfer,auto,object-store). floor-s3 is the "
    "floor plus each workflow's S3 GET of its input and encode and PUT of its result; "
    "conductor-redis is Conductor on Redis alone, without its search index.",
)
@click.option(
    "--s3-link",
    type=click.Choice(["loopback", "regional"]),
    default="loopback",
    show_default=True,
    help="regional: S3 behind a proxy adding ~10 ms RTT, 100 MB/s.",
)
@click.option(
    "--hosts",
    default=1,
    show_default=True,
    type=click.IntRange(1, 8),
    help="Spread every system's workers over this many hosts: network namespaces joined by "
    "an emulated link (--link-mbit, --link-rtt-ms) that all their traffic between hosts "
    "crosses, S3 behind the regional link (needs root, `ip` and `nft`). Systems: "
    "floor, affinity, transfer, auto, object-store, ray.",
)
@click.option(
    "--link-mbit",
    default=1000.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="--hosts: the link's bandwidth (tbf on each host's veth).",
)
@click.option(
    "--link-rtt-ms",
    default=0.5,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="--hosts: the link's round trip (added in user space: this kernel has no netem).",
)
@click.option(
    "--intermediate",
    type=click.Choice(["raw", "png", "jpeg"]),
    default="raw",
    show_default=True,
    help="How the systems that pass images through S3 between tasks (object-store, celery, "
    "conductor, temporal) store them: raw (an uncompressed TIFF, lossless), png (lossless) "
    "or jpeg (quality 90, lossy).",
)
@click.option(
    "--open-loop",
    "open_loop",
    default=None,
    metavar="SHARES",
    help="After each point, run it again as an open loop (workflows started at a fixed "
    "rate) at these shares of the system's closed-loop throughput there, e.g. 0.5,0.8,0.95.",
)
@click.option(
    "--workflows",
    "min_workflows",
    default=30,
    show_default=True,
    type=click.IntRange(1),
    help="At least this many workflows per system and point.",
)
@click.option(
    "--workers",
    default=2,
    show_default=True,
    type=click.IntRange(1),
    help="Worker processes of every system (the floor's pool too).",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(1, 20),
    help="Run every system this many times in turn (floor, A, B, floor, A, B, ...): each ratio "
    "uses its own round's floor, and a table of medians follows. For a machine whose speed "
    "drifts.",
)
@click.option(
    "--repeat",
    default=30,
    show_default=True,
    type=click.IntRange(1),
    help="--quick: sequential workflows per system and pipeline.",
)
@click.option(
    "--burst",
    default=20,
    show_default=True,
    type=click.IntRange(1),
    help="--quick: workflows started at once for the throughput figure.",
)
@click.option(
    "--data-dir",
    default=".data/bench",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Images, services, stacks and logs of the run.",
)
@click.option(
    "--json",
    "json_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the results as JSON here ('-': stdout, and the table goes to stderr).",
)
@click.option(
    "--plots",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write PNG figures here (needs matplotlib: the 'bench' extra).",
)
@click.option("--quiet", is_flag=True, help="No locust progress table.")
def bench_workflows_command(
    quick: bool,
    scenario: str | None,
    sizes: str,
    concurrency: str,
    tasks: str,
    systems: str | None,
    s3_link: str,
    hosts: int,
    link_mbit: float,
    link_rtt_ms: float,
    intermediate: str,
    open_loop: str | None,
    min_workflows: int,
    workers: int,
    rounds: int,
    repeat: int,
    burst: int,
    data_dir: Path,
    json_file: Path | None,
    plots: Path | None,
    quiet: bool,
) -> None:
    """Workflow latency (p50/p99) and throughput per system, side by side in one run."""
    if quick == (scenario is not None):
        raise click.UsageError("give either --quick or --scenario 1|2|3|all")
    if quick and hosts > 1:
        raise click.UsageError("--hosts goes with --scenario, not --quick")
    if hosts > 1 and s3_link != "regional":
        s3_link = "regional"  # across hosts, S3 is a regional service, as in a data centre
        click.echo("--hosts: S3 behind the regional link", err=True)
    # SIGTERM unwinds like Ctrl-C, so every system started so far is stopped by PID.
    signal.signal(signal.SIGTERM, terminated_by_signal)
    to_stdout = json_file is not None and str(json_file) == "-"
    out = sys.stderr if to_stdout else sys.stdout

    def echo(message: str) -> None:
        click.echo(message, file=sys.stderr)

    chosen = tuple(s.strip() for s in systems.split(",") if s.strip()) if systems else None
    if quick:
        payload = _quick(chosen, repeat, burst, workers, data_dir, echo, out)
    else:
        payload = _scenarios(
            scenario or "all",
            chosen,
            parse_sizes(sizes),
            _ints(concurrency, "concurrency"),
            _ints(tasks, "tasks"),
            s3_link,
            (hosts, Link(link_mbit, link_rtt_ms)),
            intermediate,
            _shares(open_loop) if open_loop else (),
            min_workflows,
            workers,
            rounds,
            data_dir,
            quiet,
            echo,
            out,
        )
        if plots is not None:
            from loadtest.plots import write_plots

            for path in write_plots(payload.get("summary") or payload["results"], plots):
                echo(f"plot: {path}")
    if json_file is not None:
        text = json.dumps(payload, indent=1)
        if to_stdout:
            click.echo(text)
        else:
            json_file.write_text(text + "\n")
            echo(f"results: {json_file}")
    if payload.get("result_problems"):
        # After the figures are out, so the reader sees what the wrong results came with.
        raise click.ClickException(
            "stored results failed their check:\n" + "\n".join(payload["result_problems"])
        )


@contextlib.contextmanager
def one_run_per_folder(data_dir: Path) -> Iterator[None]:
    """Hold ``<data_dir>/bench.lock`` for the run: a second run on the folder would find the
    first one's Postgres on its files (``StackRunning``, reported by the ``cdiflow`` command
    as a message, like a system or service that cannot start)."""
    lock = DataDirLock(data_dir.absolute(), name=_LOCK_FILE, busy=_busy_message)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


def _busy_message(data_dir: Path, pid: int | None) -> str:
    who = f" (pid {pid})" if pid is not None else ""
    return (
        f"another `cdiflow bench workflows` is running with --data-dir {data_dir}{who}; "
        "wait for it to finish, stop it, or give this run another --data-dir"
    )


def _quick(
    chosen: tuple[str, ...] | None,
    repeat: int,
    burst: int,
    workers: int,
    data_dir: Path,
    echo: Callable[[str], None],
    out: IO[str],
) -> dict[str, Any]:
    from loadtest.quick import QUICK_SYSTEMS, run_quick
    from loadtest.report import graphs_goals, graphs_table, quick_goals, quick_table
    from loadtest.runner import machine_state

    unknown = [s for s in chosen or () if s not in QUICK_SYSTEMS]
    if unknown:
        raise click.BadParameter(f"--quick measures {', '.join(QUICK_SYSTEMS)}; not {unknown}")
    machine = machine_state()
    with one_run_per_folder(data_dir):
        report = run_quick(
            repeat=repeat,
            burst=burst,
            workers=workers,
            systems=chosen or QUICK_SYSTEMS,
            data_dir=data_dir.absolute() / "quick",
            progress=echo,
        )
    click.echo(
        f"\n{repeat} sequential workflows each (latency: server finished_at - created_at)"
        f", then {burst} at once (throughput)\n",
        file=out,
    )
    click.echo(quick_table(report.rows), file=out)
    if report.graphs or report.tiles:
        click.echo("\n" + graphs_table(report.graphs, report.tiles), file=out)
    goals = [quick_goals(report.rows), graphs_goals(report.graphs, report.tiles)]
    click.echo("\n" + "\n".join(g for g in goals if g), file=out)
    return {**report.as_dict(), "machine": machine}


def _scenarios(
    scenario: str,
    chosen: tuple[str, ...] | None,
    sizes: tuple[int, ...],
    concurrency: tuple[int, ...],
    tasks: tuple[int, ...],
    link: str,
    spread: tuple[int, Link],
    intermediate: str,
    loads: tuple[float, ...],
    min_workflows: int,
    workers: int,
    rounds: int,
    data_dir: Path,
    quiet: bool,
    echo: Callable[[str], None],
    out: IO[str],
) -> dict[str, Any]:
    from loadtest.hosts import DEFAULT_HOST_SYSTEMS, HOST_SYSTEMS, host_goals
    from loadtest.report import resources_table, result_problems, scenario_table
    from loadtest.runner import (
        ALL_SYSTEMS,
        AVAILABLE,
        DEFAULT_SYSTEMS,
        BenchConfig,
        median_over_rounds,
        run_benchmark,
    )

    hosts, host_link = spread
    systems = chosen or (DEFAULT_HOST_SYSTEMS if hosts > 1 else DEFAULT_SYSTEMS)
    unknown = [s for s in systems if s not in ALL_SYSTEMS]
    if unknown:
        raise click.BadParameter(f"unknown system(s) {unknown}; choose from {ALL_SYSTEMS}")
    single = [s for s in systems if hosts > 1 and s not in HOST_SYSTEMS]
    if single:
        raise click.BadParameter(
            f"{single} run on one host only; with --hosts choose from {HOST_SYSTEMS}"
        )
    missing = [s for s in systems if s not in AVAILABLE]
    if missing:
        raise click.BadParameter(f"{missing} not implemented yet; available: {AVAILABLE}")
    config = BenchConfig(
        scenarios=("1", "2", "3") if scenario == "all" else (scenario,),
        systems=systems,
        sizes=sizes,
        concurrency=concurrency,
        tasks=tasks,
        link=link,
        workers=workers,
        min_workflows=min_workflows,
        data_dir=data_dir,
        rounds=rounds,
        intermediate=intermediate,
        loads=loads,
        hosts=hosts,
        host_link=host_link,
    )
    with one_run_per_folder(data_dir):
        report = run_benchmark(config, progress=None if quiet else sys.stderr, echo=echo)
    click.echo("\n" + scenario_table(report.results, rounds=rounds > 1), file=out)
    if rounds > 1:
        medians = median_over_rounds(report.results)
        click.echo(f"\nmedian of {rounds} rounds (each ratio to its own round's floor)", file=out)
        click.echo(scenario_table(medians), file=out)
    if hosts > 1:
        seen = report.machine.get("host_link", {})
        click.echo(f"\n{hosts} hosts, link {seen.get('stated')}, measured {seen.get('measured')}"
                   "\n" + host_goals(report.results), file=out)  # fmt: skip
    click.echo("\n" + resources_table(report.results), file=out)
    problems = result_problems(report.results)
    click.echo(
        "\nstored results: "
        + (
            "every point's passed their check"
            if not problems
            else f"{len(problems)} point(s) FAILED"
        ),
        file=out,
    )
    return {**report.as_dict(), "result_problems": problems}
