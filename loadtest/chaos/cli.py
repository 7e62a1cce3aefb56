"""``cdiflow bench chaos``: every fault on a fresh stack under load, a table or JSON of results."""

from __future__ import annotations

import json
import sys

import click

from loadtest.chaos.faults import FAULTS
from loadtest.chaos.run import CaseResult, chaos_stack, run_case

__all__ = ["bench_chaos_command"]

_BY_NAME = {f.name: f for f in FAULTS}


@click.command("chaos")
@click.option(
    "--faults",
    default="all",
    show_default=True,
    help=f"Comma-separated, or 'all': {', '.join(_BY_NAME)}.",
)
@click.option(
    "--workflows",
    default=60,
    show_default=True,
    type=click.IntRange(3, 1000),
    help="Workflows in flight when each fault strikes.",
)
@click.option(
    "--target",
    "targets",
    default="embedded,external",
    show_default=True,
    help="Comma-separated: 'embedded' (the stack's own services, supervised by it) "
    "and/or 'external' (Postgres, Redis and S3 started apart, restarted by this run).",
)
@click.option(
    "--deadline",
    default=180.0,
    show_default=True,
    type=float,
    help="Seconds each case may take to bring every workflow to its end.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def bench_chaos_command(
    faults: str, workflows: int, targets: str, deadline: float, as_json: bool
) -> None:
    """Strike each fault with WORKFLOWS in flight, on a fresh stack each time: how long until a
    new workflow completes (recovery), and whether every workflow ended right (0 stuck, 0 lost,
    0 wrong). Exits 1 if any case missed that."""
    names = list(_BY_NAME) if faults == "all" else [f.strip() for f in faults.split(",") if f]
    if unknown := [n for n in names if n not in _BY_NAME]:
        raise click.BadParameter(f"unknown fault(s) {unknown}; choose from {', '.join(_BY_NAME)}")
    kinds = [t.strip() for t in targets.split(",") if t.strip()]
    if bad := [k for k in kinds if k not in ("embedded", "external")]:
        raise click.BadParameter(f"unknown target(s) {bad}; use embedded and/or external")
    results: list[CaseResult] = []
    for kind in kinds:
        for name in names:
            print(f"chaos: {name} ({kind}) with {workflows} workflows ...", file=sys.stderr,
                  flush=True)  # fmt: skip
            with chaos_stack(external=kind == "external") as target:
                results.append(run_case(target, _BY_NAME[name], workflows=workflows,
                                        deadline_s=deadline))  # fmt: skip
    if as_json:
        click.echo(json.dumps({"results": [r.as_dict() for r in results]}))
    else:
        click.echo(table(results))
    if not all(r.passed for r in results):
        sys.exit(1)


def table(results: list[CaseResult]) -> str:
    header = ("fault", "target", "wf", "done", "failed", "stuck", "lost", "wrong", "leaked",
              "recovery s", "took s", "ok")  # fmt: skip
    lines = [
        "{:32} {:9} {:>4} {:>5} {:>6} {:>5} {:>4} {:>5} {:>6} {:>10} {:>7} {:>3}".format(*header)
    ]
    for r in results:
        recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
        lines.append(
            f"{r.fault:32} {r.target:9} {r.workflows + r.probes:>4} {r.completed:>5} "
            f"{r.failed:>6} {r.stuck:>5} {r.lost:>4} {r.wrong:>5} {r.leaked_objects:>6} "
            f"{recovery:>10} {r.duration_s:>7.1f} {'yes' if r.passed else 'NO':>3}"
        )
    for r in results:
        for reason in r.failures:
            lines.append(f"  {r.fault}: FAILED with: {reason[:160]}")
    return "\n".join(lines)
