"""``cdiflow bench cdi``: the paper's Table I on this machine, TCP vs gRPC vs CDI-SHM."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import click

from cdi.bench.handoff import BACKENDS, DEFAULT_BACKENDS, HandoffConfig, measure
from cdi.bench.stats import Result, format_size, render_table, summarize
from cdi.minion.config import parse_bytes
from cdi.minion.process import MinionChild

__all__ = ["bench_cdi_command", "run_handoff_benchmark"]


def run_handoff_benchmark(
    sizes: list[int],
    backends: list[str],
    *,
    repeat: int,
    read_all: bool,
    spin_us: int,
    busy_poll_us: int,
    gap_us: int,
    minion: str | None = None,
    progress: bool = False,
) -> list[Result]:
    """Measure every backend at every size in one run, against a minion started for it
    (``minion``: ``native`` or ``python``; ``None`` chooses as ``cdiflow cdi minion`` does)."""
    results = []
    impl = ("--impl", minion) if minion else ()
    with tempfile.TemporaryDirectory(prefix="cdi-bench-") as folder:
        socket_path = str(Path(folder) / "minion.sock")
        with MinionChild(socket_path, "--busy-poll-us", str(busy_poll_us), *impl):
            for size in sizes:
                for backend in backends:
                    config = HandoffConfig(
                        size=size,
                        repeat=repeat,
                        read_all=read_all,
                        minion_socket=socket_path,
                        spin_us=spin_us,
                        gap_s=gap_us / 1e6,
                    )
                    if progress:
                        click.echo(f"  {backend:<8} {format_size(size):>7} ...", err=True)
                    results.append(summarize(backend, size, measure(backend, config)))
    return results


@click.command("cdi")
@click.option(
    "--sizes",
    default="10KB,100KB,1MB,10MB",
    show_default=True,
    help="Payload sizes, comma-separated (10KB = 10,000 bytes as in the paper).",
)
@click.option(
    "--repeat",
    default=200,
    show_default=True,
    type=click.IntRange(5, 100_000),
    help="Hand-offs measured per backend and size (after 20 warm-up rounds).",
)
@click.option(
    "--backends",
    default=",".join(DEFAULT_BACKENDS),
    show_default=True,
    help="Also: relay, the floor of any brokered hand-off (two hops through a third process).",
)
@click.option(
    "--read-all", is_flag=True, help="The receiver also reads every byte before the clock stops."
)
@click.option(
    "--spin-us",
    default=2000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long a CDI receiver polls in access() before sleeping.",
)
@click.option(
    "--busy-poll-us",
    default=1000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long the minion polls while a container waits in access().",
)
@click.option(
    "--gap-us",
    default=1000,
    show_default=True,
    type=click.IntRange(0, 10**6),
    help="How long the sender waits between hand-offs. Every hand-off then starts from the same "
    "idle state; a short gap measures back-to-back hand-offs on warm caches instead.",
)
@click.option(
    "--minion",
    type=click.Choice(["native", "python"]),
    default=None,
    help="Which minion serves CDI-SHM (default: as `cdiflow cdi minion`, native when built).",
)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON results on stdout.")
def bench_cdi_command(
    sizes: str,
    repeat: int,
    backends: str,
    read_all: bool,
    spin_us: int,
    busy_poll_us: int,
    gap_us: int,
    minion: str | None,
    as_json: bool,
) -> None:
    """Hand-off latency of a payload between two processes: raw TCP, gRPC and CDI-SHM."""
    size_list = [parse_bytes(s) for s in sizes.split(",") if s.strip()]
    chosen = [b.strip() for b in backends.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BACKENDS]
    if unknown:
        raise click.BadParameter(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    if any(s <= 0 for s in size_list):
        raise click.BadParameter("sizes must be positive")
    results = run_handoff_benchmark(
        size_list,
        chosen,
        repeat=repeat,
        read_all=read_all,
        spin_us=spin_us,
        busy_poll_us=busy_poll_us,
        gap_us=gap_us,
        minion=minion,
        progress=not as_json,
    )
    if as_json:
        json.dump({"results": [r.as_dict() for r in results]}, sys.stdout)
        sys.stdout.write("\n")
        return
    what = "hand-off + reading every byte" if read_all else "hand-off (receiver holds the data)"
    served = f"{minion} minion" if minion else "minion as `cdiflow cdi minion` chooses"
    click.echo(f"\n{what}, {repeat} rounds each, {served}; lower is better\n")
    click.echo(render_table(results, baseline="tcp", subject="cdi-shm"))
