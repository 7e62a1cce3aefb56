"""``cdiflow ar ...`` (run the application, make its sample video) and ``cdiflow bench ar``.

The video and detector libraries are imported inside the commands: the ``cdiflow`` command
must start without the optional ``ar`` dependencies, and says what to install when an AR
command needs them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from apps.ar.config import MAX_DETECTORS, RunConfig
from apps.ar.links import BACKENDS, backend, backends_for
from apps.ar.parts import require_parts
from cdi.hosts import HostNetwork

__all__ = ["ar_group", "bench_ar_command"]


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: write detector counts like 1,2,5") from None
    if not counts or any(not 1 <= c <= MAX_DETECTORS for c in counts):
        raise click.BadParameter(f"detector counts must be 1 to {MAX_DETECTORS}, got {text!r}")
    return counts


def _backends(text: str) -> list[str]:
    chosen = [b.strip() for b in text.split(",") if b.strip()]
    unknown = [b for b in chosen if b not in BACKENDS]
    if unknown or not chosen:
        raise click.BadParameter(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    return chosen


def _options(pairs: tuple[str, ...]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: write --option key=value")
        options[key] = value
    return options


@click.group("ar")
def ar_group() -> None:
    """The Augmented Reality application: frames through N people detectors."""


@ar_group.command("sample")
@click.argument("out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--frames", default=75, show_default=True, type=click.IntRange(1, 100_000))
@click.option("--size", default="1280x720", show_default=True, help="WIDTHxHEIGHT, both even.")
def sample_command(out: Path, frames: int, size: str) -> None:
    """Write the generated sample video (people-like figures walking) to OUT."""
    require_parts()
    from workflows.ar.sample import SampleVideo, make_sample_video

    width, _, height = size.partition("x")
    if not (width.isdigit() and height.isdigit()):
        raise click.BadParameter(f"{size!r}: write e.g. 1280x720", param_hint="--size")
    sample = SampleVideo(width=int(width), height=int(height), frames=frames)
    click.echo(f"wrote {make_sample_video(out, sample)}")


_HOSTS_HELP = (
    "2: extractor and combinator on one host, the detectors on another (network namespaces, "
    "as root; else two loopback addresses)"
)


@contextmanager
def _network(hosts: int, quiet: bool) -> Iterator[HostNetwork | None]:
    """Two hosts for a run across hosts (removed on exit); ``None`` for one."""
    if hosts == 1:
        yield None
        return
    with HostNetwork.create(2) as network:
        if network.kind == "loopback" and not quiet:
            click.echo(
                f"no network namespaces ({network.reason}): two loopback addresses", err=True
            )
        yield network


@ar_group.command("run")
@click.argument("video", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "output", required=True, type=click.Path(dir_okay=False))
@click.option("--backend", "name", default="cdi-shm", show_default=True)
@click.option("--detectors", default=5, show_default=True, type=click.IntRange(1, MAX_DETECTORS))
@click.option("--depth", default=2, show_default=True, type=click.IntRange(1, 8))
@click.option("--frames", default=None, type=click.IntRange(1), help="Stop after this many.")
@click.option("--hosts", default=1, show_default=True, type=click.IntRange(1, 2), help=_HOSTS_HELP)
@click.option("--minion", default=None, help="CDI minion socket (default $CDI_URL, else own).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
def run_command(
    video: str | None,
    output: str,
    name: str,
    detectors: int,
    depth: int,
    frames: int | None,
    hosts: int,
    minion: str | None,
    as_json: bool,
) -> None:
    """Run the extractor, DETECTORS detectors and the combinator on VIDEO (default: the
    generated sample) and write the labelled video to --out, its boxes beside it."""
    _backends(name)
    backend(name, hosts)
    if hosts == 2 and minion:
        raise click.BadParameter(
            "names one host's minion; across hosts each host gets a minion of its own",
            param_hint="--minion",
        )
    require_parts()
    from apps.ar.bench import sample_for_bench
    from apps.ar.launch import run_pipeline
    from apps.ar.runtime import prepare
    from workflows.ar.video import probe

    if video is None:
        video = str(sample_for_bench(Path(".data/ar"), 75))
    info = probe(video)
    config = RunConfig(
        backend=name,
        video=video,
        width=info.width,
        height=info.height,
        detectors=detectors,
        depth=depth,
        frames=frames,
        output=output,
        minion=(minion or os.environ.get("CDI_URL", "")) if hosts == 1 else "",
        run_id=f"ar{os.getpid()}",
    )
    with (
        _network(hosts, as_json) as network,
        prepare(config, network, ("--busy-poll-us", "0")) as ready,
    ):
        result = run_pipeline(ready.config, ready.runtime_pids)
    boxes_path = Path(output).with_suffix(".boxes.json")
    boxes_path.write_text(json.dumps({"frames": result.boxes()}) + "\n")
    report: dict[str, Any] = {
        "backend": name,
        "hosts": hosts,
        "detectors": detectors,
        "frames": result.frames,
        "fps": result.fps,
        "latency_ms_p50": result.latency_ms_p50,
        "cpu_ms_per_frame": result.cpu_ms_per_frame(),
        "peak_rss_mb": result.peak_rss_mb(),
        "output": output,
        "boxes": str(boxes_path),
    }
    if as_json:
        click.echo(json.dumps(report))
        return
    found = sum(len(frame) for frame in result.boxes())
    click.echo(
        f"{result.frames} frames through {detectors} detector(s) over {name}"
        f"{' across two hosts' if hosts == 2 else ''}: "
        f"{result.fps:.1f} fps, latency p50 {result.latency_ms_p50:.0f} ms, "
        f"{found} people boxed\nvideo: {output}\nboxes: {boxes_path}"
    )


@click.command("ar")
@click.option(
    "--backends",
    default=None,
    help=f"Default: {','.join(backends_for(1))}; with --hosts 2: {','.join(backends_for(2))}.",
)
@click.option("--detectors", "counts", default="1,2,3,4,5", show_default=True)
@click.option("--frames", default=150, show_default=True, type=click.IntRange(1, 100_000))
@click.option(
    "--video",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Your own video (default: the generated sample, --frames long).",
)
@click.option("--rounds", default=1, show_default=True, type=click.IntRange(1, 20))
@click.option("--depth", default=2, show_default=True, type=click.IntRange(1, 8))
@click.option("--hosts", default=1, show_default=True, type=click.IntRange(1, 2), help=_HOSTS_HELP)
@click.option("--busy-poll-us", default=0, show_default=True, type=click.IntRange(0, 10**6))
@click.option("--option", "pairs", multiple=True, help="Backend option key=value (cache=0).")
@click.option("--data-dir", default=".data/bench-ar", show_default=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON results on stdout.")
@click.option("--plots", default=None, type=click.Path(file_okay=False), help="PNG folder.")
def bench_ar_command(
    backends: str | None,
    counts: str,
    frames: int,
    video: str | None,
    rounds: int,
    depth: int,
    hosts: int,
    busy_poll_us: int,
    pairs: tuple[str, ...],
    data_dir: str,
    as_json: bool,
    plots: str | None,
) -> None:
    """The AR application over TCP, REST, gRPC and CDI-SHM (--hosts 2: CDI-RPC, across two
    hosts): fps, latency, CPU and memory by role, against the whole application in one process
    (floor) and detection alone in a pool."""
    chosen = _backends(backends) if backends else list(backends_for(hosts))
    detector_counts = _counts(counts)
    for name in chosen:
        backend(name, hosts)  # one that cannot run here says so before the video is made
    require_parts()
    from apps.ar.bench import BenchPlan, run_bench, sample_for_bench
    from apps.ar.report import render_table, write_plots

    folder = Path(data_dir)
    folder.mkdir(parents=True, exist_ok=True)
    plan = BenchPlan(
        video=video or str(sample_for_bench(folder, frames)),
        backends=chosen,
        detectors=detector_counts,
        frames=frames if video else None,
        rounds=rounds,
        depth=depth,
        hosts=hosts,
        busy_poll_us=busy_poll_us,
        options=_options(pairs),
    )
    with _network(hosts, as_json) as network:
        doc = run_bench(plan, network, progress=lambda line: click.echo(f"  {line} ...", err=True))
    if plots:
        for path in write_plots(doc, Path(plots)):
            click.echo(f"plot: {path}", err=True)
    if as_json:
        json.dump(doc, sys.stdout)
        sys.stdout.write("\n")
        return
    click.echo(render_table(doc))
