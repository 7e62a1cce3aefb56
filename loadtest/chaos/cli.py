"""``cdiflow bench chaos``: every fault on a fresh stack under load, a burst and a soak; a table
or JSON of results."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any, Protocol

import click

from loadtest.chaos.burst import BurstResult, run_burst
from loadtest.chaos.faults import FAULTS, Fault, Kind, Target, disk_full, partition, s3_outage
from loadtest.chaos.run import CaseResult, chaos_stack, run_case
from loadtest.chaos.soak import GROWTH_GOAL_PCT, SoakResult, run_soak
from loadtest.chaos.workload import SHAPES
from orchestrator.stack import RestartPolicy

__all__ = ["bench_chaos_command"]

LOADS = ("burst", "soak")  # cases that are a load, not a fault struck under one
NAMES = (*(f.name for f in FAULTS), *LOADS)


class _Result(Protocol):
    @property
    def passed(self) -> bool: ...

    def as_dict(self) -> dict[str, Any]: ...


@click.command("chaos")
@click.option(
    "--faults",
    default="all",
    show_default=True,
    help=f"Comma-separated, or 'all' (with the soak: over an hour): {', '.join(NAMES)}.",
)
@click.option(
    "--workflows",
    default=60,
    show_default=True,
    type=click.IntRange(3, 1000),
    help="Workflows in flight when each fault strikes.",
)
@click.option(
    "--workload",
    default="chain",
    show_default=True,
    type=click.Choice(list(SHAPES)),
    help="What runs when each fault strikes: the chain under every policy, the fork/join graph "
    "under transfer and auto (a join's inputs handed straight to its worker), or both in turn. "
    "The faults struck at a join's held input run the graph when this is 'chain'.",
)
@click.option(
    "--target",
    "targets",
    default="embedded,external",
    show_default=True,
    help="Comma-separated: 'embedded' (the stack's own services, supervised by it) "
    "and/or 'external' (Postgres, Redis and S3 started apart, restarted by this run). A fault "
    "that needs one (two hosts, a gate before S3, a small disk) runs only where it can.",
)
@click.option(
    "--deadline",
    default=180.0,
    show_default=True,
    type=float,
    help="Seconds each case may take to bring every workflow to its end, after its fault.",
)
@click.option("--cut-s", default=10.0, show_default=True, help="partition: the cut's length.")
@click.option("--s3-down-s", default=30.0, show_default=True, help="s3-outage: down this long…")
@click.option("--s3-slow-s", default=30.0, show_default=True, help="…then slow this long…")
@click.option("--s3-delay-s", default=1.0, show_default=True, help="…by this much a request.")
@click.option("--disk-full-s", default=30.0, show_default=True, help="disk-full: how long.")
@click.option(
    "--burst",
    "burst_workflows",
    default=5000,
    show_default=True,
    type=click.IntRange(1, 100_000),
    help="burst: workflows started at once.",
)
@click.option(
    "--burst-clients",
    default=1000,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="burst: connections they are started from, together.",
)
@click.option(
    "--soak-s",
    default=3600.0,
    show_default=True,
    type=click.FloatRange(10.0),
    help="soak: seconds of steady load (the peak is measured first; 60 for a smoke test).",
)
@click.option("--soak-load", default=0.8, show_default=True, help="soak: fraction of the peak.")
@click.option(
    "--sample-every-s", default=30.0, show_default=True, help="soak: seconds between samples."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_chaos_command(
    faults: str,
    workflows: int,
    workload: str,
    targets: str,
    deadline: float,
    cut_s: float,
    s3_down_s: float,
    s3_slow_s: float,
    s3_delay_s: float,
    disk_full_s: float,
    burst_workflows: int,
    burst_clients: int,
    soak_s: float,
    soak_load: float,
    sample_every_s: float,
    as_json: bool,
) -> None:
    """Strike each fault with WORKFLOWS in flight, on a fresh stack each time: how long until a
    new workflow completes (recovery; for a fault that lasts, also after its end), and whether
    every workflow ended right (0 stuck, 0 lost, 0 wrong; for a short partition or S3 outage,
    none failed). Then a burst of starts at once (no 5xx, 429 where the API is full, all
    complete) and a soak at a fraction of the peak (memory and open files flat). Exits 1 if
    any case missed its goal."""
    names = list(NAMES) if faults == "all" else [f.strip() for f in faults.split(",") if f]
    if unknown := [n for n in names if n not in NAMES]:
        raise click.BadParameter(f"unknown fault(s) {unknown}; choose from {', '.join(NAMES)}")
    try:
        kinds = [Kind(t.strip()) for t in targets.split(",") if t.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; use embedded and/or external") from None
    catalogue = _catalogue(cut_s, s3_down_s, s3_slow_s, s3_delay_s, disk_full_s)
    results: list[_Result] = []
    for name in names:
        if name in LOADS and Kind.EMBEDDED not in kinds:
            _say(f"{name}: skipped, it runs on the embedded stack only")
            continue
        if name == "burst":
            _say(f"burst of {burst_workflows} workflows from {burst_clients} connections")
            with chaos_stack(policy=RestartPolicy()) as target:
                results.append(run_burst(target, workflows=burst_workflows,
                                         clients=burst_clients))  # fmt: skip
            continue
        if name == "soak":
            _say(f"soak: {soak_s:g} s at {soak_load:g} of the peak")
            with chaos_stack(policy=RestartPolicy()) as target:
                results.append(run_soak(target, duration_s=soak_s, load=soak_load,
                                        sample_every_s=sample_every_s))  # fmt: skip
            continue
        fault = catalogue[name]
        runnable = [k for k in kinds if k in fault.kinds]
        if not runnable:
            _say(f"{name}: skipped, it runs on {', '.join(fault.kinds)} only")
        shape = "graph" if fault.graphs and workload == "chain" else workload
        for kind in runnable:
            _say(f"{name} ({kind}) with {workflows} workflows ({shape}) ...")
            with chaos_stack(external=kind is Kind.EXTERNAL, rig=fault.rig) as target:
                results.append(run_case(target, fault, workflows=workflows, deadline_s=deadline,
                                        workload=shape))  # fmt: skip
    if as_json:
        click.echo(json.dumps({"results": [r.as_dict() for r in results]}))
    else:
        click.echo(report(results))
    if not all(r.passed for r in results):
        sys.exit(1)


def _catalogue(
    cut_s: float, s3_down_s: float, s3_slow_s: float, s3_delay_s: float, disk_full_s: float
) -> dict[str, Fault[Target]]:
    """Every fault by name, the held ones as long as asked."""
    held = (partition(cut_s), s3_outage(s3_down_s, s3_slow_s, s3_delay_s), disk_full(disk_full_s))
    return {f.name: f for f in FAULTS} | {f.name: f for f in held}


def _say(line: str) -> None:
    print(f"chaos: {line}", file=sys.stderr, flush=True)


def report(results: Sequence[_Result]) -> str:
    """The faults' table, then the burst's and the soak's lines."""
    faults = [r for r in results if isinstance(r, CaseResult)]
    parts = [table(faults)] if faults else []
    parts += [_burst(r) for r in results if isinstance(r, BurstResult)]
    parts += [_soak(r) for r in results if isinstance(r, SoakResult)]
    return "\n\n".join(parts)


def table(results: Sequence[CaseResult]) -> str:
    header = ("fault", "target", "workload", "held s", "wf", "done", "failed", "stuck", "lost",
              "wrong", "leaked", "rerun", "recovery s", "after end s", "took s", "ok")  # fmt: skip
    line = ("{:32} {:9} {:8} {:>6} {:>4} {:>5} {:>6} {:>5} {:>4} {:>5} {:>6} {:>5} {:>10} {:>11} "
            "{:>7} {:>3}")  # fmt: skip
    lines = [line.format(*header)]
    for r in results:
        recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
        after = (
            "-"
            if r.recovery_after_end_s is None or not r.held_s
            else (f"{r.recovery_after_end_s:.1f}")
        )
        lines.append(line.format(
            r.fault, r.target, r.workload, f"{r.held_s:g}", r.workflows + r.probes + r.fed,
            r.completed, r.failed, r.stuck, r.lost, r.wrong, r.leaked_objects,
            "-" if r.rerun_from_input is None else r.rerun_from_input,
            recovery, after, f"{r.duration_s:.1f}",
            "yes" if r.passed else "NO",
        ))  # fmt: skip
    for r in results:
        for reason in r.failures[:5]:
            lines.append(f"  {r.fault}: FAILED with: {reason[:160]}")
        for problem in r.problems:
            lines.append(f"  {r.fault}: {problem[:200]}")
        if r.refused:
            lines.append(f"  {r.fault}: starts refused: {r.refused}")
        if r.scheduler_stalled_s >= 5:
            lines.append(f"  {r.fault}: the scheduler's loop stood still for "
                         f"{r.scheduler_stalled_s:.1f} s")  # fmt: skip
    return "\n".join(lines)


def _burst(r: BurstResult) -> str:
    drained = "not all" if r.drained_s is None else f"{r.drained_s:.0f} s"
    return (
        f"burst: {r.workflows} workflows from {r.clients} connections: all taken in "
        f"{r.accepted_s:.1f} s, all ended in {drained}; answers {r.answers} "
        f"({r.server_errors} 5xx); completed {r.completed}, failed {r.failed}, stuck {r.stuck}, "
        f"lost {r.lost}, wrong {r.wrong}, objects left {r.leaked_objects}; "
        f"{'yes' if r.passed else 'NO'}"
        + "".join(f"\n  burst: {p}" for p in [*r.problems, *r.failures[:5]])
    )


def _soak(r: SoakResult) -> str:
    lines = [
        f"soak: {r.duration_s:g} s at {r.rate_wps:.2f} workflows/s ({r.load:g} of the peak, "
        f"{r.peak_wps:.2f}/s); {r.completed_wps:.2f}/s finished meanwhile, "
        f"{r.behind_at_end} behind at its end; {r.workflows} workflows: "
        f"completed {r.completed}, failed {r.failed}, stuck {r.stuck}, lost {r.lost}, "
        f"wrong {r.wrong}, objects left {r.leaked_objects}; restarts {r.restarts}",
        f"  growth over the last {r.window_s:g} s (goal <= {GROWTH_GOAL_PCT:g} %):",
    ]
    for metric, g in r.growth.items():
        lines.append(f"    {metric:28} {g['first']:>14.0f} -> {g['last']:>14.0f}  "
                     f"{g['percent']:+6.1f} %")  # fmt: skip
    if r.postgres_bytes_per_workflow is not None:
        lines.append(f"  Postgres: {r.postgres_bytes_per_workflow:.0f} bytes a workflow")
    lines.append(f"  {'yes' if r.passed else 'NO'}")
    lines += [f"  soak: {p}" for p in [*r.problems, *r.failures[:5]]]
    return "\n".join(lines)
